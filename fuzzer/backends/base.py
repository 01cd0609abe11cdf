"""The backend plugin interface.

A backend adapts one attention implementation to attnfuzz. It declares, as data, what it can run
(`Capabilities`, used to steer generation) and, per case and API variant, why it cannot
(`unsupported_reasons`). ``run`` calls the library exactly the way a real caller would for the
chosen *variant* (an equivalent encoding of the same mask: a causal flag, a window with a ``-1``
or ``None`` sentinel, a boolean mask tensor ...) and returns the library's own outputs.

Plugins are found through the entry-point group ``attnfuzz.backends`` (an entry point may name a
`Backend` subclass, an instance, or a zero-argument factory) or given as ``module:attr`` on the
command line; the built-ins use the same interface (see `fuzzer/registry.py`).

Canonical tensors (what ``run`` receives and must return), per `oracle.config`:

* bshd/sbhd cases: q ``[batch_size, seqlen_q, num_heads, head_dim]``, k ``[batch_size, seqlen_k,
  num_heads_kv, head_dim]``, v ``[batch_size, seqlen_k, num_heads_kv, head_dim_v]``, all in the
  case's dtype; out like q with ``head_dim_v``; lse ``[batch_size, num_heads, seqlen_q]`` float32
  or float64, natural log.
* thd cases: q ``[total_q, num_heads, head_dim]`` ... with ``cu_seqlens_q/k`` int32
  ``[batch_size + 1]``; lse ``[num_heads, total_q]``.

An adapter transposes to and from its library's layout (``sbhd`` included) itself.

CP backend contract (`is_cp_backend`): a backend with ``capabilities.cp`` implements
``run_cp(case, inputs: CPShardInputs, groups: CPProcessGroups, variant) -> BackendOutput`` and is
called on every rank with that rank's shard (the dual-chunk-swap layout of
`fuzzer.backends.cp_layout`) and the process group(s); it returns its *local* out/lse/dq/dk/dv
(canonical layout, local length); `fuzzer.cp.executor.CPExecutor` gathers them
(`fuzzer.cp.sharding.gather_outputs`). ``cp_group`` etc. are created by the executor, never by the
backend.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import importlib.metadata
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from oracle import mask_kinds
from oracle.config import AttentionCase
from oracle.design import Design
from oracle.errors import AttnFuzzError

if TYPE_CHECKING:
    import torch

    from fuzzer.backends.cp_layout import CPSeqlens


#: Runtime report keys written into `Backend.version_string` (and so into each result).
#: ``flash_attn_4_module`` is the imported ``flash_attn/cute`` directory: with it a result names
#: the FA4 build that ran by place as well as by version (a bisection cannot test another silently).
RUNTIME_VERSION_KEYS = ("cudnn", "cublaslt", "nccl", "flash_attn_4", "flash_attn_4_module", "flash_attn")


class BackendError(AttnFuzzError):
    """A backend could not be loaded or is malformed (bad entry point, missing attribute)."""

    exit_code = 3


class UnknownBackendError(BackendError):
    """A backend name that no built-in module, entry point or plugin spec defines (a usage error:
    the message lists the names that exist)."""

    exit_code = 2


@dataclass(frozen=True)
class Capabilities:
    """What a backend can run, as data. Generation draws from the union over selected backends;
    `Backend.unsupported_reasons` is the precise per-case check.

    Attributes:
        dtypes: dtype names, e.g. ``("bfloat16", "float16")``.
        qkv_formats: subset of ``("bshd", "sbhd", "thd")``.
        max_head_dim: largest head_dim (and head_dim_v) accepted.
        head_dim_multiple: head_dim must be a multiple of this (1 = any).
        head_dim_v_differs: head_dim_v may differ from head_dim.
        gqa: num_heads_kv < num_heads is supported.
        causal_alignments: alignments supported for causal masks.
        windows: sliding windows are supported (mask kind ``window``).
        softcap: softcap is supported (mask kind ``softcap``). Each mask kind of
            `oracle.mask_kinds.MASK_KINDS` names its bool field here (``capability``).
        backward: gradients are supported.
        lse: the backend returns the logsumexp.
        max_seqlen: a soft cap for generation (tokens per sequence), not a kernel limit.
        cp: context parallelism is supported (cp_size > 1).
    """

    dtypes: tuple[str, ...] = ("bfloat16", "float16")
    qkv_formats: tuple[str, ...] = ("bshd",)
    max_head_dim: int = 256
    head_dim_multiple: int = 1
    head_dim_v_differs: bool = False
    gqa: bool = True
    causal_alignments: tuple[str, ...] = ("top_left", "bottom_right")
    windows: bool = False
    softcap: bool = False
    backward: bool = True
    lse: bool = False
    max_seqlen: int = 4096
    cp: bool = False


@dataclass
class BackendOutput:
    """What a backend returns for one call, in the canonical layout (see module docstring).

    Attributes:
        out: ``[batch_size, seqlen_q, num_heads, head_dim_v]`` (or ``[total_q, ...]``), case dtype.
        lse: ``[batch_size, num_heads, seqlen_q]`` (or ``[num_heads, total_q]``), natural log; None
            when the API gives none.
        dq, dk, dv: gradients shaped like q, k, v; None for forward-only runs.
        selected_kernel: what the library actually ran, when it chooses (TE's sub-backend).
        compile_ms: JIT compilation time measured by the adapter, milliseconds (0 if none).
        extra: anything else worth recording (strings and numbers only).
    """

    out: Any
    lse: Any = None
    dq: Any = None
    dk: Any = None
    dv: Any = None
    selected_kernel: str | None = None
    compile_ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class ReproUnavailable(BackendError):
    """The backend declares no repro call (`Backend.repro`), or cannot write one for a variant."""


@dataclass(frozen=True)
class ReproCall:
    """How an exported repro (``attnfuzz export``, ``service/export/repro.py``) calls a backend.

    The repro is a standalone pytest file (torch and pytest only, never attnfuzz); ``source`` is
    pasted into it and must define

    * ``check_environment()``: ``pytest.skip(reason)`` when the library, CUDA or the GPU
      architecture is missing; may set environment variables the library reads;
    * ``call_backend(q, k, v, cu_seqlens_q, cu_seqlens_k) -> (out, lse)``: q, k, v are leaf
      tensors in the canonical layout (module docstring) on ``DEVICE`` in the case dtype (with
      ``requires_grad`` for backward cases; the file backpropagates through ``out`` itself);
      ``cu_seqlens_q/k`` int32 ``[batch_size + 1]`` for thd, else None. Return ``out`` in the
      canonical layout and ``lse`` as ``[batch_size, num_heads, seqlen_q]`` (thd ``[num_heads,
      total_q]``), natural log, or None.

    Every value that depends on the case or variant must be a ``$name`` slot of ``source`` with its
    value in ``values`` (plain data: None, bool, int, finite float, short strings of
    ``[A-Za-z0-9_.:+-]``, tuples/lists/dicts of those); the export proves that nothing but those
    literals differs from ``source`` (a hostile stored value never becomes code). The file's
    constants (``QKV_FORMAT``, ``BATCH_SIZE``, ``SEQLEN_Q``, ``SEQLEN_K``, ``SEQLENS_Q``,
    ``NUM_HEADS``, ``NUM_HEADS_KV``, ``HEAD_DIM``, ``HEAD_DIM_V``, ``CAUSAL``,
    ``CAUSAL_ALIGNMENT``, ``WINDOW_SIZE_LEFT/RIGHT``, ``SOFTMAX_SCALE``, ``SOFTCAP``, ``VARIANT``)
    , ``CASE`` (the case's fields under `oracle.config.AttentionCase`'s names: ``qkv_format``,
    ``batch_size``, ``num_heads``, ``seqlen_q``, ``is_varlen``, ``total_q``, ``seqlens_q_list``
    ..., so an adapter can paste its own layout helpers with ``inspect.getsource``, as FA4 does),
    the helpers ``require_cuda(arch_majors, what, min_major=None)`` and ``visible_mask(seqlen_q,
    seqlen_k)``, and the modules ``math``, ``os``, ``torch``, ``pytest`` may be used.

    Attributes:
        source: the code, every case-dependent value a ``$slot``.
        values: slot name -> plain value.
        device: ``"cuda"`` or ``"cpu"``: where the file builds the inputs.
        packages: what to install besides torch and pytest (named in the file's docstring).
        masked_row_lse: as `Backend.masked_row_lse` (accepted on rows that see no key).
    """

    source: str
    values: dict[str, Any] = field(default_factory=dict)
    device: str = "cuda"
    packages: tuple[str, ...] = ()
    masked_row_lse: float | None = None


class Backend(abc.ABC):
    """One attention implementation under test.

    Subclasses set the class attributes and implement ``run``; they override
    ``unsupported_reasons`` to add library-specific limits (calling ``super()`` first), and
    ``availability`` when the library may be missing. The library must be imported lazily
    (inside methods), never at module import time, so that ``attnfuzz backends`` works anywhere.

    Class attributes:
        name: the backend key (``"fa4"``, ``"te-fused"``, ``"torch-sdpa-math"``).
        variants: names of the API encodings ``run`` accepts; the first is the library's own.
        device: ``"cpu"`` or ``"cuda"``.
        environment: backends with the same key share one child process; backends needing
            different process-wide settings (``env_vars``) must use different keys.
        env_vars: environment variables set in the child before the library is imported.
        packages: distribution names whose versions identify the build of this backend.
        masked_row_lse: the value the library documents (or is known) to return as lse for a
            row with no visible key, when it is not attnfuzz's ``-inf`` (e.g. ``0.0`` for
            PyTorch's CPU flash op). The comparison accepts exactly that value on exactly those
            rows; None = ``-inf`` only.
        jit_compiled: the library compiles a kernel per configuration on first use (FA4's CuTe
            DSL): minimisation then keeps head dims fixed, and generation prefers head dims it
            has already run.
        design: which intermediates the library's design holds in the case's dtype, with the
            source of each claim (`oracle.design.Design`). A failure that a correct float32
            emulation of that design shares is reported as the design's limit
            (``<tensor>:limit``), not as ``wrong`` (`oracle.design.explain_failure`). None: the
            backend declared nothing and is emulated as `oracle.design.UNDECLARED`. The built-in
            backends' designs and their sources: ``docs/design-limits.md``.
    """

    name: ClassVar[str] = ""
    variants: ClassVar[tuple[str, ...]] = ("default",)
    device: ClassVar[str] = "cpu"
    environment: ClassVar[str] = "default"
    env_vars: ClassVar[dict[str, str]] = {}
    packages: ClassVar[tuple[str, ...]] = ("torch",)
    capabilities: ClassVar[Capabilities] = Capabilities()
    masked_row_lse: ClassVar[float | None] = None
    jit_compiled: ClassVar[bool] = False
    design: ClassVar[Design | None] = None

    # ------------------------------------------------------------------ discovery-time checks
    def availability(self) -> str | None:
        """None when the backend can run on this machine, else the reason it cannot."""
        if self.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                return "no CUDA device (torch.cuda.is_available() is False)"
        return None

    def quick_availability(self) -> str | None:
        """The part of `availability` that imports no backend library (packages installed, a
        CUDA device, its architecture): what the worker process may ask itself, since importing
        e.g. TransformerEngine there could load a second cuDNN (`fuzzer.environment`). The full
        answer comes from the backend's child. Default: `availability` for CPU backends, the CUDA
        device check for CUDA ones."""
        if self.device != "cuda":
            return self.availability()
        return Backend.availability(self)

    def versions(self) -> dict[str, str]:
        """Installed versions of ``packages`` (``"missing"`` when absent)."""
        found = {}
        for package in self.packages:
            try:
                found[package] = importlib.metadata.version(package)
            except importlib.metadata.PackageNotFoundError:
                found[package] = "missing"
        return found

    def version_string(self) -> str:
        """``"pkg==ver pkg2==ver2"`` from ``versions()``, read once per backend object (reading
        package metadata costs milliseconds and the worker asks for every result), followed by
        the runtime versions its child reported (`set_runtime`) as ``runtime:cudnn==9.19.0``:
        every result is attributed to the libraries that ran it."""
        cached = self.__dict__.get("_version_string")
        if cached is None:
            parts = [f"{k}=={v}" for k, v in sorted(self.versions().items())]
            runtime = self.__dict__.get("_runtime") or {}
            parts += [f"runtime:{k}=={runtime[k]}" for k in RUNTIME_VERSION_KEYS if runtime.get(k)]
            cached = " ".join(parts)
            self.__dict__["_version_string"] = cached
        return cached

    def runtime_versions(self) -> dict[str, str]:
        """Versions of the runtime libraries this backend's library reports it loaded, asked in
        the backend's own process after ``availability`` (e.g. TE's ``get_cudnn_version`` for the
        TE adapters, torch's for cuDNN SDPA, the imported flash-attn-4 build for FA4). Keys as in
        `fuzzer.environment.runtime_report` (``cudnn``, ``flash_attn_4``, ...); strings only. The
        default reports nothing; it must never raise."""
        return {}

    def set_runtime(self, runtime: dict[str, str]) -> None:
        """Record what this backend's child reported it loaded (the executor calls this); later
        `version_string` calls include it."""
        self.__dict__["_runtime"] = dict(runtime)
        self.__dict__.pop("_version_string", None)

    @property
    def runtime(self) -> dict[str, str]:
        """The runtime its child reported (`set_runtime`), empty before."""
        return dict(self.__dict__.get("_runtime") or {})

    # ------------------------------------------------------------------ per-case checks
    def unsupported_reasons(self, case: AttentionCase, variant: str) -> list[str]:
        """Every reason this backend cannot run ``case`` with ``variant`` (empty = supported).

        The base implementation checks ``capabilities``; adapters extend it.
        """
        caps = self.capabilities
        reasons = []
        if variant not in self.variants:
            reasons.append(f"variant {variant!r} not in {self.variants}")
        if case.dtype not in caps.dtypes:
            reasons.append(f"dtype {case.dtype} not in {caps.dtypes}")
        if case.qkv_format not in caps.qkv_formats:
            reasons.append(f"qkv_format {case.qkv_format} not in {caps.qkv_formats}")
        for dim_name in ("head_dim", "head_dim_v"):
            dim = getattr(case, dim_name)
            if dim > caps.max_head_dim:
                reasons.append(f"{dim_name} {dim} > {caps.max_head_dim}")
            if dim % caps.head_dim_multiple:
                reasons.append(f"{dim_name} {dim} not a multiple of {caps.head_dim_multiple}")
        if case.head_dim_v != case.head_dim and not caps.head_dim_v_differs:
            reasons.append("head_dim_v != head_dim")
        if case.num_heads_kv != case.num_heads and not caps.gqa:
            reasons.append("num_heads_kv != num_heads (GQA/MQA)")
        if case.causal and case.causal_alignment not in caps.causal_alignments and not alignment_irrelevant(case):
            reasons.append(f"causal_alignment {case.causal_alignment} not in {caps.causal_alignments}")
        for kind in mask_kinds.MASK_KINDS:  # one declaration per mask kind: its capability and words
            if kind.is_on(case) and not kind.granted(caps) and kind.reason not in reasons:
                reasons.append(kind.reason)
        if case.backward and not caps.backward:
            reasons.append("backward")
        if case.cp_size > 1 and not caps.cp:
            reasons.append("context parallelism (cp_size > 1)")
        return reasons

    def inapplicable_reasons(self, case: AttentionCase, variant: str) -> list[str]:
        """Why ``variant`` is no distinct call of this library for ``case`` (empty = it is one):
        it cannot encode the case's mask (a causal-only encoding for a non-causal case, a mask
        tensor for a case without a mask) or it sends exactly the call another variant sends.
        These reasons are also among `unsupported_reasons`.

        The worker does not run such a variant and records no result for it, as long as some
        other variant of the backend is applicable to the case (`applicable_variants`): the
        case is then covered by that variant's call, and an ``unsupported`` result would only
        say that two names mean one call. The default: every variant applies.
        """
        return []

    def applicable_variants(self, case: AttentionCase) -> tuple[str, ...]:
        """The variants with no `inapplicable_reasons` for ``case``, in order; all of them when
        none applies (the backend cannot encode the case at all: each variant then gets its
        ``unsupported`` result).

        Raises:
            BackendError: ``inapplicable_reasons`` raised or returned something other than a list
                (or tuple) of str, naming the variant: the worker records it as the backend's
                ``error:PluginError`` (`fuzzer.guard`) instead of dropping or running the variant
                on a check that did not answer.
        """
        applicable = []
        for variant in self.variants:
            try:
                reasons = self.inapplicable_reasons(case, variant)
            except Exception as exc:
                raise BackendError(f"inapplicable_reasons(case, {variant!r}) raised {type(exc).__name__}: {exc}") from exc
            if not isinstance(reasons, (list, tuple)) or not all(isinstance(r, str) for r in reasons):
                raise BackendError(f"inapplicable_reasons(case, {variant!r}) returned {reasons!r:.80}, expected a list of str")
            if not reasons:
                applicable.append(variant)
        return tuple(applicable) or tuple(self.variants)

    def returns_lse(self, variant: str) -> bool:
        """Whether ``variant``'s call returns the logsumexp: an output without one is then invalid
        (`fuzzer.evaluate.output_problems`). Default: ``capabilities.lse``; an adapter whose
        variants differ (SDPA: only its private op gives one) says so per variant."""
        return bool(self.capabilities.lse)

    def supports(self, case: AttentionCase, variant: str | None = None) -> str | None:
        """None when ``case`` runs with ``variant`` (default: the first), else the reasons joined."""
        reasons = self.unsupported_reasons(case, variant or self.variants[0])
        return "; ".join(reasons) if reasons else None

    def kernel_key(self, case: AttentionCase, variant: str) -> tuple:
        """What selects a compiled kernel (for JIT backends): cases with equal keys reuse one.

        The default covers dtype, head dims, GQA, every mask kind's switches
        (`oracle.mask_kinds.switches`) and layout.
        """
        return (
            variant,
            case.dtype,
            case.head_dim,
            case.head_dim_v,
            case.num_heads != case.num_heads_kv,
            *mask_kinds.switches(case),  # causal, window left set, window right set, softcap set, ...
            case.qkv_format,
            case.backward,
        )

    # ------------------------------------------------------------------ execution
    @abc.abstractmethod
    def run(self, case: AttentionCase, inputs: Any, variant: str) -> BackendOutput:
        """Run the case and return the library's outputs in the canonical layout.

        Args:
            case: the case (already checked with ``unsupported_reasons``).
            inputs: `oracle.inputs.AttentionInputs` on ``self.device``: q, k, v, dout and, for
                thd, cu_seqlens_q/k. Do not modify them in place.
            variant: one of ``variants``.

        Returns:
            `BackendOutput`; gradients only when ``case.backward``.

        Raises:
            UnsupportedCaseError: the library refused the case in a way the adapter recognises
                as a declared limitation (recorded as ``unsupported``, not a failure).
            Any other exception is recorded as status ``error``.
        """

    def repro(self, case: AttentionCase, variant: str) -> ReproCall:
        """The library call of ``variant`` for an exported repro (see `ReproCall`), next to `run`:
        the same call, as source text a kernel maintainer can read.

        Raises:
            ReproUnavailable: the backend defines none (this default), or the variant cannot be
                written for ``case``; the message says what is missing.
        """
        raise ReproUnavailable(
            f"backend {self.name!r} ({type(self).__module__}.{type(self).__qualname__}) defines no repro call: "
            "add a method `repro(self, case, variant)` returning fuzzer.backends.base.ReproCall "
            "(see the README, section Plugins)"
        )


class DeclarationGapError(AttnFuzzError):
    """Raised by ``Backend.run`` when the library refuses a case the adapter declared runnable
    (``unsupported_reasons`` was empty), e.g. TransformerEngine finding no allowed sub-backend. It
    is a finding, not an ``unsupported`` result: the executor records status ``error`` with the
    signature ``error:declaration_gap`` (a bucket) so that a wrong declaration cannot hide cases."""


class UnsupportedCaseError(AttnFuzzError):
    """Raised by ``Backend.run`` when the library itself shows the case is unsupported (e.g. TE
    selected a different sub-backend than the one this adapter stands for)."""


def run_with_grad(fn, case: AttentionCase, inputs: Any) -> tuple[Any, Any, Any, Any, Any]:
    """Call ``fn(q, k, v) -> (out, lse_or_None)`` and, if ``case.backward``, backpropagate dout.

    Args:
        fn: callable taking leaf tensors q, k, v (canonical layout) and returning ``(out, lse)``.
        case: the case (for ``backward``).
        inputs: `oracle.inputs.AttentionInputs`.

    Returns:
        ``(out, lse, dq, dk, dv)``; gradients are None when ``case.backward`` is False.
    """
    import torch

    if not case.backward:
        with torch.no_grad():
            out, lse = fn(inputs.q, inputs.k, inputs.v)
        return out, lse, None, None, None
    q = inputs.q.detach().clone().requires_grad_(True)
    k = inputs.k.detach().clone().requires_grad_(True)
    v = inputs.v.detach().clone().requires_grad_(True)
    out, lse = fn(q, k, v)
    out.backward(inputs.dout)
    return out.detach(), None if lse is None else lse.detach(), q.grad, k.grad, v.grad


@contextlib.contextmanager
def environment_set(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in this process's ``os.environ`` inside the block, then each variable back to
    what it was (removed again when it was unset), also when the block raises. Used for a
    backend's ``env_vars`` around a library call (`fuzzer.backends.te`) and for the environment a
    child process inherits at exec (`fuzzer.executor`: the only moment ``LD_LIBRARY_PATH`` counts).
    Not thread-safe: ``os.environ`` is process-wide."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def alignment_irrelevant(case: AttentionCase) -> bool:
    """Whether top-left and bottom-right alignment give the same mask for ``case``: every
    sequence has as many keys as queries, so the offset ``seqlen_k - seqlen_q`` is 0
    (`oracle.masks`). A backend that implements one alignment then runs the other too."""
    if case.is_varlen:
        return tuple(case.seqlens_q) == tuple(case.seqlens_k)
    return case.seqlen_q == case.seqlen_k


# ------------------------------------------------------------------ CP backend contract
@dataclass
class CPShardInputs:
    """One rank's inputs under CP: its shards of q, k, v, dout and the global varlen metadata.

    Attributes:
        q: ``[batch_size, local_len_q, num_heads, head_dim]`` (thd ``[local_len_q, num_heads,
            head_dim]``), case dtype; padding tokens are 0.
        k: ``[batch_size, local_len_k, num_heads_kv, head_dim]`` (thd ``[local_len_k, ...]``).
        v: like k with ``head_dim_v``.
        dout: like q with ``head_dim_v``.
        rank: this rank, ``0 <= rank < cp_size``.
        cp_size: number of ranks.
        seqlens: the global `CPSeqlens` (TE passes the global ``cu_seqlens`` on every rank).
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    rank: int
    cp_size: int
    seqlens: CPSeqlens

    def to(self, device: torch.device | str) -> CPShardInputs:
        """A copy with the four tensors on ``device`` (the int32 metadata stays on the CPU)."""
        return dataclasses.replace(self, **{n: getattr(self, n).to(device, copy=True) for n in ("q", "k", "v", "dout")})


@dataclass
class CPProcessGroups:
    """The process groups a CP backend runs with on one rank (made by the executor).

    Attributes:
        rank: this rank in the CP group.
        cp_size: size of the CP group.
        group: the CP process group (``torch.distributed.ProcessGroup``) of all ``cp_size`` ranks.
        global_ranks: global ranks of the CP group, in CP-rank order (TE's ``cp_global_ranks``).
        device: this rank's ``torch.device`` (``cuda:<gpu>`` with NCCL, ``cpu`` with gloo).
        stream: a ``torch.cuda.Stream`` for CP communication on CUDA (TE's ``cp_stream``), None on CPU.
        a2a_group: for ``a2a+p2p``: the pair ``{2i, 2i+1}`` this rank belongs to (heads are split
            over it); None when ``cp_size`` is odd or < 4.
        p2p_group: for ``a2a+p2p``: the ranks of this rank's parity ``{p, p+2, ...}`` (the ring
            runs over it); None when ``a2a_group`` is None.
    """

    rank: int
    cp_size: int
    group: Any
    global_ranks: list[int]
    device: torch.device
    stream: Any = None
    a2a_group: Any = None
    p2p_group: Any = None

    def hierarchical_ranks(self) -> tuple[list[int], list[int]]:
        """The global ranks of this rank's ``(a2a_group, p2p_group)`` (see the attributes)."""
        from fuzzer.backends.cp_layout import hierarchical_ranks

        return hierarchical_ranks(self.cp_size, self.rank)


@runtime_checkable
class CPBackend(Protocol):
    """What a CP-capable backend adds to `fuzzer.backends.base.Backend` (see module docstring)."""

    def run_cp(self, case: AttentionCase, inputs: CPShardInputs, groups: CPProcessGroups, variant: str) -> BackendOutput:
        """Run this rank's part of ``case`` under CP; return the local outputs (canonical
        layout, local length; gradients when ``case.backward``). Raise as `Backend.run`."""
        ...


def is_cp_backend(backend: Backend) -> bool:
    """True when ``backend`` declares ``capabilities.cp`` and implements ``run_cp``."""
    return bool(backend.capabilities.cp) and callable(getattr(backend, "run_cp", None))
