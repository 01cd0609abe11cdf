"""PyTorch attention backends: SDPA (math, flash, efficient, cuDNN) on CPU and CUDA, and flex_attention.

One adapter class, `SDPABackend`, instantiated once per (device, SDPA kernel). Variants are the
equivalent ways a caller can ask PyTorch for the same mask:

=================  ===================================================================================
``is_causal``      ``scaled_dot_product_attention(..., is_causal=case.causal)`` and no mask tensor.
                   PyTorch's ``is_causal`` is top-left aligned, so only top-left causal or unmasked
                   cases without windows are supported.
``bool_mask``      ``attn_mask`` = boolean ``[seqlen_q, seqlen_k]`` tensor (True = attend) built from
                   ``oracle.masks.visible_mask``: any alignment and any window.
``float_mask``     ``attn_mask`` = additive mask of the query dtype (0 / -inf).
``causal_bias``    ``torch.nn.attention.bias.causal_upper_left`` / ``causal_lower_right`` objects for
                   causal cases without windows (the lower-right one is PyTorch's bottom-right form).
``aten_lse``       the private op PyTorch's dispatcher ends in for this kernel, called directly because
                   it is the only way to get the logsumexp (``_scaled_dot_product_flash_attention_for_cpu``
                   on CPU, ``_scaled_dot_product_{flash,efficient,cudnn}_attention`` on CUDA); the mask
                   goes in as ``is_causal`` (top-left) or an additive mask where the op takes one.
=================  ===================================================================================

GQA uses ``enable_gqa=True`` (public API) or an explicit ``repeat_interleave`` of k/v (private ops).
Softcap and varlen (``thd``) are not supported by SDPA. ``sbhd`` cases pass q/k/v as permuted views
of a sequence-major buffer, so the kernel sees the strides an ``sbhd`` caller would give it.

Conventions of the library that this adapter translates (and nothing else does):

* SDPA layout is ``[batch, heads, seq, dim]``; attnfuzz's canonical layout is ``[batch, seq, heads, dim]``.
* The CPU flash op returns ``lse = 0`` for a row with no visible key where attnfuzz's convention
  is ``-inf``; the adapter declares this with ``masked_row_lse = 0.0`` so the comparison accepts
  exactly that value on exactly those rows (see ``Backend.masked_row_lse``).

Source: torch/nn/functional.py (scaled_dot_product_attention docstring: is_causal is top-left),
torch/nn/attention/bias.py (CausalVariant), aten/src/ATen/native/native_functions.yaml (the
``_scaled_dot_product_*`` signatures), torch 2.13.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from fuzzer.backends._common import CUDNN_DESIGN
from fuzzer.backends.base import Backend, BackendOutput, Capabilities, ReproCall, run_with_grad
from oracle.config import AttentionCase
from oracle.design import Claim, Design

_SDPA_KERNELS = {
    "math": "MATH",
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
}


# ---------------------------------------------------------------------------- designs
# (the reference table and the derivations: docs/design-limits.md)
_ATEN = "PyTorch aten/src/ATen/native"
_ADAPTER_GQA = (
    "attnfuzz fuzzer/backends/sdpa.py:402-403 (SDPABackend._aten: the aten_lse variant expands k and v with "
    "repeat_interleave in the dtype; autograd sums the per-head dk and dv over the group)"
)

TORCH_MATH_DESIGN = Design(
    "torch-math",
    (
        Claim(
            "delta_from_dp",
            f"{_ATEN}/transformers/attention.cpp _scaled_dot_product_attention_math (attn = "
            "at::_safe_softmax(attn, -1) on float32; autograd's SafeSoftmaxBackward0)",
            "the softmax backward computes dS = P * (dP - rowsum(P * dP)) from the float32 dP, not from the "
            "rounded out (measured: the emulation with this claim gives torch-cpu-math's bfloat16 dq to 2e-8 "
            "relative, without it 1e-3 apart)",
        ),
    ),
    "PyTorch's math SDPA (_scaled_dot_product_attention_math, aten/src/ATen/native/transformers/attention.cpp): "
    "q, k and v upcast to float32 unless torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp is set (query_acc, "
    "key_acc, value_acc); GQA by pre_process_group_query_attention_input, a repeat_interleave of the float32 k and "
    "v, so the group's gradients are summed in float32; only out and the gradients are rounded to the dtype",
)
"""torch-cpu-math and torch-sdpa-math: nothing in the dtype, autograd's softmax backward (measured
on CPU, torch 2.13, and the H200, torch 2.11: a GQA group whose per-head dk overflows float16 gives
the exact 0)."""

TORCH_CPU_FLASH_DESIGN = Design(
    "torch-cpu-flash",
    (
        Claim(
            "probs",
            f"{_ATEN}/cpu/FlashAttentionKernel.cpp:704-707 and 757 (forward), 1018-1046 (backward) "
            "(PyTorch 27a4844d7fb, cpu_flash_attention and cpu_flash_attention_backward)",
            "exp(qk - max) written to the reduced-type buffer qk_reduced_data for the P @ V GEMM; attn converted "
            "to attn_reduced_data for grad_v += attn^T @ grad_out; grad_attn = attn * (grad_attn - dsum) takes the "
            "float32 attn (1064-1073)",
        ),
        Claim(
            "ds",
            f"{_ATEN}/cpu/FlashAttentionKernel.cpp:1074-1119 (PyTorch 27a4844d7fb)",
            "grad_attn (dS) converted to grad_attn_reduced_data; grad_q and grad_k GEMMs with alpha = "
            "scaling_factor",
        ),
        Claim(
            "gqa_grads_per_head",
            f"{_ATEN}/cpu/FlashAttentionKernel.cpp:903-905, 932-933, 1044, 1117 (PyTorch 27a4844d7fb); "
            + _ADAPTER_GQA,
            "with enable_gqa the kernel accumulates every query head's grad_k and grad_v into the dtype outputs "
            "(GEMMs with beta = 1 on scalar_t buffers over r < repeat_factor); aten_lse sums the per-head outputs",
        ),
        Claim(
            "grads_accumulated",
            f"{_ATEN}/cpu/FlashAttentionKernel.cpp:903-905, 932-947, 1030-1046, 1086-1119 and 1228-1240 (PyTorch "
            "27a4844d7fb, cpu_flash_attention_backward and flash_attention_backward_kernel_impl)",
            "grad_q, grad_k, grad_v are scalar_t outputs that cpublas::gemm accumulates with beta = 1: for each query "
            "head r of a kv head, each query block m (qSplitSize 32, 64 from seqlen_q 192, 256 from 768), each key "
            "block n (kvSplitSize 512): grad_v[n] += P^T dO, grad_q[m] += scale dS k, grad_k[n] += scale dS^T q",
            block_q=((0, 32), (192, 64), (768, 256)),
            block_k=512,
        ),
        Claim(
            "flush_to_zero",
            f"{_ATEN}/cpu/FlashAttentionKernel.cpp:1023-1046 (PyTorch 27a4844d7fb: attn converted to the reduced type, "
            "then grad_v += attn^T @ grad_out by cpublas::gemm); measured on the CPU (torch 2.13.0, 2026-12-05)",
            "bf16, seqlen_q 1, 428 keys, 9/3 heads, massive channels, large dout: P = 1.9e-39 (below float32's smallest "
            "normal) times dO = 784 gives the float64 dv 1.5e-36, a normal bfloat16; the kernel's dv is exactly 0 "
            "there (its bf16 GEMM treats the subnormal P as zero), where the float32 emulation without the claim "
            "keeps it",
        ),
    ),
    "PyTorch's CPU flash kernel: float32 scores; P and dS rounded for their GEMMs (subnormal P read as zero); dq, "
    "dk and dv accumulated block by block (and over a GQA group's heads) in the dtype outputs",
)
"""torch-cpu-flash (measured on CPU, torch 2.13: dq error with tiny dS as ``probs`` + ``ds``;
per-head dk overflow: inf through enable_gqa, NaN through aten_lse)."""

_TORCH_FA = f"{_ATEN}/transformers/cuda/flash_attn"
TORCH_FLASH_DESIGN = Design(
    "torch-flash",
    (
        Claim(
            "probs",
            f"{_TORCH_FA}/flash_bwd_kernel.h compute_dq_dk_dv_1colblock (rP = convert_type<Element>(acc_s); "
            "upstream flash-attention v2.8.3 flash_bwd_kernel.h:546-548, flash_fwd_kernel.h:346-347)",
            "PyTorch's copy of FlashAttention 2: P converted to the input dtype for P @ V and P^T @ dO",
        ),
        Claim(
            "ds",
            f"{_TORCH_FA}/flash_bwd_kernel.h compute_dq_dk_dv_1colblock (tdSrdS = convert_type<Element>(dS_reshaped); "
            "upstream v2.8.3 flash_bwd_kernel.h:620-622)",
            "dS converted to the input dtype; dq and dk scaled by scale_softmax_rp_dropout after the GEMMs "
            "(SDPA passes no softcap)",
        ),
        Claim(
            "gqa_grads_per_head",
            f"{_TORCH_FA}/flash_api.cpp mha_bwd (dk_expanded, dv_expanded in opts' dtype; at::sum_out over the "
            "group); " + _ADAPTER_GQA,
            "every query head's dk and dv written in the dtype, then summed",
        ),
    ),
    "PyTorch's FlashAttention 2 copy: float32 scores and accumulators; P and dS rounded for their GEMMs; GQA dk and "
    "dv per query head in the dtype, then summed",
)
"""torch-sdpa-flash (measured on the H200, torch 2.11: dq with tiny dS as ``probs`` + ``ds``,
per-head dk overflow NaN in both variants)."""

_XF = "xformers v0.0.28 xformers/csrc/attention/cuda/fmha"
TORCH_EFFICIENT_DESIGN = Design(
    "torch-efficient",
    (
        Claim(
            "probs",
            f"{_XF}/kernel_forward.h:957 (forward), {_XF}/kernel_backward.h:344-349, 1682-1690 and 1805-1812 "
            "(backward); vendored as aten/src/ATen/native/transformers/cuda/mem_eff_attention/",
            "P = exp(S - lse) stored by B2bGemm in scalar_t shared memory (attn_shared_storage) for P @ V and "
            "dV += P^T @ dO",
        ),
        Claim(
            "probs_for_ds",
            f"{_XF}/kernel_backward.h:1935-1954",
            "dSij = (dPij - Di) * Pij reads Pij from that scalar_t shared memory (attn_T)",
        ),
        Claim(
            "ds_scaled",
            f"{_XF}/kernel_backward.h:1986 and 2007-2011",
            "accum = accum * scale, then B2bGemm::accumToSmem writes dS * scale in scalar_t for grad_q += dS @ K "
            "and grad_k += dS^T @ Q, which are not scaled again",
        ),
        Claim("gqa_grads_per_head", _ADAPTER_GQA, "the public variants refuse GQA; only aten_lse runs it"),
    ),
    "The memory-efficient (xformers CUTLASS) kernel: float32 accumulators; P rounded for P @ V, P^T @ dO and "
    "dS = P (dP - D); dS * scale rounded for the dq and dk GEMMs",
)
"""torch-sdpa-efficient (measured on the H200, torch 2.11: dq with tiny dS as ``ds_scaled``, dk with
subnormal P as ``probs_for_ds``, per-head dk overflow NaN through aten_lse)."""

_FLEX = "PyTorch 2.13.0 torch/_inductor/kernel/flex"
TORCH_FLEX_DESIGN = Design(
    "torch-flex",
    (
        Claim(
            "probs",
            f"{_FLEX}/templates/common.py.jinja:137 (forward), templates/flex_backwards.py.jinja:768 (backward)",
            "p.to(MATMUL_PRECISION) (the query dtype) for P @ V and dV += P^T @ dO; ds = p * (dp - Di) takes the "
            "float32 p (flex_backwards.py.jinja:541, 775)",
        ),
        Claim(
            "ds",
            f"{_FLEX}/templates/flex_backwards.py.jinja:604 and 842",
            "ds (after the score_mod backward, grad_scores) converted to MATMUL_PRECISION for dq and dk; dq *= "
            "SM_SCALE and dk *= SM_SCALE afterwards (220, 371); PRESCALE_QK off by default (flex_attention.py:755)",
        ),
        Claim(
            "flush_to_zero",
            f"{_FLEX}/templates/common.py.jinja:119 and flex_backwards.py.jinja:528, 757 (tl.math.exp2); measured "
            "on the H200 (torch 2.11, Triton 3.6)",
            "P = exp(-88.5) (3.8e-39, below float32's smallest normal) gives dv and dk exactly 0 where "
            "torch-sdpa-math keeps the subnormal values",
        ),
    ),
    "flex_attention's Triton templates: float32 scores and accumulators; P and dS rounded for their GEMMs; GQA dk "
    "and dv accumulated over the group in float32 in the kernel (flex_backwards.py.jinja:277)",
)
"""torch-flex (measured on the H200, torch 2.11: dq with tiny dS as ``probs`` + ``ds``; per-head dk
overflow in a GQA group gives the exact 0; float32 P below 2**-126 is 0)."""


class SDPABackend(Backend):
    """``torch.nn.functional.scaled_dot_product_attention`` pinned to one kernel with ``sdpa_kernel``.

    Args:
        name: backend key, e.g. ``"torch-cpu-math"`` or ``"torch-sdpa-flash"``.
        device: ``"cpu"`` or ``"cuda"``.
        kernel: one of ``"math"``, ``"flash"``, ``"efficient"``, ``"cudnn"``.
        capabilities: what this (device, kernel) pair runs.
        variants: the encodings offered (subset of the module table).
        masked_row_lse: see `Backend.masked_row_lse`.
        design: the kernel's design (`oracle.design.Design`; the module's ``TORCH_*_DESIGN`` or
            `fuzzer.backends._common.CUDNN_DESIGN`).
    """

    packages: ClassVar[tuple[str, ...]] = ("torch",)

    def __init__(
        self,
        name: str,
        device: str,
        kernel: str,
        capabilities: Capabilities,
        variants: tuple[str, ...],
        masked_row_lse: float | None = None,
        design: Design | None = None,
    ):
        self.name = name  # type: ignore[misc]
        self.device = device  # type: ignore[misc]
        # on CUDA each kernel gets its own child, so the children of one case run side by side
        # (`fuzzer.executor.ChildProcessExecutor`: environments run concurrently on CUDA) and a
        # slow one (cuDNN building a graph for a new shape) does not hold the others up; on CPU
        # they share one child (the CPU has few cores and nothing to overlap)
        self.environment = f"torch-{device}" if device == "cpu" else name  # type: ignore[misc]
        self.kernel = kernel
        self.capabilities = capabilities  # type: ignore[misc]
        self.variants = variants  # type: ignore[misc]
        self.masked_row_lse = masked_row_lse  # type: ignore[misc]
        self.design = design  # type: ignore[misc]

    def availability(self) -> str | None:
        """Base checks; cuDNN SDPA also needs torch to accept the cuDNN this process loaded
        (torch raises "cuDNN version incompatibility" for an older one than it was built with,
        e.g. a system cuDNN chosen with ``ATTNFUZZ_CUDNN=system``)."""
        reason = super().availability()
        if reason or self.kernel != "cudnn" or self.device != "cuda":
            return reason
        import torch

        try:
            if not torch.backends.cudnn.is_available():
                return "torch has no cuDNN here (torch.backends.cudnn.is_available() is False)"
            torch.backends.cudnn.version()
        except RuntimeError as exc:
            return f"torch refuses the loaded cuDNN: {exc}"
        return None

    def runtime_versions(self) -> dict[str, str]:
        """cuDNN SDPA on CUDA: the cuDNN torch reports it loaded in this process (``9.19.0``);
        nothing for the other kernels (the process map still lists what was mapped)."""
        if self.kernel != "cudnn" or self.device != "cuda":
            return {}
        import torch

        from fuzzer.backends._common import format_cudnn_version

        try:
            code = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        except RuntimeError as exc:  # torch's own check refused the loaded cuDNN
            return {"cudnn_error": str(exc)[:500]}
        return {"cudnn": format_cudnn_version(int(code))} if code else {}

    def unsupported_reasons(self, case: AttentionCase, variant: str) -> list[str]:
        reasons = super().unsupported_reasons(case, variant)
        reasons.extend(self.inapplicable_reasons(case, variant))
        if self.kernel == "flash" and self.device == "cuda" and case.causal and case.seqlen_q != case.seqlen_k:
            # PyTorch's check_flash_causal_non_square_seqlens (aten/src/ATen/native/transformers/
            # cuda/sdp_utils.cpp): FlashAttention 2 aligns causal masks bottom-right, so SDPA refuses
            # is_causal with seqlen_q != seqlen_k ("No available kernel", 44 results on the H200,
            # 2026-12-01), and the private op, which does not check, runs the bottom-right mask
            # where SDPA means top-left (an out:mismatch there was this adapter's, not PyTorch's)
            reasons.append("the CUDA flash kernel aligns causal masks bottom-right: no causal case with seqlen_q != seqlen_k")
        if (
            self.kernel == "efficient"
            and self.device == "cuda"
            and variant != "aten_lse"
            and case.num_heads != case.num_heads_kv
        ):
            # measured on the H200 (torch 2.11): enable_gqa gives "No available kernel"
            reasons.append("the memory-efficient kernel does not take enable_gqa")
        if self.kernel == "cudnn" and case.head_dim < 16:
            # measured on the H200 (torch 2.11, 2026-11-29): head_dim 8 gives "No available kernel"
            reasons.append(f"head_dim {case.head_dim} < 16 (cuDNN SDPA has no kernel)")
        if self.kernel == "cudnn" and case.seqlen_k == 1:
            # measured on the H200 (torch 2.11, 2026-11-29): RuntimeError, PyTorch warns "cudnn SDPA
            # does not support key/value sequence length 1"
            reasons.append("seqlen_k 1 (cuDNN SDPA does not support a key/value sequence length of 1)")
        return reasons

    def inapplicable_reasons(self, case: AttentionCase, variant: str) -> list[str]:
        """Whether the variant can encode the case's mask: ``is_causal`` (and the private ops'
        causal flag) is top-left aligned and has no window, ``causal_bias`` encodes a plain
        causal mask, and a mask tensor is only for a case that has a mask (without one,
        ``is_causal`` is the call)."""
        reasons = []
        has_window = case.window_size_left is not None or case.window_size_right is not None
        if variant == "is_causal" or (variant == "aten_lse" and self.kernel != "efficient"):
            if has_window:
                reasons.append(f"{variant}: windows need a mask tensor")
            if case.causal and case.causal_alignment != "top_left":
                reasons.append(f"{variant}: is_causal is top-left aligned only")
        if variant == "causal_bias" and (not case.causal or has_window):
            reasons.append("causal_bias: only for causal cases without a window")
        if variant in ("bool_mask", "float_mask") and not case.has_mask:
            reasons.append(f"{variant}: the case has no mask (covered by is_causal)")
        return reasons

    def returns_lse(self, variant: str) -> bool:
        """Only ``aten_lse`` (the private op) returns the logsumexp; the public function gives none."""
        return bool(self.capabilities.lse) and variant == "aten_lse"

    # ------------------------------------------------------------------ execution
    def run(self, case: AttentionCase, inputs: Any, variant: str) -> BackendOutput:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def to_sdpa(t):
            # canonical [b, s, h, d] -> [b, h, s, d]; sbhd callers hand strided views of [s, b, h, d]
            if case.qkv_format == "sbhd":
                return t.transpose(0, 1).contiguous().permute(1, 2, 0, 3)
            return t.transpose(1, 2)

        def call(q, k, v):
            qs, ks, vs = to_sdpa(q), to_sdpa(k), to_sdpa(v)
            if variant == "aten_lse":
                out, lse = self._aten(case, qs, ks, vs)
            else:
                mask, is_causal = self._mask_arguments(case, variant, qs)
                with sdpa_kernel(getattr(SDPBackend, _SDPA_KERNELS[self.kernel])):
                    out = torch.nn.functional.scaled_dot_product_attention(
                        qs,
                        ks,
                        vs,
                        attn_mask=mask,
                        is_causal=is_causal,
                        scale=case.softmax_scale,
                        enable_gqa=case.num_heads != case.num_heads_kv,
                    )
                lse = None
            return out.transpose(1, 2), lse

        out, lse, dq, dk, dv = run_with_grad(call, case, inputs)
        return BackendOutput(out=out, lse=lse, dq=dq, dk=dk, dv=dv, selected_kernel=self.kernel)

    def _mask_arguments(self, case: AttentionCase, variant: str, q) -> tuple[Any, bool]:
        import torch

        if variant == "is_causal":
            return None, case.causal
        if variant == "causal_bias":
            from torch.nn.attention.bias import causal_lower_right, causal_upper_left

            make = causal_lower_right if case.causal_alignment == "bottom_right" else causal_upper_left
            return make(case.seqlen_q, case.seqlen_k), False
        from oracle.masks import visible_mask

        visible = visible_mask(case, device=q.device)
        if variant == "bool_mask":
            return visible, False
        additive = torch.zeros(visible.shape, dtype=q.dtype, device=q.device)
        return additive.masked_fill(~visible, -math.inf), False

    def _aten(self, case: AttentionCase, q, k, v):
        """Call the private op behind this kernel; returns (out [b,h,s,d], lse [b,h,s])."""
        import torch

        group = case.num_heads // case.num_heads_kv
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        aten = torch.ops.aten
        scale = case.softmax_scale
        if self.device == "cpu":
            mask = None
            if case.has_mask and not (case.causal and case.causal_alignment == "top_left" and not _has_window(case)):
                mask = self._mask_arguments(case, "float_mask", q)[0]
            is_causal = case.causal and mask is None
            out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, is_causal, attn_mask=mask, scale=scale
            )
            return out, lse
        if self.kernel == "flash":
            res = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, case.causal, False, scale=scale)
            return res[0], res[1]
        if self.kernel == "efficient":
            bias = None
            if case.has_mask:
                # the kernel needs the bias rows 8-element aligned (measured: "attn_bias is not
                # correctly aligned (strideM)"); pad and slice as SDPA's public path does
                mask = self._mask_arguments(case, "float_mask", q)[0]
                pad = (-mask.shape[-1]) % 16
                padded = torch.nn.functional.pad(mask, (0, pad))[..., : mask.shape[-1]]
                bias = padded.expand(q.shape[0], q.shape[1], -1, -1)
            res = aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0, False, scale=scale)
            return res[0], res[1][..., : q.shape[2]]
        if self.kernel == "cudnn":
            res = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, case.causal, False, scale=scale)
            return res[0], res[1].reshape(q.shape[0], q.shape[1], q.shape[2])
        raise ValueError(f"kernel: no private op for {self.kernel!r} (allowed: flash, efficient, cudnn)")

    def repro(self, case: AttentionCase, variant: str) -> ReproCall:
        """The exported repro's call: the same mask encoding and ``sdpa_kernel`` pin as `run`.

        Raises:
            ValueError: ``variant`` is not one of ``variants``.
        """
        if variant not in self.variants:
            raise ValueError(f"unknown variant {variant!r} of {self.name} (allowed: {', '.join(self.variants)})")
        return ReproCall(
            source=SDPA_REPRO_SOURCE,
            values={"sdpa_device": self.device, "sdpa_kernel": _SDPA_KERNELS[self.kernel]},
            device=self.device,
            masked_row_lse=self.masked_row_lse,
        )


SDPA_REPRO_SOURCE = '''
SDPA_DEVICE = $sdpa_device
SDPA_KERNEL = $sdpa_kernel


def check_environment():
    if SDPA_DEVICE == "cuda":
        require_cuda(None, "PyTorch SDPA on CUDA")


def _sdpa_mask(q, variant):
    if variant == "is_causal":
        return None, CAUSAL
    if variant == "causal_bias":
        from torch.nn.attention.bias import causal_lower_right, causal_upper_left

        make = causal_lower_right if CAUSAL_ALIGNMENT == "bottom_right" else causal_upper_left
        return make(SEQLEN_Q, SEQLEN_K), False
    visible = visible_mask(SEQLEN_Q, SEQLEN_K).to(q.device)
    if variant == "bool_mask":
        return visible, False
    additive = torch.zeros(visible.shape, dtype=q.dtype, device=q.device)
    return additive.masked_fill(~visible, -math.inf), False


def _aten_lse(q, k, v):
    group = NUM_HEADS // NUM_HEADS_KV
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    aten = torch.ops.aten
    has_window = WINDOW_SIZE_LEFT is not None or WINDOW_SIZE_RIGHT is not None
    has_mask = CAUSAL or has_window
    if SDPA_DEVICE == "cpu":
        mask = None
        if has_mask and not (CAUSAL and CAUSAL_ALIGNMENT == "top_left" and not has_window):
            mask = _sdpa_mask(q, "float_mask")[0]
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, CAUSAL and mask is None, attn_mask=mask, scale=SOFTMAX_SCALE
        )
        return out, lse
    if SDPA_KERNEL == "FLASH_ATTENTION":
        res = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, CAUSAL, False, scale=SOFTMAX_SCALE)
        return res[0], res[1]
    if SDPA_KERNEL == "EFFICIENT_ATTENTION":
        bias = None
        if has_mask:
            mask = _sdpa_mask(q, "float_mask")[0]
            pad = (-mask.shape[-1]) % 16
            padded = torch.nn.functional.pad(mask, (0, pad))[..., : mask.shape[-1]]
            bias = padded.expand(q.shape[0], q.shape[1], -1, -1)
        res = aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0, False, scale=SOFTMAX_SCALE)
        return res[0], res[1][..., : q.shape[2]]
    res = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, CAUSAL, False, scale=SOFTMAX_SCALE)
    return res[0], res[1].reshape(q.shape[0], q.shape[1], q.shape[2])


def call_backend(q, k, v, cu_seqlens_q, cu_seqlens_k):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def to_sdpa(t):  # canonical [b, s, h, d] -> SDPA's [b, h, s, d]; sbhd callers pass strided views
        if QKV_FORMAT == "sbhd":
            return t.transpose(0, 1).contiguous().permute(1, 2, 0, 3)
        return t.transpose(1, 2)

    qs, ks, vs = to_sdpa(q), to_sdpa(k), to_sdpa(v)
    if VARIANT == "aten_lse":
        out, lse = _aten_lse(qs, ks, vs)
    else:
        mask, is_causal = _sdpa_mask(qs, VARIANT)
        with sdpa_kernel(getattr(SDPBackend, SDPA_KERNEL)):
            out = torch.nn.functional.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=mask, is_causal=is_causal, scale=SOFTMAX_SCALE,
                enable_gqa=NUM_HEADS != NUM_HEADS_KV,
            )
        lse = None
    return out.transpose(1, 2), lse
'''
"""`SDPABackend.repro`'s source (slots ``sdpa_device``, ``sdpa_kernel``; the variant is ``VARIANT``)."""


def _has_window(case: AttentionCase) -> bool:
    return case.window_size_left is not None or case.window_size_right is not None


class FlexBackend(Backend):
    """``torch.nn.attention.flex_attention`` compiled with ``torch.compile`` (CUDA).

    Variants: ``mask_mod`` (the mask as a ``mask_mod`` + block mask, softcap as ``score_mod``).
    Returns the logsumexp (``return_lse=True``); the oracle checks its base.
    Offered on CUDA only: on CPU, eager flex_attention is a reference implementation rather than a
    kernel, and the compiled one took 21.8 s for its first call and 5.2 s for each new shape on
    the 2-core CI machine (torch 2.13, measured 2026-11-29), too slow for fuzzing.

    Compilation: ``torch.compile(flex_attention)`` (automatic dynamic shapes: a second length
    recompiles once with symbolic sizes), and every value the mask and
    score functions use (the alignment offset, the window bounds, the softcap) is a 0-dim tensor
    they capture, not a Python number, so a new sequence length, window or softcap reuses the
    compiled kernel instead of recompiling (on the H200, 2026-12-01, the ``dynamic=False`` version
    spent 49.7 s compiling in 25 calls of a 115 s campaign, up to 13 s a call). What still compiles
    anew is keyed by `kernel_key` (dtype, head dims, which mask bounds exist, softcap or not, GQA,
    backward) and timed by `fuzzer.backends._common.CompileTimer`, so the compile share is reported as
    JIT time, not kernel time. Dynamo's recompile limit is raised in the child so that many keys
    never fall back silently to eager execution.

    Source: torch/nn/attention/flex_attention.py (flex_attention, create_block_mask), torch 2.13.
    """

    name = "torch-flex"
    device = "cuda"
    design = TORCH_FLEX_DESIGN
    environment = "torch-flex"  # its own child: torch.compile must not hold up the SDPA kernels
    variants = ("mask_mod",)
    capabilities = Capabilities(
        dtypes=("bfloat16", "float16", "float32"),
        qkv_formats=("bshd",),
        max_head_dim=256,
        head_dim_multiple=16,
        head_dim_v_differs=True,
        windows=True,
        softcap=True,
        lse=True,
        max_seqlen=4096,
    )

    jit_compiled = True

    def __init__(self):
        self._compiled = None
        self._timer = None

    def kernel_key(self, case: AttentionCase, variant: str) -> tuple:
        """What makes ``torch.compile`` build a new flex kernel (see the class docstring)."""
        right = case.window_size_right
        if case.causal:
            right = 0 if right is None else min(right, 0)
        return (
            case.dtype,
            case.head_dim,
            case.head_dim_v,
            case.has_mask,
            case.window_size_left is not None,
            right is not None,
            case.softcap is not None,
            case.num_heads != case.num_heads_kv,
            case.backward,
        )

    def run(self, case: AttentionCase, inputs: Any, variant: str) -> BackendOutput:
        import torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        from fuzzer.backends._common import CompileTimer

        if self._compiled is None:
            import torch._dynamo

            for limit in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit"):
                if hasattr(torch._dynamo.config, limit):
                    setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 1024))
            self._compiled = torch.compile(flex_attention)  # automatic dynamic shapes after a change
            self._timer = CompileTimer(compiles=dynamo_graph_count)
        device = inputs.q.device
        off = case.seqlen_k - case.seqlen_q if case.causal_alignment == "bottom_right" else 0
        left, right = case.window_size_left, case.window_size_right
        if case.causal:
            right = 0 if right is None else min(right, 0)
        # captured 0-dim tensors: values change without a recompile (see the class docstring)
        off_t = torch.tensor(off, dtype=torch.int32, device=device)
        left_t = None if left is None else torch.tensor(left, dtype=torch.int32, device=device)
        right_t = None if right is None else torch.tensor(right, dtype=torch.int32, device=device)

        def mask_mod(b, h, q_idx, kv_idx):
            keep = kv_idx >= 0
            if right_t is not None:
                keep = keep & (kv_idx <= q_idx + off_t + right_t)
            if left_t is not None:
                keep = keep & (kv_idx >= q_idx + off_t - left_t)
            return keep

        block_mask = None
        if case.has_mask:
            block_mask = create_block_mask(mask_mod, None, None, case.seqlen_q, case.seqlen_k, device=inputs.q.device)
        score_mod = None
        if case.softcap is not None:
            cap = torch.tensor(case.softcap, dtype=torch.float32, device=device)

            def score_mod(score, b, h, q_idx, kv_idx):
                return cap * torch.tanh(score / cap)

        def call(q, k, v):
            out, lse = self._compiled(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                score_mod=score_mod,
                block_mask=block_mask,
                scale=case.softmax_scale,
                enable_gqa=case.num_heads != case.num_heads_kv,
                return_lse=True,
            )
            return out.transpose(1, 2), lse

        (out, lse, dq, dk, dv), compile_ms = self._timer.run(
            self.kernel_key(case, variant), lambda: run_with_grad(call, case, inputs), inputs.q
        )
        return BackendOutput(out=out, lse=lse, dq=dq, dk=dk, dv=dv, selected_kernel="flex", compile_ms=compile_ms)


def dynamo_graph_count() -> int:
    """How many graphs torch.compile has compiled in this process so far
    (``torch._dynamo.utils.counters["stats"]["unique_graphs"]``, torch 2.x): `CompileTimer` reads
    it to see a recompile under a known kernel key."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


_CPU_CAPS = Capabilities(
    dtypes=("bfloat16", "float16", "float32"),
    qkv_formats=("bshd", "sbhd"),
    max_head_dim=512,
    head_dim_v_differs=True,
    windows=True,
    lse=False,
    max_seqlen=1024,
)
_CPU_FLASH_CAPS = Capabilities(
    dtypes=("bfloat16", "float16", "float32"),
    qkv_formats=("bshd", "sbhd"),
    max_head_dim=512,
    head_dim_v_differs=False,
    windows=True,
    lse=True,
    max_seqlen=1024,
)


def _cuda_caps(kernel: str) -> Capabilities:
    if kernel == "math":
        return Capabilities(
            dtypes=("bfloat16", "float16", "float32"),
            qkv_formats=("bshd", "sbhd"),
            max_head_dim=512,
            head_dim_v_differs=True,
            windows=True,
            lse=False,
            max_seqlen=2048,
        )
    if kernel == "flash":
        return Capabilities(
            dtypes=("bfloat16", "float16"),
            qkv_formats=("bshd", "sbhd"),
            max_head_dim=256,
            head_dim_multiple=8,
            windows=False,
            causal_alignments=("top_left",),
            lse=True,
        )
    if kernel == "efficient":
        return Capabilities(
            dtypes=("bfloat16", "float16", "float32"),
            qkv_formats=("bshd", "sbhd"),
            max_head_dim=512,
            head_dim_multiple=8,
            head_dim_v_differs=True,
            windows=True,
            lse=True,
        )
    return Capabilities(  # cudnn
        dtypes=("bfloat16", "float16"),
        qkv_formats=("bshd", "sbhd"),
        max_head_dim=128,
        head_dim_multiple=8,
        windows=False,
        causal_alignments=("top_left",),
        lse=True,
    )


_CUDA_DESIGNS = {
    "math": TORCH_MATH_DESIGN,
    "flash": TORCH_FLASH_DESIGN,
    "efficient": TORCH_EFFICIENT_DESIGN,
    "cudnn": CUDNN_DESIGN,
}
"""The design of each CUDA SDPA kernel."""


def builtin_backends() -> list[Backend]:
    """The PyTorch backends: two on CPU, five on CUDA (their ``availability`` says why not here)."""
    cpu = [
        SDPABackend(
            "torch-cpu-math", "cpu", "math", _CPU_CAPS, ("is_causal", "bool_mask", "float_mask", "causal_bias"),
            design=TORCH_MATH_DESIGN,
        ),
        SDPABackend(
            "torch-cpu-flash",
            "cpu",
            "flash",
            _CPU_FLASH_CAPS,
            ("is_causal", "bool_mask", "causal_bias", "aten_lse"),
            masked_row_lse=0.0,
            design=TORCH_CPU_FLASH_DESIGN,
        ),
    ]
    cuda = []
    for kernel in ("math", "flash", "efficient", "cudnn"):
        # the CUDA flash kernel takes no mask tensor: bool_mask and float_mask would never run
        # (292 unsupported results of 757 in one H200 campaign, 2026-12-01)
        variants = ("is_causal", "causal_bias") if kernel == "flash" else ("is_causal", "bool_mask", "float_mask", "causal_bias")
        if kernel != "math":
            variants += ("aten_lse",)
        design = _CUDA_DESIGNS[kernel]
        cuda.append(SDPABackend(f"torch-sdpa-{kernel}", "cuda", kernel, _cuda_caps(kernel), variants, design=design))
    return cpu + cuda + [FlexBackend()]
