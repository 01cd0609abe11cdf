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
"""

from __future__ import annotations

import importlib.metadata
import inspect
import time
from collections.abc import Sequence
from typing import Any, Callable

from fuzzer.backends.base import UnsupportedCaseError
from oracle.config import AttentionCase


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
