"""FlashAttention 2 (flash-attn) adapter: ``flash_attn.flash_attn_func`` / ``flash_attn_varlen_func``.

What the library expects (read in flash-attn 2.8.3, ``flash_attn/flash_attn_interface.py``):

* ``flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
  window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
  return_attn_probs=False)`` on ``[batch_size, seqlen, heads, dim]``;
  ``flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)``
  on packed ``[total, heads, dim]`` with int32 cu_seqlens.
* ``-1`` means an unbounded window side ("-1 means infinite context window"); ``window_size``
  exists since 2.3 and ``softcap`` since 2.6.
* ``causal`` and windows are aligned bottom-right: query ``i`` sees keys in
  ``[i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right]``. The C++ entry sets
  ``window_size_right = 0`` for ``causal`` and treats ``causal=False, window_size=(-1, 0)`` as
  causal.
* ``return_attn_probs=True`` returns ``(out, softmax_lse, S_dmask)``; ``softmax_lse`` is float32,
  natural log of the scaled scores, ``[batch_size, num_heads, seqlen_q]`` or ``[num_heads,
  total_q]`` for varlen (older builds: ``[batch_size, num_heads, max_seqlen_q]``, handled by
  `canonical_lse`). ``S_dmask`` is None without dropout.
* A fully masked row returns out = 0 and lse = +inf (``csrc/flash_attn/src/softmax.h``:
  ``Split ? -INFINITY : INFINITY``), declared as ``masked_row_lse``.
* fp16/bf16, head_dim <= 256 (padded internally to a multiple of 8), head_dim_v == head_dim,
  GQA/MQA, SM80 and newer; backward through autograd.

Variants:

* ``native``: FA2's own encoding: ``causal=case.causal``, ``window_size=(left or -1, right or
  -1)``.
* ``causal_as_window``: causality only through the window, ``causal=False``, ``window_size=(left
  or -1, 0)``. Causal cases only.

Source: Dao-AILab/flash-attention ``flash_attn/flash_attn_interface.py`` (v2.8.3) and README
("2.1: Change behavior of causal flag"; sliding window "2.3").
"""

from __future__ import annotations

import importlib
import math
from typing import Any, ClassVar

from fuzzer.backends._common import (
    FA2_DESIGN,
    call_with_signature,
    canonical_lse,
    cuda_arch_major,
    describe_call,
    distribution_version,
    fa_repro_source,
    is_declared_refusal,
    library_layout_qkv,
)
from fuzzer.backends.base import Backend, BackendOutput, Capabilities, ReproCall, UnsupportedCaseError, run_with_grad
from oracle.config import AttentionCase
from oracle.design import Design

FA2_DISTRIBUTION = "flash-attn"
FA2_VARIANTS = ("native", "causal_as_window")
FA2_ESSENTIAL_KWARGS = frozenset(
    {
        "causal",
        "window_size",
        "softmax_scale",
        "softcap",
        "cu_seqlens_q",
        "cu_seqlens_k",
        "max_seqlen_q",
        "max_seqlen_k",
    }
)
_MINUS1 = -1  # FA2's "unbounded" sentinel


def _or_minus1(value: int | None) -> int:
    return _MINUS1 if value is None else value


def fa2_call_kwargs(case: AttentionCase, variant: str) -> dict[str, Any]:
    """Every non-tensor keyword FA2 receives for ``case`` under ``variant``.

    Returns:
        e.g. ``{"dropout_p": 0.0, "softmax_scale": 0.125, "causal": True, "window_size": (-1, -1),
        "return_attn_probs": True}`` (plus ``softcap`` when set and ``max_seqlen_q``/``max_seqlen_k``
        for thd; cu_seqlens tensors are added at call time).

    Raises:
        ValueError: unknown variant, or ``causal_as_window`` for a non-causal case.
    """
    left, right = _or_minus1(case.window_size_left), _or_minus1(case.window_size_right)
    if variant == "native":
        causal, window_size = case.causal, (left, right)
    elif variant == "causal_as_window":
        if not case.causal:
            raise ValueError("causal_as_window: the case is not causal")
        causal, window_size = False, (left, 0)
    else:
        raise ValueError(f"unknown FA2 variant {variant!r}; expected one of {FA2_VARIANTS}")
    kwargs: dict[str, Any] = {}
    if case.is_varlen:
        kwargs["max_seqlen_q"] = case.seqlen_q
        kwargs["max_seqlen_k"] = case.seqlen_k
    kwargs.update(dropout_p=0.0, softmax_scale=case.softmax_scale, causal=causal, window_size=window_size)
    if case.softcap is not None:
        kwargs["softcap"] = case.softcap
    kwargs["return_attn_probs"] = True
    return kwargs


class FA2Backend(Backend):
    """flash-attn 2 called through ``flash_attn.flash_attn_func`` (see the module docstring)."""

    name: ClassVar[str] = "fa2"
    variants: ClassVar[tuple[str, ...]] = FA2_VARIANTS
    device: ClassVar[str] = "cuda"
    environment: ClassVar[str] = "fa2"
    packages: ClassVar[tuple[str, ...]] = (FA2_DISTRIBUTION, "torch")
    # A row with no visible key gets lse = +inf (csrc/flash_attn/src/softmax.h, non-split path).
    masked_row_lse: ClassVar[float | None] = math.inf
    design: ClassVar[Design] = FA2_DESIGN
    capabilities: ClassVar[Capabilities] = Capabilities(
        dtypes=("bfloat16", "float16"),
        qkv_formats=("bshd", "sbhd", "thd"),
        max_head_dim=256,
        head_dim_multiple=1,
        head_dim_v_differs=False,
        gqa=True,
        causal_alignments=("bottom_right",),
        windows=True,
        softcap=True,
        backward=True,
        lse=True,
    )

    def quick_availability(self) -> str | None:
        """Package, CUDA device and architecture, without importing flash_attn."""
        if distribution_version(FA2_DISTRIBUTION) is None:
            return f"{FA2_DISTRIBUTION} (FlashAttention 2) is not installed"
        reason = Backend.availability(self)
        if reason:
            return reason
        major = cuda_arch_major()
        if major is None or major < 8:
            return f"FlashAttention 2 needs SM80 or newer, this GPU is sm{major}x"
        return None

    def availability(self) -> str | None:
        """None when FA2 can run here, else why not (package, CUDA, SM80+, import)."""
        reason = self.quick_availability()
        if reason:
            return reason
        try:
            module = importlib.import_module("flash_attn")
            getattr(module, "flash_attn_func")
        except Exception as exc:  # noqa: BLE001
            return f"cannot import flash_attn.flash_attn_func: {type(exc).__name__}: {exc}"
        return None

    def runtime_versions(self) -> dict[str, str]:
        """The FlashAttention 2 build imported in this process: ``flash_attn`` (its
        ``__version__``) and ``flash_attn_module`` (its directory). Empty before it is imported."""
        import os
        import sys

        module = sys.modules.get("flash_attn")
        if module is None or not getattr(module, "__file__", None):
            return {}
        return {
            "flash_attn": str(getattr(module, "__version__", "unknown")),
            "flash_attn_module": os.path.dirname(os.path.realpath(module.__file__)),
        }

    def unsupported_reasons(self, case: AttentionCase, variant: str) -> list[str]:
        """Base checks, bottom-right windows, and whether the variant can encode the case."""
        reasons = super().unsupported_reasons(case, variant)
        has_window = case.window_size_left is not None or case.window_size_right is not None
        if has_window and not case.causal and case.causal_alignment != "bottom_right":
            reasons.append("FA2 aligns sliding windows bottom-right only")
        reasons.extend(self.inapplicable_reasons(case, variant))
        return reasons

    def inapplicable_reasons(self, case: AttentionCase, variant: str) -> list[str]:
        """``causal_as_window`` encodes causality only: no distinct call for a non-causal case."""
        if variant == "causal_as_window" and not case.causal:
            return ["causal_as_window: the case is not causal"]
        return []

    def run(self, case: AttentionCase, inputs: Any, variant: str) -> BackendOutput:
        """Call flash_attn_func / flash_attn_varlen_func with the variant's encoding.

        Raises:
            UnsupportedCaseError: the build lacks ``window_size``/``softcap``, or FA2 refused.
        """
        module = importlib.import_module("flash_attn")
        func_name = "flash_attn_varlen_func" if case.is_varlen else "flash_attn_func"
        func = getattr(module, func_name)
        kwargs = fa2_call_kwargs(case, variant)
        tensor_kwargs = (
            {"cu_seqlens_q": inputs.cu_seqlens_q, "cu_seqlens_k": inputs.cu_seqlens_k} if case.is_varlen else {}
        )

        def attention(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
            q_, k_, v_ = library_layout_qkv(case, q, k, v)
            try:
                result, _ = call_with_signature(
                    func, (q_, k_, v_), {**tensor_kwargs, **kwargs}, FA2_ESSENTIAL_KWARGS
                )
            except UnsupportedCaseError:
                raise
            except Exception as exc:
                if is_declared_refusal(exc) or (isinstance(exc, RuntimeError) and "only supports" in str(exc)):
                    raise UnsupportedCaseError(f"flash-attn refused the case: {exc}") from exc
                raise
            if isinstance(result, (tuple, list)):
                return result[0], canonical_lse(case, result[1] if len(result) > 1 else None)
            return result, None

        out, lse, dq, dk, dv = run_with_grad(attention, case, inputs)  # ahead-of-time kernels: no JIT
        return BackendOutput(
            out=out,
            lse=lse,
            dq=dq,
            dk=dk,
            dv=dv,
            extra={
                "call": describe_call(func_name, kwargs),
                "flash_attn_version": distribution_version(FA2_DISTRIBUTION) or "unknown",
            },
        )


    def repro(self, case: AttentionCase, variant: str) -> ReproCall:
        """The exported repro's call: `fa2_call_kwargs` of the variant, as `run` sends them.

        Raises:
            ValueError: the variant cannot encode ``case``.
        """
        return ReproCall(
            source=FA2_REPRO_SOURCE, values={"fa2_kwargs": fa2_call_kwargs(case, variant)},
            packages=(FA2_DISTRIBUTION,), masked_row_lse=self.masked_row_lse,
        )


FA2_REPRO_SOURCE = fa_repro_source(
    constants="FA2_KWARGS = $fa2_kwargs",
    kwargs_name="FA2_KWARGS",
    check_environment=(
        '    require_cuda(None, "flash-attn 2", min_major=8)\n'
        '    pytest.importorskip("flash_attn", reason="flash-attn (FlashAttention 2) is not installed")'
    ),
    import_line="import flash_attn",
    module="flash_attn",
)
"""`FA2Backend.repro`'s source (slot ``fa2_kwargs``)."""

def builtin_backends() -> list[Backend]:
    """The FA2 backend instances this module provides."""
    return [FA2Backend()]


__all__ = ["FA2Backend", "FA2_VARIANTS", "builtin_backends", "fa2_call_kwargs"]
