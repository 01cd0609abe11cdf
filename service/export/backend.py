"""The adapter that writes a repro's backend call: found like every backend (built-ins, the
``attnfuzz.backends`` entry points, or ``module:attr``; `resolve_backend`), asked through its own
`fuzzer.backends.base.Backend.repro` (`repro_call`). Every failure is an `ExportError` naming
``backend`` or ``variant``.
"""

from __future__ import annotations

import functools

from fuzzer.backends.base import Backend, ReproCall
from fuzzer.text import did_you_mean
from oracle.config import AttentionCase
from service.export.safety import ExportError


def _discovered(extra_specs: tuple[str, ...] = ()) -> dict[str, Backend]:
    from fuzzer.backends.base import BackendError
    from fuzzer.registry import discover

    try:
        return {name: backend for name, (backend, _) in discover(extra_specs, opt_in=True).items()}
    except BackendError as exc:
        raise ExportError("backend", str(exc)) from None


def resolve_backend(name: str, spec: str | None = None) -> Backend:
    """The backend object that writes the repro call of ``name``.

    Args:
        name: the stored backend name (``"fa4"``, a plugin's name).
        spec: ``"module:attr"`` naming the plugin (``attnfuzz export --backend module:attr``);
            default: the built-ins and the ``attnfuzz.backends`` entry points (`fuzzer.registry`).

    Raises:
        ExportError: ``backend``: the spec cannot be loaded, or no known backend is called ``name``
            (the message lists the known ones and says how to make a plugin known).
    """
    from fuzzer.backends.base import BackendError
    from fuzzer.registry import load_spec

    if spec is not None:
        try:
            loaded = load_spec(spec)
        except BackendError as exc:
            raise ExportError("backend", str(exc)) from None
        for backend in loaded:
            if backend.name == name:
                return backend
        names = ", ".join(b.name for b in loaded)
        raise ExportError("backend", f"{spec} defines {names}, not the backend {name!r} the result was recorded for")
    known = _discovered()
    if name not in known:
        raise ExportError(
            "backend",
            f"no export for backend {name!r}{did_you_mean(name, known)}: no installed backend has that name "
            f"(known: {', '.join(sorted(known))}); "
            "install its package (entry-point group attnfuzz.backends) or name it with --backend module:attr",
        )
    return known[name]


def has_repro(backend: Backend) -> bool:
    """The backend's class overrides `Backend.repro`."""
    return getattr(type(backend), "repro", None) is not Backend.repro


@functools.lru_cache(maxsize=1)
def _known() -> tuple[tuple[str, bool], ...]:
    """``(name, declares a repro call)`` of each backend found without a spec (built-ins, opt-in
    built-ins and the ``attnfuzz.backends`` entry points), sorted by name; read once per process.
    () when the discovery fails (a broken entry point)."""
    try:
        return tuple(sorted((name, has_repro(backend)) for name, backend in _discovered().items()))
    except ExportError:
        return ()


def exportable_backends() -> tuple[str, ...]:
    """Names of the known backends (built-ins and entry points) that declare a repro call, sorted;
    read once per process (pages use it to offer the download)."""
    return tuple(name for name, repro in _known() if repro)


def importable_backends() -> tuple[str, ...]:
    """Names of every backend this process finds by name alone (built-ins and entry points), sorted;
    read once per process. A stored backend outside them is a plugin that ``fuzz`` loaded as
    ``--backend module:attr``: the database keeps its name, not that spec, so this process cannot
    import it (pages then say how to export it from the command line: `plugin_export_command`)."""
    return tuple(name for name, _ in _known())


PLUGIN_SPEC = "MODULE:ATTR"
"""What an export command shows where a plugin's ``module:attr`` goes: the database never stores it."""


def plugin_export_command(case_id: str, variant: str, *, tail: str = "--db DATABASE_URL") -> str:
    """``attnfuzz export CASE --backend MODULE:ATTR --variant V --db DATABASE_URL``: the command
    that exports a plugin backend's result on ``case_id`` (16 hex digits) and ``variant`` (a stored
    name, shell-quoted here), with `PLUGIN_SPEC` where the plugin's ``module:attr`` goes (the
    reader knows it, the database does not) and ``tail`` after it (other options)."""
    import shlex

    return f"attnfuzz export {case_id} --backend {PLUGIN_SPEC} --variant {shlex.quote(variant)}" + (f" {tail}" if tail else "")


def repro_call(backend: Backend, case: AttentionCase, variant: str) -> ReproCall:
    """``backend.repro(case, variant)``, its errors as `ExportError`.

    Raises:
        ExportError: ``backend``: the backend declares no repro (the message says what to add) or
            its ``repro`` failed or returned something else than a `ReproCall`; ``variant``: the
            variant is not one of the backend's ``variants`` (with the closest name) or cannot
            encode the case (a ``ValueError`` of the adapter).
    """
    from fuzzer.backends.base import ReproUnavailable

    known = tuple(getattr(backend, "variants", ()) or ())
    if known and variant not in known:  # a mistyped name: the closest one, before the adapter's own words
        raise ExportError(
            "variant", f"unknown for {backend.name}: {variant!r}{did_you_mean(variant, known)} (allowed: {', '.join(known)})"
        )
    try:
        call = backend.repro(case, variant)
    except ReproUnavailable as exc:
        raise ExportError("backend", str(exc)) from None
    except ValueError as exc:
        raise ExportError("variant", str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a plugin's bug must not crash the service
        raise ExportError("backend", f"{backend.name}.repro raised {type(exc).__name__}: {exc}") from None
    if not isinstance(call, ReproCall):
        raise ExportError("backend", f"{backend.name}.repro returned {type(call).__name__}, not a ReproCall")
    if call.device not in ("cpu", "cuda"):
        raise ExportError("backend", f"{backend.name}.repro: device {call.device!r} (allowed: cpu, cuda)")
    return call
