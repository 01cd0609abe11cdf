"""Finding backends: the built-ins, the entry-point group ``attnfuzz.backends``, and ``module:attr``.

An entry point (or a ``module:attr`` spec) may name a `Backend` subclass (instantiated with no
arguments), a `Backend` instance, or a zero-argument callable returning one backend or a list of
them. Built-ins are registered through the same entry-point group in ``pyproject.toml``; when the
project runs from a source tree without being installed (``PYTHONPATH`` on a GPU host), the
built-in modules are loaded directly so the result is the same.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Iterable

from fuzzer.backends.base import Backend, BackendError, Capabilities, UnknownBackendError
from fuzzer.text import MAX_NAME, did_you_mean, is_storable, storable_text

ENTRY_POINT_GROUP = "attnfuzz.backends"
BUILTIN_MODULES = (
    "fuzzer.backends.sdpa",
    "fuzzer.backends.fa4",
    "fuzzer.backends.te",
    "fuzzer.backends.fa2",
)
#: Built-in modules whose backends are found by name (`select`, ``attnfuzz fuzz --backend NAME``)
#: but are not part of `discover`'s default set ("every backend that runs here"): backends that
#: exist to exercise attnfuzz itself, e.g. the CPU context-parallel backend and its planted bugs
#: (``cp-cpu-ring``, ``cp-cpu-planted-window``, ``cp-cpu-planted-merge``).
OPT_IN_MODULES = ("fuzzer.backends.cp_cpu",)
# Backends fuzzed by default on a machine without a GPU.
DEFAULT_CPU_BACKENDS = ("torch-cpu-math", "torch-cpu-flash")


def _as_backends(obj: object, origin: str) -> list[Backend]:
    """The backends ``obj`` (a `Backend` subclass, instance, factory, or a list of them) stands for.

    Raises:
        BackendError: naming ``origin``: a class or factory that cannot be called without
            arguments (an abstract `Backend` included) or raises, or something that is no `Backend`.
    """
    if (isinstance(obj, type) and issubclass(obj, Backend)) or (callable(obj) and not isinstance(obj, Backend)):
        try:
            obj = obj()
        except Exception as exc:  # a plugin's constructor: its error, said as the spec's
            raise BackendError(f"{origin}: calling {getattr(obj, '__name__', obj)!r} failed: {type(exc).__name__}: {exc}") from exc
    items = list(obj) if isinstance(obj, (list, tuple)) else [obj]
    for item in items:
        if not isinstance(item, Backend):
            raise BackendError(f"{origin}: expected a Backend, got {type(item).__name__}")
        if not item.name:
            raise BackendError(f"{origin}: backend {type(item).__name__} has no name")
        if not isinstance(item.name, str) or not is_storable(item.name, MAX_NAME):
            # a plugin's name goes into every result and bucket: cut and escape it here, once,
            # so the worker, its children and the store all use the same storable name
            item.name = storable_text(item.name, MAX_NAME)
        problem = declaration_problem(item)
        if problem is not None:
            raise BackendError(f"{origin}: backend {item.name!r} ({type(item).__name__}): {problem}")
    return items


def declaration_problem(backend: Backend) -> str | None:
    """What is wrong with ``backend``'s declarations (the class attributes the worker reads as
    data, `fuzzer.backends.base.Backend`), one line, or None: ``variants`` a non-empty tuple of
    distinct names, ``device`` ``"cpu"`` or ``"cuda"``, ``environment`` a name, ``env_vars`` str
    to str, ``packages`` names, ``capabilities`` a `Capabilities` of known dtypes, layouts and
    alignments with positive sizes, ``masked_row_lse`` None or a number, ``jit_compiled`` a bool.
    A plugin that declared ``variants = "default"`` (a str: seven one-letter variants) or
    ``capabilities = dict(...)`` ran into errors deep in the worker."""
    from oracle.config import CAUSAL_ALIGNMENTS, DTYPES, QKV_FORMATS

    def names(value: object) -> bool:
        return isinstance(value, (tuple, list)) and all(isinstance(v, str) and v for v in value)

    variants = backend.variants
    if not names(variants) or not variants or len(set(variants)) != len(variants):
        return f"variants: expected a non-empty tuple of distinct non-empty str, got {variants!r:.80}"
    if backend.device not in ("cpu", "cuda"):
        return f"device: expected 'cpu' or 'cuda', got {backend.device!r:.80}"
    if not isinstance(backend.environment, str) or not backend.environment:
        return f"environment: expected a non-empty str, got {backend.environment!r:.80}"
    env_vars = backend.env_vars
    if not isinstance(env_vars, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()):
        return f"env_vars: expected a dict of str to str, got {env_vars!r:.80}"
    if not names(backend.packages):
        return f"packages: expected a tuple of str, got {backend.packages!r:.80}"
    masked = backend.masked_row_lse
    if masked is not None and (isinstance(masked, bool) or not isinstance(masked, (int, float))):
        return f"masked_row_lse: expected None or a number, got {masked!r:.80}"
    if not isinstance(backend.jit_compiled, bool):
        return f"jit_compiled: expected a bool, got {backend.jit_compiled!r:.80}"
    caps = backend.capabilities
    if not isinstance(caps, Capabilities):
        return f"capabilities: expected a fuzzer.backends.base.Capabilities, got {type(caps).__name__}"
    for field, allowed in (("dtypes", DTYPES), ("qkv_formats", QKV_FORMATS), ("causal_alignments", CAUSAL_ALIGNMENTS)):
        value = getattr(caps, field)
        if not names(value) or any(v not in allowed for v in value):
            return f"capabilities.{field}: expected a tuple of {', '.join(allowed)}, got {value!r:.80}"
    for field in ("max_head_dim", "head_dim_multiple", "max_seqlen"):
        value = getattr(caps, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"capabilities.{field}: expected a positive int, got {value!r:.80}"
    for field in ("head_dim_v_differs", "gqa", "windows", "softcap", "backward", "lse", "cp"):
        if not isinstance(getattr(caps, field), bool):
            return f"capabilities.{field}: expected a bool, got {getattr(caps, field)!r:.80}"
    return None


def load_spec(spec: str) -> list[Backend]:
    """Load backends from ``"package.module:attr"``.

    Raises:
        BackendError: the spec is malformed, the module cannot be imported, the attribute is
            missing, or it does not yield `Backend` objects.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise BackendError(f"backend spec {spec!r}: expected 'module:attr'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendError(f"backend spec {spec!r}: cannot import {module_name}: {exc}") from exc
    except Exception as exc:  # the plugin module itself fails (a SyntaxError, its own error at import): one line
        raise BackendError(f"backend spec {spec!r}: importing {module_name} failed: {type(exc).__name__}: {exc}") from exc
    try:
        obj = getattr(module, attr)
    except AttributeError as exc:
        raise BackendError(f"backend spec {spec!r}: {module_name} has no attribute {attr!r}") from exc
    return _as_backends(obj, spec)


def discover(extra_specs: Iterable[str] = (), *, opt_in: bool = False) -> dict[str, tuple[Backend, str]]:
    """All known backends by name, each with the spec that loads it again (for child processes).

    Order: entry points, then built-in modules not already seen, then (with ``opt_in``) the
    backends of `OPT_IN_MODULES`, then ``extra_specs`` (which override same-named backends). A
    built-in module that fails to import is skipped (its backends then report nothing); a broken
    third-party entry point raises.

    Raises:
        BackendError: an entry point or extra spec cannot be loaded, or two entry points
            define the same name.
    """
    found: dict[str, tuple[Backend, str]] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        spec = ep.value
        try:
            backends = _as_backends(ep.load(), f"entry point {ep.name}={spec}")
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(f"entry point {ep.name}={spec}: {type(exc).__name__}: {exc}") from exc
        for backend in backends:
            if backend.name in found and found[backend.name][1] != spec:
                raise BackendError(f"backend name {backend.name!r} defined by {found[backend.name][1]} and {spec}")
            found[backend.name] = (backend, spec)
    for module_name in BUILTIN_MODULES + (OPT_IN_MODULES if opt_in else ()):
        spec = f"{module_name}:builtin_backends"
        try:
            backends = load_spec(spec)
        except BackendError:
            continue
        for backend in backends:
            found.setdefault(backend.name, (backend, spec))
    for spec in extra_specs:
        for backend in load_spec(spec):
            found[backend.name] = (backend, spec)
    return found


def select(names: Iterable[str], extra_specs: Iterable[str] = ()) -> list[tuple[Backend, str]]:
    """The backends called ``names`` (all of ``extra_specs``' backends are always included).

    Names may also be those of `OPT_IN_MODULES`' backends, which `discover` leaves out by default.

    Raises:
        UnknownBackendError: a name is unknown; the message lists the known names (the opt-in
            ones apart).
        BackendError: an entry point or spec cannot be loaded.
    """
    known = discover(extra_specs, opt_in=True)
    wanted = list(dict.fromkeys(names))
    for spec in extra_specs:
        for backend in load_spec(spec):
            if backend.name not in wanted:
                wanted.append(backend.name)
    missing = [n for n in wanted if n not in known]
    if missing:
        opt_in = sorted(n for n, (_, spec) in known.items() if spec.partition(":")[0] in OPT_IN_MODULES)
        regular = sorted(n for n in known if n not in opt_in)
        raise UnknownBackendError(
            f"backend: unknown name {missing[0]!r}{did_you_mean(missing[0], known)}"
            + f" (allowed: {', '.join(regular)}"
            + (f"; opt-in backends that exercise attnfuzz itself: {', '.join(opt_in)}" if opt_in else "")
            + ")"
        )
    return [known[n] for n in wanted]
