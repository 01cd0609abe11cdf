"""Helpers the adapters share: calling a library whose signature drifts between builds, the
FlashAttention-style tensor layouts, timing JIT compilation, and the FlashAttention repro source.

Nothing here names a library's own sentinels: those stay in the adapter that owns the library
(`fuzzer.backends.fa4`, `fa2`, `te`, `sdpa`). Every library is imported lazily.

* `fit_to_signature` / `call_with_signature`: keep only the keywords a build's signature takes,
  refusing (`UnsupportedCaseError`) when an essential one is missing.
* `library_layout_qkv` / `canonical_lse`: the sbhd strided view FlashAttention-style callers pass,
  and the library's lse back in the canonical layout (``[batch_size, num_heads, seqlen_q]``, thd
  ``[num_heads, total_q]``).
* `CompileTimer`: a kernel key's first call timed against its second (``compile_ms``).
* `fa_repro_source`: the ``call_backend`` of an exported repro for a FlashAttention-style API
  (``flash_attn_func`` / ``flash_attn_varlen_func``), shared by FA4 and FA2.
* `FA2_DESIGN`, `FA4_DESIGN`, `CUDNN_DESIGN`: the designs (`oracle.design.Design`) of the kernels
  two adapters call each (fa2 and te-fa2, fa4 and te-fa4, torch-sdpa-cudnn and te-fused); the
  reference table is ``docs/design-limits.md``.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import time
from collections.abc import Sequence
from typing import Any, Callable

from fuzzer.backends.base import UnsupportedCaseError
from oracle.config import AttentionCase
from oracle.design import Claim, Design

# ---------------------------------------------------------------------------- designs
_FA2 = "flash-attention v2.8.3 csrc/flash_attn"
FA2_DESIGN = Design(
    "flash-attn-2",
    (
        Claim(
            "probs",
            f"{_FA2}/src/flash_fwd_kernel.h:346-347 (forward), {_FA2}/src/flash_bwd_kernel.h:546-548 (backward)",
            "P converted to the input dtype (convert_type<Element>(acc_s)) for the P @ V and P^T @ dO GEMMs; "
            "dS = P (dP - D) takes P from the float32 scores (flash_bwd_kernel.h:589)",
        ),
        Claim(
            "ds_scaled_softcap",
            f"{_FA2}/src/flash_bwd_kernel.h:586-591 and 620-622; {_FA2}/flash_api.cpp:112-119 (set_params_fprop); "
            f"{_FA2}/src/utils.h:404-409 (calculate_dtanh)",
            "dS converted to the input dtype for the dq and dk GEMMs, with a softcap times dtanh = (1 - tanh^2) * "
            "softmax_scale / softcap; the GEMM results are multiplied by scale_softmax_rp_dropout afterwards "
            "(flash_bwd_kernel.h:680, 731): softmax_scale without a softcap, softcap with one",
        ),
        Claim(
            "gqa_grads_per_head",
            f"{_FA2}/flash_api.cpp:897-903 and 966-967 (mha_bwd), 1120-1126 and 1195-1196 (mha_varlen_bwd)",
            "dk_expanded and dv_expanded hold every query head's dk and dv in the input dtype, then at::sum_out over "
            "the GQA group",
        ),
        Claim(
            "flush_to_zero",
            "flash-attention v2.8.3 setup.py:208 (nvcc --use_fast_math, which implies -ftz=true); "
            f"{_FA2}/src/softmax.h:86-88, 118 (exp2f of the scores)",
            "the extension is compiled with flush-to-zero: float32 P and dS below 2**-126 are zero",
        ),
    ),
    "FlashAttention 2: float32 scores and accumulators (flushing subnormals); P and dS (dS*scale/softcap with a "
    "softcap) rounded for their GEMMs; GQA dk and dv written per query head in the dtype and summed",
)
"""FlashAttention 2's design (the ``flash_attn`` extension of flash-attn 2.x): fa2 and te-fa2 (TE
passes k and v with their own heads to ``flash_attn_func``, transformer-engine 2.20.2
``attention/dot_product_attention/backends.py:1286``)."""

_FA4 = "flash-attn-4 4.0.0b36 flash_attn/cute"
FA4_DESIGN = Design(
    "flash-attn-4",
    (
        Claim(
            "probs",
            f"{_FA4}/flash_fwd_sm90.py:1400 (forward), {_FA4}/flash_bwd_sm90.py:1555 (backward; SM100 "
            "flash_bwd_sm100.py:3666)",
            "P converted with cvt_f16 for the P @ V and P^T @ dO GEMMs; dS = P (dP - dPsum) takes the float32 P "
            "(flash_bwd_sm90.py:1563-1569)",
        ),
        Claim(
            "ds",
            f"{_FA4}/flash_bwd_sm90.py:1575 (SM100 flash_bwd_sm100.py:3778-3779)",
            "dS (times 1 - tanh^2 with a softcap: score_mod_bwd, utils.py:200-209) converted with cvt_f16 for the "
            "dq and dk GEMMs; softmax_scale multiplies the float32 dk (flash_bwd_sm90.py:1420) and dQaccum "
            "(flash_bwd_postprocess.py:656)",
        ),
    ),
    "FlashAttention 4 (CuTe DSL): float32 scores and accumulators; P and dS rounded for their GEMMs; GQA dk and dv "
    "summed over the group in float32 (flash_bwd_sm90.py:1772-1795, cpasync_reduce_bulk_add_f32 into dKaccum and "
    "dVaccum, then the postprocess)",
)
"""FlashAttention 4's design: fa4 and te-fa4 (TE passes k and v with their own heads to
``flash_attn_func_v4``, transformer-engine 2.20.2 ``backends.py:1211, 1257``). It claims neither
per-head GQA gradients nor scores in the dtype: FA4 sums a GQA group in float32, and its known
defects (all-zero causal output, the key-64 tail, windowed backward garbage) stay defects. Not
claimed, because not established: ``flush_to_zero`` (its exp2 is ``cute.math.exp2(...,
fastmath=True)``, whose subnormal behaviour was not read or measured)."""

_CUDNN = "cudnn-frontend v1.23.0 include/cudnn_frontend/node/scaled_dot_product_flash_attention.h"
CUDNN_DESIGN = Design(
    "cudnn-sdpa",
    (
        Claim(
            "probs",
            f"{_CUDNN}:918-920 (forward, bmm2 operand), 1737-1739 (backward, reshape_p)",
            "P set to the input dtype for the P @ V and P^T @ dO matmuls; dS = (dP - sum) * exp(S) takes the "
            "virtual exp_s_output of the graph's float32 intermediate type (1714-1716, 1809-1810)",
        ),
        Claim(
            "ds_scaled",
            f"{_CUDNN}:1836-1850 (mul_dS_attn_scale, then reshape_dS set to the dtype)",
            "dS multiplied by attn_scale, then set to the input dtype for the dk and dq matmuls; the matmul results "
            "are not scaled again",
        ),
        Claim(
            "gqa_grads_per_head",
            f"{_CUDNN}:1752-1782 (dV_fullhead, red_dV_head) and 1863-1894 (dK_fullhead, red_dK_head)",
            "with h_q != h_k, dK and dV of every query head are matmul outputs in the input dtype, then a reduction "
            "(red_dK_head, red_dV_head) over the GQA group",
        ),
        Claim(
            "flush_to_zero",
            f"{_CUDNN}:1714 (the graph's EXP pointwise; the fused kernel is not public); measured on the H200 "
            "(torch 2.11 and its cuDNN)",
            "P = exp(-88.5) (3.8e-39, below float32's smallest normal) gives dv and dk exactly 0 where "
            "torch-sdpa-math, torch-sdpa-flash and torch-sdpa-efficient keep the subnormal values",
        ),
    ),
    "cuDNN SDPA (the cudnn-frontend sdpa_backward graph): float32 intermediates (flushing subnormals); P and "
    "dS*scale rounded for their matmuls; GQA dk and dv per query head in the dtype, then reduced",
)
"""cuDNN's SDPA design, as the cudnn-frontend graph states it (the fused kernel itself is not
public): torch-sdpa-cudnn (PyTorch ``aten/src/ATen/native/cudnn/MHA.cpp``, ``mha_graph->
sdpa_backward``) and te-fused (TransformerEngine main at d0067d0, 2.20.0.dev0: ``common/fused_attn/
fused_attn_f16_arbitrary_seqlen.cu:982``, intermediate data type FLOAT at 790). Measured on the
H200 (torch 2.11, ``docs/design-limits.md``): dq follows ``ds_scaled``, a GQA group whose per-head
dk overflows gives NaN where the sum is 0, and float32 P below 2**-126 is 0."""


def is_one_sided_window(case: AttentionCase) -> bool:
    """True when exactly one of the two window bounds is set."""
    return (case.window_size_left is None) != (case.window_size_right is None)


def cuda_arch_major() -> int | None:
    """The compute-capability major of the current CUDA device, None without CUDA."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        return int(torch.cuda.get_device_capability()[0])
    except Exception:  # noqa: BLE001 - no usable device means "unknown"
        return None


def distribution_version(name: str) -> str | None:
    """The installed version of distribution ``name``, None when absent."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def fit_to_signature(
    func: Callable, kwargs: dict[str, Any], essential: frozenset[str]
) -> tuple[dict[str, Any], list[str]]:
    """The keywords of ``kwargs`` that ``func``'s signature accepts.

    Args:
        func: the library callable whose signature decides (a function, a class, ``module.forward``).
        kwargs: keyword arguments the adapter wants to send.
        essential: keywords that must not be dropped.

    Returns:
        ``(accepted, dropped)``: the keywords to send and the optional ones this build lacks.

    Raises:
        UnsupportedCaseError: an essential keyword is not accepted by this build.
    """
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):  # builtins without a signature: send everything
        return dict(kwargs), []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(kwargs), []
    dropped = sorted(k for k in kwargs if k not in params)
    missing = [k for k in dropped if k in essential]
    if missing:
        raise UnsupportedCaseError(
            f"{getattr(func, '__qualname__', func)} of this build takes no {', '.join(missing)} argument"
        )
    return {k: v for k, v in kwargs.items() if k in params}, dropped


def call_with_signature(
    func: Callable, args: tuple, kwargs: dict[str, Any], essential: frozenset[str]
) -> tuple[Any, list[str]]:
    """Call ``func(*args, **kwargs)`` keeping only the keywords its signature accepts.

    Returns:
        ``(result, dropped)``: the call's result and the optional keywords the build lacks.

    Raises:
        UnsupportedCaseError: as `fit_to_signature`.
    """
    accepted, dropped = fit_to_signature(func, kwargs, essential)
    return func(*args, **accepted), dropped


def library_layout_qkv(case: AttentionCase, q: Any, k: Any, v: Any) -> tuple[Any, Any, Any]:
    """The tensors an FA-style caller passes for the case's ``qkv_format``.

    bshd and thd are passed as they are. For sbhd the caller holds ``[seqlen, batch, heads, dim]``
    memory and hands FlashAttention a ``[batch, seqlen, heads, dim]`` strided view of it (no copy),
    so the kernel sees sbhd strides. Autograd flows back to the canonical tensors.
    """
    if case.qkv_format != "sbhd":
        return q, k, v
    return tuple(t.transpose(0, 1).contiguous().transpose(0, 1) for t in (q, k, v))


def canonical_lse(case: AttentionCase, lse: Any) -> Any:
    """The library's lse in the canonical layout (``[b, h, sq]`` or ``[h, total_q]``), float32+.

    Accepted library layouts: the canonical one; ``[b, sq, h]`` / ``[total_q, h]`` (FA4 with qv);
    ``[b, h, max_seqlen_q]`` for thd (FA2 before the packed varlen lse), unpadded per sequence.

    Raises:
        RuntimeError: the shape matches none of these.
    """
    if lse is None:
        return None
    import torch

    lse = lse.detach()
    b, h, sq = case.batch_size, case.num_heads, case.seqlen_q
    shape = tuple(lse.shape)
    if not case.is_varlen:
        if shape == (b, h, sq):
            return lse
        if shape == (b, sq, h):
            return lse.transpose(1, 2)
    else:
        total_q = case.total_q
        if shape == (h, total_q):
            return lse
        if shape == (total_q, h):
            return lse.transpose(0, 1)
        if shape == (b, h, sq):
            return torch.cat([lse[i, :, :n] for i, n in enumerate(case.seqlens_q_list)], dim=1)
    raise RuntimeError(f"unexpected lse shape {shape} for {case.describe()}")


def _synchronize(tensor: Any) -> None:
    import torch

    if getattr(tensor, "is_cuda", False):
        torch.cuda.synchronize(tensor.device)


class CompileTimer:
    """Measures JIT compilation: the first call per kernel key is timed and repeated once.

    ``compile_ms = first - second`` (clamped at 0); the second call's result is kept. Later calls
    with the same key run once and report 0. Keys are remembered only after a successful pair.

    ``compiles``: for a library that may compile again under a known key (``torch.compile``
    recompiles for new shapes or guards), a function giving a count of its compilations so far;
    a call with a known key during which the count moved is timed again like a new key. On the
    H200 (2026-12-01) such recompiles of torch-flex were recorded as kernel time: 84.7 s of
    "kernels" in 47 cases, up to 15.8 s for one call, unseen by the compile budget.
    """

    def __init__(self, compiles: Callable[[], int] | None = None) -> None:
        self._seen: set[tuple] = set()
        self._compiles = compiles

    def _count(self) -> int:
        try:
            return int(self._compiles()) if self._compiles is not None else 0
        except Exception:  # a counter that moved or vanished between versions: no recompile seen
            return 0

    def run(self, key: tuple, fn: Callable[[], Any], sync_on: Any) -> tuple[Any, float]:
        """Run ``fn`` (twice for a new ``key``, or for a known one that compiled again);
        ``sync_on`` is a tensor whose device to sync. Returns ``(result, compile_ms)``."""
        if key in self._seen:
            if self._compiles is None:
                return fn(), 0.0
            before = self._count()
            _synchronize(sync_on)
            start = time.perf_counter()
            result = fn()
            _synchronize(sync_on)
            first = time.perf_counter() - start
            if self._count() == before:
                return result, 0.0
            start = time.perf_counter()
            result = fn()
            _synchronize(sync_on)
            return result, max(0.0, first - (time.perf_counter() - start)) * 1000.0
        _synchronize(sync_on)
        start = time.perf_counter()
        fn()
        _synchronize(sync_on)
        first = time.perf_counter() - start
        start = time.perf_counter()
        result = fn()
        _synchronize(sync_on)
        second = time.perf_counter() - start
        self._seen.add(key)
        return result, max(0.0, first - second) * 1000.0


def describe_call(name: str, kwargs: dict[str, Any]) -> str:
    """``name(k=v, ...)`` for the non-tensor keywords, for ``BackendOutput.extra``."""
    return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")"


def is_declared_refusal(exc: BaseException) -> bool:
    """True when a library exception states a limitation rather than a failure.

    FlashAttention raises NotImplementedError for unimplemented features and AssertionError with
    "not supported" / "Unsupported" for shapes and architectures it does not handle.
    """
    if isinstance(exc, NotImplementedError):
        return True
    text = str(exc).lower()
    return isinstance(exc, AssertionError) and ("not supported" in text or "unsupported" in text)


def format_cudnn_version(code: int | Sequence[int]) -> str:
    """``9.19.0`` from cuDNN's integer (``91900``; ``8906`` for 8.x: ``major * 1000 + minor * 100
    + patch`` before 9, ``major * 10000 + ...`` from 9) or from a ``(major, minor, patch)`` tuple
    (TE's ``get_cudnn_version``)."""
    if not isinstance(code, int):
        return ".".join(str(int(part)) for part in code)
    magnitude = 1000 if code < 90000 else 10000
    major, rest = divmod(code, magnitude)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


FA_REPRO_HELPERS = "\n\n".join(inspect.getsource(f) for f in (library_layout_qkv, canonical_lse)).replace("$", "$$")
"""`library_layout_qkv` and `canonical_lse` verbatim, for the FA4/FA2 repro sources: the file's
``CASE`` carries the case fields they read, so the exported call lays tensors out as `run` does."""


def fa_repro_source(*, constants: str, kwargs_name: str, check_environment: str, import_line: str, module: str) -> str:
    """The `fuzzer.backends.base.ReproCall` source of a FlashAttention-style adapter: the shared
    layout helpers (`FA_REPRO_HELPERS`), the adapter's constants, its ``check_environment`` and a
    ``call_backend`` that calls ``<module>.flash_attn_varlen_func`` for thd (with ``cu_seqlens_q/k``)
    or ``<module>.flash_attn_func`` otherwise, with ``**<kwargs_name>``, and returns ``(out, lse)``
    with lse in the canonical layout (None when the library returns a bare tensor).

    Args:
        constants: module-level lines of the repro, ``$slot`` values included (e.g.
            ``"FA2_KWARGS = $fa2_kwargs"``).
        kwargs_name: the constant holding the keyword arguments of the call.
        check_environment: the body of ``check_environment()``, indented four spaces.
        import_line: the statement that imports the library inside ``call_backend``.
        module: the name that statement binds.
    """
    return FA_REPRO_HELPERS + f'''

{constants}


def check_environment():
{check_environment}


def call_backend(q, k, v, cu_seqlens_q, cu_seqlens_k):
    {import_line}

    q, k, v = library_layout_qkv(CASE, q, k, v)
    if QKV_FORMAT == "thd":
        result = {module}.flash_attn_varlen_func(
            q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, **{kwargs_name}
        )
    else:
        result = {module}.flash_attn_func(q, k, v, **{kwargs_name})
    if isinstance(result, (tuple, list)):
        return result[0], canonical_lse(CASE, result[1] if len(result) > 1 else None)
    return result, None
'''


__all__ = [
    "CUDNN_DESIGN",
    "FA2_DESIGN",
    "FA4_DESIGN",
    "FA_REPRO_HELPERS",
    "CompileTimer",
    "call_with_signature",
    "canonical_lse",
    "cuda_arch_major",
    "describe_call",
    "distribution_version",
    "fa_repro_source",
    "format_cudnn_version",
    "fit_to_signature",
    "is_declared_refusal",
    "is_one_sided_window",
    "library_layout_qkv",
]
