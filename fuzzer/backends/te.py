"""TransformerEngine adapters: ``transformer_engine.pytorch.DotProductAttention``, one per sub-backend.

One idea (the module is over 600 lines): the TransformerEngine adapter: TE's own names, encodings
and sub-backend selection appear here and nowhere else.

TE picks one of its sub-backends per call (``get_attention_backend``): FlashAttention (FA2, FA3 or
FA4, whichever is installed and allowed), FusedAttention (cuDNN) or UnfusedDotProductAttention.
Each adapter here stands for one sub-backend, forces it through TE's documented environment
variables (read with ``os.environ.get`` on every selection), runs in its own child process
(``environment``), and checks afterwards which sub-backend TE really ran, so that no result is
attributed to the wrong kernel.

TE conventions (read in transformer-engine 2.20.2):

* ``DotProductAttention(num_attention_heads, kv_channels, num_gqa_groups=None,
  attention_dropout=0.0, qkv_format="sbhd", attn_mask_type="causal", window_size=None,
  bottom_right_diagonal=None, softcap=0.0, ..., softmax_scale=None)``; ``kv_channels`` is
  ``head_dim`` or ``(head_dim, head_dim_v)``. ``forward(q, k, v, ..., qkv_format, cu_seqlens_q,
  cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, attn_mask_type, window_size, bottom_right_diagonal,
  softcap, ...)`` may override the mask settings per call. Output heads are flattened:
  ``[b, s, h * d_v]`` (bshd), ``[s, b, h * d_v]`` (sbhd), ``[t, h * d_v]`` (thd). No LSE is
  returned, so every TE adapter declares ``lse=False`` and returns ``lse=None``.
* ``attention_type`` (constructor, default ``"self"``): for thd padding masks
  UnfusedDotProductAttention builds the key mask from ``cu_seqlens_q`` alone unless it is
  ``"cross"`` (``utils.py`` ``get_padding_mask``/``get_full_mask``), so cases whose per-sequence
  query and key lengths differ pass ``attention_type="cross"``, as a cross-attention caller does.
* ``attn_mask_type``: ``no_mask``, ``causal`` (top-left), ``causal_bottom_right``, and for thd
  ``padding``, ``padding_causal``, ``padding_causal_bottom_right`` (thd requires a padding type).
* ``window_size`` uses ``-1`` for an unbounded side; ``check_set_window_size`` normalises causal
  masks to ``(-1, 0)`` or ``(left, 0)`` and others to ``(-1, -1)`` or ``(left >= 0, right >= 0)``
  and asserts on anything else (so one-sided non-causal windows cannot be expressed). Window
  alignment follows the mask type for causal masks and ``bottom_right_diagonal`` (default
  bottom-right) otherwise.
* thd without ``max_seqlen_q/kv`` rounds the maxima up to a multiple of 64, so they are passed.
* FlashAttention in TE is bottom-right only: TE disables it for ``causal``/``padding_causal`` and
  for top-left windows when ``max_seqlen_q != max_seqlen_kv``. TE does not pass softcap to FA4,
  and FusedAttention has no softcap (``utils.py`` "Filter: softcap").
* TE 2.20.2 passes its ``(-1, 0)`` causal window to ``flash_attn_func_v4`` unchanged
  (``backends.py`` ``FlashAttention.forward``), which flash-attn-4 >= 4.0.0b30 reads as an empty
  band: the seed bug. TE imports ``_validate_head_dims`` from FA4, so FA4 builds before 4.0.0b11
  are not loaded by TE at all.

Selection control and detection:

* Environment (``utils.py`` ``get_attention_backend``): ``NVTE_FLASH_ATTN`` (all FlashAttention),
  ``NVTE_FLASH_ATTN_V2``, ``NVTE_FLASH_ATTN_V3``, ``NVTE_FLASH_ATTN_V4``, ``NVTE_FUSED_ATTN``,
  ``NVTE_UNFUSED_ATTN`` (1 = allowed, default 1). With every other sub-backend off, TE raises
  ValueError "No dot product attention backend is available" instead of falling back. On SM90 TE
  prefers FA3 over FA4, hence ``NVTE_FLASH_ATTN_V3=0`` for te-fa4; on SM90+ it prefers
  FusedAttention over FlashAttention when both are eligible, hence ``NVTE_FUSED_ATTN=0`` there.
  ``NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2`` logs "Selected backend = ..." (not needed here). The
  selection is cached per attention parameters, so each call applies the adapter's ``env_vars``
  and sets ``backend_selection_requires_update`` (`TEBackend._selection_forced`): correct even
  when several TE adapters share one process.
* TE imports FlashAttention 2/4 once, at import, and only *warns* when that fails (e.g. FA4
  4.0.0b24 with nvidia-cutlass-dsl < 4.6.2, or flash-attn outside ``[2.1.1, 2.8.4)``); then
  ``FlashAttentionUtils.v4_is_installed``/``is_installed`` stays False and `availability` says so
  instead of every case ending in "No dot product attention backend".
* Detection: the module global ``_attention_backends`` in ``dot_product_attention.py``
  (keys ``use_flash_attention``, ``flash_attention_backend`` (a ``packaging`` Version, major 2/3/4),
  ``use_fused_attention``, ``fused_attention_backend`` (cuDNN sub-backend, an int in 2.20),
  ``use_unfused_attention``) is updated by ``DotProductAttention.forward`` whenever the attention
  parameters change; it is read right after each forward. ``selected_kernel`` uses TE's own
  wording ("FlashAttention (4.0.0b36)", "FusedAttention (sub-backend 1)",
  "UnfusedDotProductAttention").

Variants (TE's own encodings of one mask):

* ``mask_type``: the mask only through the constructor's ``attn_mask_type``; ``window_size`` only
  when the case has a real sliding window (TE fills in ``(-1, 0)`` / ``(-1, -1)`` itself). The most
  common caller (e.g. Megatron without sliding windows).
* ``explicit_window``: ``attn_mask_type`` plus an explicit ``window_size`` in TE's ``-1`` encoding
  always, ``(-1, 0)`` / ``(-1, -1)`` included. For windowed cases it is the same call as
  ``mask_type`` and so reported unsupported.
* ``forward_args``: a constructor with TE's defaults (``attn_mask_type="causal"``), and
  ``attn_mask_type``, ``window_size`` (explicit), ``bottom_right_diagonal`` and ``softcap`` passed to
  ``forward`` instead.

Non-causal top-left windows add ``bottom_right_diagonal=False``; softcap is passed only when set.

Context parallelism (``case.cp_size > 1``; `TEBackend.run_cp`, run on every rank by
`fuzzer.cp.executor.CPExecutor`):

* each rank gets its dual-chunk-swap shard (`fuzzer.backends.cp_layout`), calls
  ``DotProductAttention.set_context_parallel_group(cp_group, cp_global_ranks, cp_stream,
  cp_comm_type)`` once per module (`te_cp_group_args`; for ``a2a+p2p`` ``cp_group`` is the list
  ``[a2a pair group, p2p ring group]``) and runs forward and backward on its shard; TE returns the
  local out (no lse) and q/k/v gradients of the shard;
* thd passes the *global* ``cu_seqlens_q``/``cu_seqlens_kv`` (real lengths) and
  ``cu_seqlens_q_padded``/``cu_seqlens_kv_padded`` (lengths padded to multiples of ``2 cp_size``)
  on every rank, with ``max_seqlen_q``/``max_seqlen_kv`` the largest padded length
  (`te_cp_forward_kwargs`); when no sequence needs padding the padded tensors are the very same
  objects as the unpadded ones, which is how TE infers ``pad_between_seqs=False``
  (`te_cp_tensor_kwargs`); bshd/sbhd pass nothing extra (TE multiplies the local length by
  ``cp_size``);
* `te_cp_unsupported_reasons` lists TE's CP limits (``get_attention_backend`` "Filter: Context
  parallelism", ``attn_forward_func_with_cp`` assertions, and the skips of
  ``tests/pytorch/attention/test_attention_with_cp.py``): no UnfusedDotProductAttention, no
  ``causal_bottom_right``, no causal cross-attention, sliding windows only with ``all_gather`` and
  ``a2a``, ``head_dim != head_dim_v`` only with ``p2p``/``a2a+p2p`` and not on FusedAttention,
  FlashAttention neither with sbhd nor with thd sequences that need padding, thd neither with
  ``a2a+p2p`` nor (FlashAttention 2/4) with ``all_gather``. Softcap and windows in cross-attention
  under CP are not declared (TE's CP tests cover neither).

Source: NVIDIA/TransformerEngine ``transformer_engine/pytorch/attention/dot_product_attention/
dot_product_attention.py``, ``utils.py``, ``backends.py`` and ``transformer_engine/pytorch/
constants.py`` (transformer-engine 2.20.2 wheel).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, ClassVar

from fuzzer.backends._common import (
    CUDNN_DESIGN,
    FA2_DESIGN,
    FA4_DESIGN,
    CompileTimer,
    cuda_arch_major,
    describe_call,
    distribution_version,
    fit_to_signature,
    is_one_sided_window,
)
from fuzzer.backends.base import (
    Backend,
    BackendOutput,
    Capabilities,
    CPProcessGroups,
    CPShardInputs,
    DeclarationGapError,
    ReproCall,
    UnsupportedCaseError,
    alignment_irrelevant,
    environment_set,
    run_with_grad,
)
from fuzzer.backends.fa4 import fa4_build_mismatch, fa4_imported_build, fa4_sm90_backward_reasons
from fuzzer.backends.cp_layout import CPSeqlens, cp_unsupported_reasons
from oracle.config import AttentionCase
from oracle.design import Claim, Design

TE_MODULE = "transformer_engine.pytorch"
TE_DPA_MODULE = "transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention"
TE_UTILS_MODULE = "transformer_engine.pytorch.attention.dot_product_attention.utils"
TE_VARIANTS = ("mask_type", "explicit_window", "forward_args")
TE_PACKAGES = (
    "transformer-engine",
    "transformer-engine-torch",
    "transformer-engine-cu12",
    "transformer-engine-cu13",
    "torch",
)
TE_NO_BACKEND_MESSAGE = "No dot product attention backend is available"
#: Keywords whose loss would change the mask or the inputs.
TE_ESSENTIAL_KWARGS = frozenset(
    {
        "attn_mask_type",
        "attention_type",
        "window_size",
        "bottom_right_diagonal",
        "softcap",
        "softmax_scale",
        "num_gqa_groups",
        "qkv_format",
        "cu_seqlens_q",
        "cu_seqlens_kv",
        "max_seqlen_q",
        "max_seqlen_kv",
    }
)
_MINUS1 = -1  # TE's "unbounded" sentinel


# ---------------------------------------------------------------------------- pure translation
def te_attn_mask_type(case: AttentionCase) -> str:
    """TE's ``attn_mask_type`` for the case's causal flag, alignment and layout.

    bshd/sbhd: ``no_mask``, ``causal`` (top-left), ``causal_bottom_right``; thd: the ``padding``
    forms of the same (TE requires a padding type for thd).
    """
    if not case.causal:
        mask = "no_mask"
    elif case.causal_alignment == "top_left":
        mask = "causal"
    else:
        mask = "causal_bottom_right"
    if case.is_varlen:
        mask = "padding" if mask == "no_mask" else f"padding_{mask}"
    return mask


def te_window_size(case: AttentionCase) -> tuple[int, int]:
    """The case's window in TE's normalised ``-1`` encoding (``check_set_window_size`` output).

    Raises:
        ValueError: a one-sided non-causal window, which TE cannot express.
    """
    left = _MINUS1 if case.window_size_left is None else case.window_size_left
    if case.causal:
        return (left, 0)
    if is_one_sided_window(case):
        raise ValueError(
            "TE window_size must be (-1, -1) or (>= 0, >= 0) for a non-causal mask (check_set_window_size)"
        )
    right = _MINUS1 if case.window_size_right is None else case.window_size_right
    return (left, right)


def _has_window(case: AttentionCase) -> bool:
    return case.window_size_left is not None or case.window_size_right is not None


def _mask_kwargs(case: AttentionCase, explicit_window: bool) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"attn_mask_type": te_attn_mask_type(case)}
    if explicit_window or _has_window(case):
        kwargs["window_size"] = te_window_size(case)
    if _has_window(case) and not case.causal and case.causal_alignment == "top_left":
        kwargs["bottom_right_diagonal"] = False
    if case.softcap is not None:
        kwargs["softcap"] = case.softcap
    return kwargs


def te_module_kwargs(case: AttentionCase, variant: str) -> dict[str, Any]:
    """The ``DotProductAttention(...)`` constructor keywords for ``case`` under ``variant``.

    Raises:
        ValueError: unknown variant, or a mask TE cannot express (see `te_window_size`).
    """
    if variant not in TE_VARIANTS:
        raise ValueError(f"unknown TE variant {variant!r}; expected one of {TE_VARIANTS}")
    kwargs: dict[str, Any] = {
        "num_attention_heads": case.num_heads,
        "kv_channels": case.head_dim if case.head_dim == case.head_dim_v else (case.head_dim, case.head_dim_v),
        "num_gqa_groups": case.num_heads_kv,
        "attention_dropout": 0.0,
        "qkv_format": case.qkv_format,
        "softmax_scale": case.softmax_scale,
    }
    if te_is_cross_attention(case):
        # TE's default "self" builds a thd padding mask from cu_seqlens_q alone for q *and* kv
        # (utils.py get_padding_mask / get_full_mask), wrong for UnfusedDotProductAttention once
        # the kv lengths differ. A real cross-attention caller says "cross".
        kwargs["attention_type"] = "cross"
    if variant == "forward_args":
        te_window_size(case)  # raise for masks TE cannot express, as the other variants do
        return kwargs
    kwargs.update(_mask_kwargs(case, explicit_window=variant == "explicit_window"))
    return kwargs


def te_is_cross_attention(case: AttentionCase) -> bool:
    """Whether some sequence has a different query and key length (TE's ``attention_type="cross"``)."""
    return not alignment_irrelevant(case)


def te_forward_kwargs(case: AttentionCase, variant: str) -> dict[str, Any]:
    """The non-tensor ``forward(...)`` keywords (``cu_seqlens_q/kv`` are added at call time).

    Raises:
        ValueError: as `te_module_kwargs`.
    """
    if variant not in TE_VARIANTS:
        raise ValueError(f"unknown TE variant {variant!r}; expected one of {TE_VARIANTS}")
    kwargs: dict[str, Any] = {}
    if case.is_varlen:
        kwargs["max_seqlen_q"] = case.seqlen_q
        kwargs["max_seqlen_kv"] = case.seqlen_k
    if variant == "forward_args":
        kwargs.update(_mask_kwargs(case, explicit_window=True))
    else:
        te_window_size(case)
    return kwargs


def te_variant_reasons(case: AttentionCase, variant: str) -> list[str]:
    """Why ``variant`` has no distinct TE encoding of ``case`` (empty = it has one)."""
    if variant not in TE_VARIANTS:
        return []
    try:
        mine = (te_module_kwargs(case, variant), te_forward_kwargs(case, variant))
    except ValueError as exc:
        return [str(exc)]
    for earlier in TE_VARIANTS[: TE_VARIANTS.index(variant)]:
        if (te_module_kwargs(case, earlier), te_forward_kwargs(case, earlier)) == mine:
            return [f"{variant}: sends the same call as variant {earlier!r} for this case"]
    return []


def _is_sliding_window(case: AttentionCase) -> bool:
    """TE's ``sliding_window_attn``: a window other than ``(-1, 0)`` and ``(-1, -1)``."""
    return _has_window(case) and te_window_size(case) not in ((_MINUS1, 0), (_MINUS1, _MINUS1))


def te_cp_unsupported_reasons(case: AttentionCase, sub_backend: str) -> list[str]:
    """Why TE cannot run ``case`` under context parallelism on ``sub_backend`` (empty = it can).

    Args:
        case: a case; nothing is reported for ``cp_size == 1``.
        sub_backend: ``"flash4"``, ``"flash2"``, ``"fused"`` or ``"unfused"``.

    Returns:
        The layout limits (`fuzzer.backends.cp_layout.cp_unsupported_reasons`) and TE's own (module docstring).
    """
    if case.cp_size == 1:
        return []
    comm = case.cp_comm_type
    flash = sub_backend in ("flash4", "flash2")
    reasons = list(cp_unsupported_reasons(case))
    if sub_backend == "unfused":
        reasons.append("TE disables UnfusedDotProductAttention under context parallelism")
    cross = te_is_cross_attention(case)
    if case.causal and case.causal_alignment == "bottom_right":
        reasons.append("TE has no context parallelism for causal_bottom_right masks")
    if case.causal and cross:
        reasons.append("TE has no context parallelism for causal cross-attention (seqlen_q != seqlen_k)")
    if _has_window(case):
        try:
            sliding = _is_sliding_window(case)
        except ValueError:
            sliding = False  # TE cannot express the window at all: te_variant_reasons says so
        if sliding and comm not in ("all_gather", "a2a"):
            reasons.append(f"TE supports sliding windows under context parallelism only with all_gather and a2a, not {comm}")
        if cross:
            reasons.append("windows in cross-attention under context parallelism are not declared (TE's CP tests cover none)")
    if case.softcap is not None:
        reasons.append("softcap under context parallelism is not declared (TE's CP paths do not take it)")
    if case.head_dim != case.head_dim_v:
        if "p2p" not in comm:
            reasons.append(
                f"TE supports head_dim != head_dim_v (MLA) under context parallelism only with p2p and a2a+p2p, not {comm}"
            )
        if sub_backend == "fused":
            reasons.append("TE FusedAttention has no context parallelism with head_dim != head_dim_v (MLA)")
    if case.qkv_format == "sbhd" and flash:
        reasons.append("TE's FlashAttention has no context parallelism for sbhd")
    if case.is_varlen:
        if comm == "a2a+p2p":
            reasons.append("TE's a2a+p2p context parallelism does not support thd")
        if flash and comm == "all_gather":
            reasons.append("TE's thd + all_gather context parallelism needs FlashAttention 3 (seqused_k)")
        unit = 2 * case.cp_size
        if flash and any(n % unit for n in case.seqlens_q_list + case.seqlens_k_list):
            reasons.append(
                f"TE's FlashAttention under context parallelism needs thd sequences without padding "
                f"(every length a multiple of 2 * cp_size = {unit})"
            )
    return reasons


def te_cp_forward_kwargs(case: AttentionCase, variant: str, seqlens: CPSeqlens) -> dict[str, Any]:
    """The non-tensor ``forward(...)`` keywords of one rank's CP call (`te_forward_kwargs`, with
    thd's ``max_seqlen_q``/``max_seqlen_kv`` the largest *padded* lengths).

    Raises:
        ValueError: as `te_module_kwargs`.
    """
    kwargs = te_forward_kwargs(case, variant)
    if case.is_varlen:
        kwargs["max_seqlen_q"] = seqlens.max_seqlen_q
        kwargs["max_seqlen_kv"] = seqlens.max_seqlen_k
    return kwargs


def te_cp_tensor_kwargs(case: AttentionCase, seqlens: CPSeqlens, device: Any) -> dict[str, Any]:
    """The varlen tensors of one rank's CP call, on ``device``: for thd the global
    ``cu_seqlens_q``, ``cu_seqlens_kv``, ``cu_seqlens_q_padded``, ``cu_seqlens_kv_padded``
    (``[batch_size + 1] int32``); nothing for bshd/sbhd.

    When no sequence needs padding (every length already a multiple of ``2 * cp_size``), the
    padded tensors *are* the unpadded ones (the same objects): TE 2.20 infers
    ``pad_between_seqs`` from ``cu_seqlens_q_padded is cu_seqlens_q and cu_seqlens_kv_padded is
    cu_seqlens_kv`` (``DotProductAttention.forward``) and otherwise disables FlashAttention 2 and
    sends FlashAttention 4 down its ``seqused`` path.
    """
    if not case.is_varlen:
        return {}
    cu_q, cu_kv = seqlens.cu_seqlens_q.to(device), seqlens.cu_seqlens_k.to(device)
    if _same_values(seqlens.cu_seqlens_q, seqlens.cu_seqlens_q_padded) and _same_values(
        seqlens.cu_seqlens_k, seqlens.cu_seqlens_k_padded
    ):
        cu_q_padded, cu_kv_padded = cu_q, cu_kv
    else:
        cu_q_padded = seqlens.cu_seqlens_q_padded.to(device)
        cu_kv_padded = seqlens.cu_seqlens_k_padded.to(device)
    return {
        "cu_seqlens_q": cu_q,
        "cu_seqlens_kv": cu_kv,
        "cu_seqlens_q_padded": cu_q_padded,
        "cu_seqlens_kv_padded": cu_kv_padded,
    }


def _same_values(a: Any, b: Any) -> bool:
    """Same shape and values (CPU tensors of the CP metadata)."""
    return tuple(a.shape) == tuple(b.shape) and bool((a == b).all())


def te_cp_group_args(case: AttentionCase, groups: CPProcessGroups) -> tuple[Any, list[int], Any, str]:
    """The arguments of ``DotProductAttention.set_context_parallel_group``:
    ``(cp_group, cp_global_ranks, cp_stream, cp_comm_type)``.

    ``cp_group`` is the CP group, or for ``a2a+p2p`` the two-level list ``[a2a_group, p2p_group]``
    (TE: "Hierarchical CP implementation needs multi-level CP groups").

    Raises:
        ValueError: ``case.cp_size == 1``, a group of another size, or ``a2a+p2p`` without
            the two-level groups.
    """
    if case.cp_size == 1:
        raise ValueError("cp_size: set_context_parallel_group is for cp_size > 1")
    if groups.cp_size != case.cp_size:
        raise ValueError(f"cp_size: the case has {case.cp_size}, the process group {groups.cp_size}")
    cp_group: Any = groups.group
    if case.cp_comm_type == "a2a+p2p":
        if groups.a2a_group is None or groups.p2p_group is None:
            raise ValueError("cp_comm_type: a2a+p2p needs the a2a and p2p groups (even cp_size >= 4)")
        cp_group = [groups.a2a_group, groups.p2p_group]
    return cp_group, list(groups.global_ranks), groups.stream, case.cp_comm_type


def _major(version: Any) -> int | None:
    major = getattr(version, "major", None)
    if isinstance(major, int):
        return major
    text = str(version)
    digits = text.split(".", 1)[0]
    return int(digits) if digits.isdigit() else None


def te_selected_backend(state: Mapping[str, Any]) -> str | None:
    """TE's name for the sub-backend recorded in ``_attention_backends`` (None if none)."""
    if state.get("use_flash_attention"):
        return f"FlashAttention ({state.get('flash_attention_backend')})"
    if state.get("use_fused_attention"):
        sub = state.get("fused_attention_backend")
        try:
            sub = int(sub)
        except (TypeError, ValueError):
            pass
        return f"FusedAttention (sub-backend {sub})"
    if state.get("use_unfused_attention"):
        return "UnfusedDotProductAttention"
    return None


def te_selection_matches(sub_backend: str, state: Mapping[str, Any]) -> bool:
    """Whether ``_attention_backends`` shows the sub-backend an adapter stands for.

    Args:
        sub_backend: ``"flash4"``, ``"flash2"``, ``"fused"`` or ``"unfused"``.
        state: TE's ``_attention_backends`` after the forward.
    """
    if sub_backend in ("flash4", "flash2"):
        return bool(state.get("use_flash_attention")) and _major(state.get("flash_attention_backend")) == int(
            sub_backend[-1]
        )
    if sub_backend == "fused":
        return bool(state.get("use_fused_attention")) and not state.get("use_flash_attention")
    if sub_backend == "unfused":
        return (
            bool(state.get("use_unfused_attention"))
            and not state.get("use_flash_attention")
            and not state.get("use_fused_attention")
        )
    raise ValueError(f"unknown TE sub-backend {sub_backend!r}")


def to_te_layout(case: AttentionCase, tensor: Any) -> Any:
    """Canonical ``[b, s, h, d]`` to TE's layout: contiguous ``[s, b, h, d]`` for sbhd."""
    return tensor.transpose(0, 1).contiguous() if case.qkv_format == "sbhd" else tensor


def from_te_output(case: AttentionCase, out: Any) -> Any:
    """TE's flattened-heads output to canonical ``[b, s, h, d_v]`` / ``[t, h, d_v]``."""
    heads = (case.num_heads, case.head_dim_v)
    out = out.reshape(*out.shape[: 1 if case.is_varlen else 2], *heads)
    return out.transpose(0, 1) if case.qkv_format == "sbhd" else out


# ---------------------------------------------------------------------------- backends
class TEBackend(Backend):
    """Base for the TE adapters; subclasses fix the sub-backend, env vars and capabilities."""

    variants: ClassVar[tuple[str, ...]] = TE_VARIANTS
    device: ClassVar[str] = "cuda"
    #: ``"flash4"``, ``"flash2"``, ``"fused"`` or ``"unfused"``.
    sub_backend: ClassVar[str] = ""
    #: TE disables FlashAttention for top-left causal masks and windows when seqlen_q != seqlen_k.
    bottom_right_unless_square: ClassVar[bool] = False
    #: Distributions the sub-backend needs besides TE, with the reason given when one is missing.
    requires: ClassVar[tuple[str, ...]] = ()
    #: Smallest compute capability TE allows the sub-backend on.
    min_arch_major: ClassVar[int] = 8

    def __init__(self) -> None:
        self._modules: dict[tuple, Any] = {}
        self._timer = CompileTimer()

    # ------------------------------------------------------------------ discovery
    def quick_availability(self) -> str | None:
        """Packages, CUDA device and architecture, without importing TE."""
        if distribution_version("transformer-engine") is None:
            return "transformer-engine is not installed"
        for package in self.requires:
            if distribution_version(package) is None:
                return f"{package} is not installed, so TE cannot select {self.name}'s sub-backend"
        reason = Backend.availability(self)
        if reason:
            return reason
        major = cuda_arch_major()
        if major is None or major < self.min_arch_major:
            return f"TE allows {self.name} on SM{self.min_arch_major}0 and newer, this GPU is sm{major}x"
        return None

    def availability(self) -> str | None:
        """None when TE and this sub-backend can run here, else why not (imports TE: ask it in
        the backend's child, `fuzzer.executor`)."""
        reason = self.quick_availability()
        if reason:
            return reason
        try:
            importlib.import_module(TE_MODULE)
        except Exception as exc:  # noqa: BLE001
            return f"cannot import {TE_MODULE}: {type(exc).__name__}: {exc}"
        return self._sub_backend_loaded_reason()

    def _sub_backend_loaded_reason(self) -> str | None:
        """Why TE did not load this sub-backend's library although it is installed (else None).

        TE imports FlashAttention once (``backends.py``) and, when that fails or the version is out
        of its range, only warns and leaves ``FlashAttentionUtils.v4_is_installed`` /
        ``is_installed`` False: every call would then end in "No dot product attention backend".
        """
        flag = {"flash4": "v4_is_installed", "flash2": "is_installed"}.get(self.sub_backend)
        if flag is None:
            return None
        try:
            utils = importlib.import_module(TE_UTILS_MODULE)
            loaded = getattr(utils.FlashAttentionUtils, flag)
        except Exception:  # noqa: BLE001 - another TE layout: let the per-call selection check decide
            return None
        if loaded:
            return fa4_build_mismatch() if self.sub_backend == "flash4" else None
        package = self.requires[0] if self.requires else "flash-attn"
        return (
            f"TE did not load {package} {distribution_version(package)} (FlashAttentionUtils.{flag} is False: "
            "TE's import of it failed or the version is outside TE's range; see TE's warning at import)"
        )

    def unsupported_reasons(self, case: AttentionCase, variant: str) -> list[str]:
        """Base checks, TE's FlashAttention alignment filter, and the variant's meaning."""
        reasons = super().unsupported_reasons(case, variant)
        if self.bottom_right_unless_square and case.seqlen_q != case.seqlen_k:
            if case.causal and case.causal_alignment == "top_left":
                reasons.append("TE disables FlashAttention for top-left causal masks when seqlen_q != seqlen_k")
            elif _has_window(case) and case.causal_alignment == "top_left":
                reasons.append("TE disables FlashAttention for top-left sliding windows when seqlen_q != seqlen_k")
        reasons.extend(te_variant_reasons(case, variant))
        reasons.extend(te_cp_unsupported_reasons(case, self.sub_backend))
        return reasons

    def inapplicable_reasons(self, case: AttentionCase, variant: str) -> list[str]:
        """`te_variant_reasons`: the variant cannot encode the mask, or sends an earlier
        variant's call."""
        return te_variant_reasons(case, variant)

    # ------------------------------------------------------------------ execution
    def _module(self, case: AttentionCase, variant: str, dtype: Any, device: Any) -> tuple[Any, dict]:
        te = importlib.import_module(TE_MODULE)
        kwargs = te_module_kwargs(case, variant)
        key = (tuple(sorted(kwargs.items())), str(dtype), str(device))
        if key not in self._modules:
            accepted, _ = fit_to_signature(te.DotProductAttention, kwargs, TE_ESSENTIAL_KWARGS)
            self._modules[key] = te.DotProductAttention(**accepted).to(dtype=dtype, device=device)
        return self._modules[key], kwargs

    def _cp_module(self, case: AttentionCase, variant: str, dtype: Any, groups: CPProcessGroups) -> tuple[Any, dict]:
        """A module of its own per CP configuration, its CP group set once (`te_cp_group_args`)."""
        te = importlib.import_module(TE_MODULE)
        kwargs = te_module_kwargs(case, variant)
        key = (tuple(sorted(kwargs.items())), str(dtype), str(groups.device), "cp", case.cp_size, case.cp_comm_type)
        if key not in self._modules:
            accepted, _ = fit_to_signature(te.DotProductAttention, kwargs, TE_ESSENTIAL_KWARGS)
            module = te.DotProductAttention(**accepted).to(dtype=dtype, device=groups.device)
            module.set_context_parallel_group(*te_cp_group_args(case, groups))
            self._modules[key] = module
        return self._modules[key], kwargs

    def run(self, case: AttentionCase, inputs: Any, variant: str) -> BackendOutput:
        """Run DotProductAttention and verify TE selected this adapter's sub-backend.

        Raises:
            DeclarationGapError: TE found no allowed backend for the case although the adapter
                declares it runnable (recorded as ``error:declaration_gap``, with TE's reasons).
            UnsupportedCaseError: TE refused the case (NotImplementedError), or selected
                another sub-backend than the one this adapter stands for.
            RuntimeError: TE's selection state cannot be read, so the result cannot be attributed.
        """
        module, module_kwargs = self._module(case, variant, inputs.q.dtype, inputs.q.device)
        tensor_kwargs = (
            {"cu_seqlens_q": inputs.cu_seqlens_q, "cu_seqlens_kv": inputs.cu_seqlens_k} if case.is_varlen else {}
        )
        return self._call(
            case, variant, inputs, module, module_kwargs, te_forward_kwargs(case, variant), tensor_kwargs,
            self.kernel_key(case, variant),
        )

    def repro(self, case: AttentionCase, variant: str) -> ReproCall:
        """The exported repro's call: `te_module_kwargs` and `te_forward_kwargs` of the variant,
        under this sub-backend's ``env_vars`` (which pin TE's selection, as in the worker).

        Raises:
            ValueError: the variant cannot encode ``case``.
        """
        required = tuple(TE_REPRO_REQUIRED_MODULES[p] for p in self.requires if p in TE_REPRO_REQUIRED_MODULES)
        return ReproCall(
            source=TE_REPRO_SOURCE,
            values={
                "te_environment": dict(self.env_vars),
                "te_module_kwargs": te_module_kwargs(case, variant),
                "te_forward_kwargs": te_forward_kwargs(case, variant),
                "min_arch_major": self.min_arch_major,
                "required_modules": required,
            },
            packages=("transformer-engine[pytorch]", *self.requires),
            masked_row_lse=self.masked_row_lse,
        )

    def run_cp(self, case: AttentionCase, inputs: CPShardInputs, groups: CPProcessGroups, variant: str) -> BackendOutput:
        """This rank's part of ``case`` under context parallelism (module docstring): local out
        and gradients of the rank's shard, no lse.

        Args:
            case: a case with ``cp_size > 1``.
            inputs: this rank's `fuzzer.backends.base.CPShardInputs` (on ``groups.device``).
            groups: the process groups (`fuzzer.backends.base.CPProcessGroups`).
            variant: one of ``TE_VARIANTS``.

        Raises:
            UnsupportedCaseError, RuntimeError: as `run`.
            ValueError: the groups do not fit the case (`te_cp_group_args`).
        """
        module, module_kwargs = self._cp_module(case, variant, inputs.q.dtype, groups)
        return self._call(
            case, variant, inputs, module, module_kwargs, te_cp_forward_kwargs(case, variant, inputs.seqlens),
            te_cp_tensor_kwargs(case, inputs.seqlens, inputs.q.device),
            (*self.kernel_key(case, variant), "cp", case.cp_size, case.cp_comm_type),
        )

    @contextlib.contextmanager
    def _selection_forced(self, dpa: Any) -> Iterator[None]:
        """This adapter's ``env_vars`` in ``os.environ`` for the call, and a fresh backend selection.

        TE reads ``NVTE_*`` with ``os.environ.get`` on each selection but caches the selection in
        ``_attention_backends`` per attention parameters, so two TE adapters in one process (the
        in-process executor) would otherwise reuse each other's choice. With one child process per
        adapter (the default) the environment is already set and this only re-runs the selection.
        """
        state = getattr(dpa, "_attention_backends", None)
        if isinstance(state, MutableMapping) and "backend_selection_requires_update" in state:
            state["backend_selection_requires_update"] = True
        with environment_set(self.env_vars):
            yield

    def _refusal_reasons(self, call: Any, dpa: Any) -> str:
        """TE's own reasons for disabling each sub-backend, from its selection log: ``call`` is
        repeated once with TE's attention logger at DEBUG (what ``NVTE_DEBUG=1
        NVTE_DEBUG_LEVEL=2`` prints: "Disabling FusedAttention as ...") and the "Disabling" lines
        are returned, ``"; "``-joined ("" when this TE build logs differently)."""
        import logging

        records: list[str] = []

        class _Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                try:
                    message = record.getMessage()
                except Exception:  # noqa: BLE001
                    return
                if "Disabling" in message or "No dot product" in message:
                    records.append(message.strip())

        try:
            utils = importlib.import_module(TE_UTILS_MODULE)
        except Exception:  # noqa: BLE001
            return ""
        logging_state = getattr(utils, "AttentionLogging", None)
        saved_level = getattr(logging_state, "_log_level", None)
        handler = _Keep(level=logging.DEBUG)
        loggers = [logging.getLogger("DotProductAttention"), logging.getLogger(TE_UTILS_MODULE)]
        saved = [(lg, lg.level) for lg in loggers]
        try:
            if logging_state is not None:
                logging_state._log_level = logging.DEBUG  # get_attention_backend sets its logger from it
            for lg in loggers:
                lg.addHandler(handler)
                lg.setLevel(logging.DEBUG)
            with self._selection_forced(dpa):
                call()
        except Exception:  # noqa: BLE001 - the repeat is expected to raise the same refusal
            pass
        finally:
            for lg, level in saved:
                lg.removeHandler(handler)
                lg.setLevel(level)
            if logging_state is not None and saved_level is not None:
                logging_state._log_level = saved_level
        return "; ".join(dict.fromkeys(records))[-1500:]

    def runtime_versions(self) -> dict[str, str]:
        """What TE loaded in this process: ``cudnn`` from TE's own query
        (``transformer_engine.pytorch.utils.get_cudnn_version``, the library FusedAttention
        calls), and the FlashAttention build it imported (``flash_attn_4`` and its module for
        FA4, ``flash_attn`` for FA2). Empty before TE is imported."""
        import sys

        if TE_MODULE not in sys.modules:
            return {}
        from fuzzer.backends._common import format_cudnn_version

        report: dict[str, str] = {}
        for module_name in ("transformer_engine.pytorch.utils", "transformer_engine_torch"):
            try:  # the Python helper gives (major, minor, patch), the extension an int
                report["cudnn"] = format_cudnn_version(importlib.import_module(module_name).get_cudnn_version())
                break
            except Exception:  # noqa: BLE001 - another TE layout: the process map still says
                continue
        report.update(fa4_imported_build())
        fa2 = sys.modules.get("flash_attn")
        if fa2 is not None and getattr(fa2, "__file__", None):
            report["flash_attn"] = str(getattr(fa2, "__version__", "unknown"))
        return report

    def _call(
        self,
        case: AttentionCase,
        variant: str,
        inputs: Any,
        module: Any,
        module_kwargs: dict[str, Any],
        forward_kwargs: dict[str, Any],
        tensor_kwargs: dict[str, Any],
        kernel_key: tuple,
    ) -> BackendOutput:
        """Forward (and backward) through ``module``, checking TE's selection after the forward."""
        dpa = importlib.import_module(TE_DPA_MODULE)
        accepted, _ = fit_to_signature(module.forward, forward_kwargs, TE_ESSENTIAL_KWARGS)
        selected: dict[str, str | None] = {}

        def attention(q: Any, k: Any, v: Any) -> tuple[Any, None]:
            q_, k_, v_ = (to_te_layout(case, t) for t in (q, k, v))
            try:
                with self._selection_forced(dpa):
                    out = module(q_, k_, v_, **tensor_kwargs, **accepted)
            except ValueError as exc:
                if TE_NO_BACKEND_MESSAGE in str(exc):
                    # run() is only called for cases unsupported_reasons accepts: TE refusing one is
                    # a gap in the adapter's declaration (or in TE's), a finding, not "unsupported"
                    why = self._refusal_reasons(lambda: module(q_, k_, v_, **tensor_kwargs, **accepted), dpa)
                    raise DeclarationGapError(
                        f"declaration gap: {self.name} declares this case runnable, but TE found no allowed "
                        f"backend for it ({exc})" + (f"; TE's log: {why}" if why else "")
                    ) from exc
                raise
            except NotImplementedError as exc:
                raise UnsupportedCaseError(f"TE refused the case: {exc}") from exc
            state = getattr(dpa, "_attention_backends", None)
            if not isinstance(state, Mapping):
                raise RuntimeError(
                    f"cannot read {TE_DPA_MODULE}._attention_backends: this TE build's selection is unknown"
                )
            selected["name"] = te_selected_backend(state)
            if not te_selection_matches(self.sub_backend, state):
                raise UnsupportedCaseError(
                    f"TE selected {selected['name']}, not the sub-backend {self.name} stands for"
                )
            return from_te_output(case, out), None

        def once() -> tuple:
            return run_with_grad(attention, case, inputs)

        if self.jit_compiled:  # compiles at first use (FA4 JIT, cuDNN graphs): time it
            (out, lse, dq, dk, dv), compile_ms = self._timer.run(kernel_key, once, inputs.q)
        else:
            (out, lse, dq, dk, dv), compile_ms = once(), 0.0
        extra = {
            "module": describe_call("DotProductAttention", module_kwargs),
            "forward": describe_call("forward", forward_kwargs),
            "transformer_engine_version": distribution_version("transformer-engine") or "unknown",
        }
        if case.cp_size > 1:
            extra["cp"] = f"cp_size={case.cp_size} cp_comm_type={case.cp_comm_type}"
        return BackendOutput(
            out=out,
            lse=lse,
            dq=dq,
            dk=dk,
            dv=dv,
            selected_kernel=selected.get("name"),
            compile_ms=compile_ms,
            extra=extra,
        )


TE_REPRO_REQUIRED_MODULES = {"flash-attn-4": "flash_attn.cute", "flash-attn": "flash_attn"}

TE_REPRO_SOURCE = '''
TE_ENVIRONMENT = $te_environment
TE_MODULE_KWARGS = $te_module_kwargs
TE_FORWARD_KWARGS = $te_forward_kwargs
TE_MIN_ARCH_MAJOR = $min_arch_major
TE_REQUIRED_MODULES = $required_modules


def check_environment():
    require_cuda(None, "TransformerEngine", min_major=TE_MIN_ARCH_MAJOR)
    # TE reads these on every backend selection; they pin the sub-backend the failure was seen on.
    os.environ.update(TE_ENVIRONMENT)
    pytest.importorskip("transformer_engine.pytorch", reason="transformer-engine is not installed")
    for module in TE_REQUIRED_MODULES:
        pytest.importorskip(module, reason=module + " is not installed (TE needs it for this sub-backend)")


def call_backend(q, k, v, cu_seqlens_q, cu_seqlens_k):
    import transformer_engine.pytorch as te

    module = te.DotProductAttention(**TE_MODULE_KWARGS).to(dtype=q.dtype, device=q.device)
    if QKV_FORMAT == "sbhd":
        q, k, v = (t.transpose(0, 1).contiguous() for t in (q, k, v))
    tensors = {"cu_seqlens_q": cu_seqlens_q, "cu_seqlens_kv": cu_seqlens_k} if QKV_FORMAT == "thd" else {}
    out = module(q, k, v, **tensors, **TE_FORWARD_KWARGS)
    out = out.reshape(*out.shape[: 1 if QKV_FORMAT == "thd" else 2], NUM_HEADS, HEAD_DIM_V)
    return (out.transpose(0, 1) if QKV_FORMAT == "sbhd" else out), None
'''
"""`TEBackend.repro`'s source (slots ``te_environment``, ``te_module_kwargs``,
``te_forward_kwargs``, ``min_arch_major``, ``required_modules``)."""

_FLASH_OFF = {"NVTE_FLASH_ATTN": "0"}
TE_CAPABILITIES = Capabilities(
    dtypes=("bfloat16", "float16"),
    qkv_formats=("bshd", "sbhd", "thd"),
    max_head_dim=256,
    head_dim_multiple=8,
    head_dim_v_differs=True,
    gqa=True,
    causal_alignments=("top_left", "bottom_right"),
    windows=True,
    softcap=False,
    backward=True,
    lse=False,
    cp=True,
)
"""What every TE sub-backend shares (`DotProductAttention` takes these for all of them); each
sub-backend's block is this one with its own differences (`dataclasses.replace`)."""


_TE = "transformer-engine 2.20.2 transformer_engine/pytorch/attention/dot_product_attention"
_AUTOGRAD = "PyTorch tools/autograd/derivatives.yaml"
TE_UNFUSED_DESIGN = Design(
    "te-unfused",
    (
        Claim(
            "scores",
            f"{_TE}/backends.py:577-583 and 648-654 (UnfusedDotProductAttention.forward), 697-699 (softcap)",
            "torch.baddbmm(matmul_result, q, k^T, beta=0.0, alpha=scale) into a buffer of the query dtype; a "
            "softcap is cap * tanh(matmul_result / cap) on that dtype tensor",
        ),
        Claim(
            "probs",
            f"{_TE}/softmax.py:354-383 (forward_torch_softmax: softmax of inp.float(), then probs.half() or "
            "probs.bfloat16()), 331-352 (the fused kernels write the dtype); backends.py:775",
            "the probabilities in the dtype for torch.bmm(attention_probs, value) and its backward dV = P^T @ dO",
        ),
        Claim(
            "dp",
            f"{_TE}/backends.py:775; {_AUTOGRAD} (bmm: self: grad.bmm(mat2.transpose(1, 2)))",
            "autograd's dP = dO @ V^T is a bmm of dtype tensors, written in the dtype",
        ),
        Claim(
            "delta_from_dp",
            f"{_TE}/softmax.py:375 (torch.nn.functional.softmax of the float32 scores); {_AUTOGRAD} (_softmax: "
            "_softmax_backward_data); the fused kernels' backward likewise (softmax.py:108-113)",
            "the softmax backward computes dS = P * (dP - rowsum(P * dP)) from the dtype dP, not from the rounded "
            "out: an infinite dP makes the row's dS non-finite",
        ),
        Claim(
            "ds",
            f"{_TE}/softmax.py:358-359 (inp.float(): autograd casts the float32 softmax gradient back to the dtype); "
            "the fused kernels' backward writes the dtype (softmax.py:108-113)",
            "dS in the dtype before the baddbmm backward (times 1 - tanh^2 from the dtype softcap's autograd)",
        ),
        Claim(
            "pre_scale_grads",
            f"{_TE}/backends.py:648-654; {_AUTOGRAD} (baddbmm: batch1: "
            "maybe_multiply(grad.bmm(batch2.transpose(1, 2)), alpha), batch2 likewise)",
            "the gradient of baddbmm's batch1 and batch2 is a dtype bmm of dS, multiplied by alpha = softmax_scale "
            "afterwards",
        ),
        Claim(
            "gqa_grads_per_head",
            f"{_TE}/backends.py:565-575",
            "key_layer.repeat_interleave and value_layer.repeat_interleave in the dtype: every query head's dk and "
            "dv is written in the dtype and autograd sums them over the group",
        ),
    ),
    "TE's unfused attention (plain PyTorch ops in the input dtype): scores, probabilities, dP and dS in the dtype, "
    "D = rowsum(P dP) (autograd's softmax backward), the score GEMM's gradients rounded before the scale, GQA "
    "through repeat_interleave",
)
"""te-unfused. Not claimed: ``probs_for_ds``. TE's fused softmax kernels (taken only where
``FusedScaleMaskSoftmax.is_kernel_available``, ``softmax.py:296-329``, holds: 16 < sk < 16384,
sk % 8 == 0, sq % 4 == 0, batch * heads % 4 == 0, ...) compute dS from the dtype probabilities,
but 246 of 247 fp16/bf16 cases the strategy draws for te-unfused take the framework softmax,
whose backward uses the float32 probabilities (``docs/design-limits.md``)."""


class TEFA4Backend(TEBackend):
    """TE forced onto its FlashAttention 4 path (``flash_attn_func_v4``)."""

    name: ClassVar[str] = "te-fa4"
    environment: ClassVar[str] = "te-fa4"
    design: ClassVar[Design] = FA4_DESIGN  # TE passes k and v unexpanded (backends.py:1211, 1257)
    jit_compiled: ClassVar[bool] = True
    sub_backend: ClassVar[str] = "flash4"
    bottom_right_unless_square: ClassVar[bool] = True
    requires: ClassVar[tuple[str, ...]] = ("flash-attn-4",)
    min_arch_major: ClassVar[int] = 9
    env_vars: ClassVar[dict[str, str]] = {
        "NVTE_FLASH_ATTN": "1",
        "NVTE_FLASH_ATTN_V2": "0",
        "NVTE_FLASH_ATTN_V3": "0",
        "NVTE_FLASH_ATTN_V4": "1",
        "NVTE_FUSED_ATTN": "0",
        "NVTE_UNFUSED_ATTN": "0",
    }
    packages: ClassVar[tuple[str, ...]] = TE_PACKAGES + ("flash-attn-4", "nvidia-cutlass-dsl")
    capabilities: ClassVar[Capabilities] = TE_CAPABILITIES  # softcap: "Disabling FlashAttention 4 as TE does not pass it softcap"

    def unsupported_reasons(self, case: AttentionCase, variant: str) -> list[str]:
        """Adds FA4's SM90 backward limit (GQA/MQA needs head_dim == head_dim_v), which TE 2.20.2
        does not filter: on the H200 it surfaced as an AssertionError from FA4 through TE
        (docs/gpu-campaigns.md, 2026-11-29)."""
        reasons = super().unsupported_reasons(case, variant)
        reasons.extend(fa4_sm90_backward_reasons(case, cuda_arch_major()))
        return reasons


class TEFA2Backend(TEBackend):
    """TE forced onto its FlashAttention 2 path (``flash_attn_func`` of flash-attn 2.x)."""

    name: ClassVar[str] = "te-fa2"
    environment: ClassVar[str] = "te-fa2"
    # TE passes k, v and the softcap to flash_attn_func unchanged (backends.py:1276, 1286)
    design: ClassVar[Design] = FA2_DESIGN
    sub_backend: ClassVar[str] = "flash2"
    bottom_right_unless_square: ClassVar[bool] = True
    requires: ClassVar[tuple[str, ...]] = ("flash-attn",)
    env_vars: ClassVar[dict[str, str]] = {
        "NVTE_FLASH_ATTN": "1",
        "NVTE_FLASH_ATTN_V2": "1",
        "NVTE_FLASH_ATTN_V3": "0",
        "NVTE_FLASH_ATTN_V4": "0",
        "NVTE_FUSED_ATTN": "0",
        "NVTE_UNFUSED_ATTN": "0",
    }
    packages: ClassVar[tuple[str, ...]] = TE_PACKAGES + ("flash-attn",)
    capabilities: ClassVar[Capabilities] = dataclasses.replace(TE_CAPABILITIES, softcap=True)  # flash-attn >= 2.6


class TEFusedBackend(TEBackend):
    """TE forced onto FusedAttention (cuDNN); any cuDNN sub-backend counts."""

    name: ClassVar[str] = "te-fused"
    environment: ClassVar[str] = "te-fused"
    design: ClassVar[Design] = CUDNN_DESIGN  # F16_arbitrary_seqlen: cudnn-frontend sdpa_backward
    sub_backend: ClassVar[str] = "fused"
    jit_compiled: ClassVar[bool] = True  # cuDNN graphs are built at first use
    env_vars: ClassVar[dict[str, str]] = {**_FLASH_OFF, "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "0"}
    packages: ClassVar[tuple[str, ...]] = TE_PACKAGES + ("nvidia-cudnn-cu12", "nvidia-cudnn-cu13")
    capabilities: ClassVar[Capabilities] = TE_CAPABILITIES  # softcap: "Disabling FusedAttention as it does not support softcap"

    def unsupported_reasons(self, case: AttentionCase, variant: str) -> list[str]:
        """Adds cuDNN's refusal of sliding windows with seqlen_q > seqlen_k, of a bottom-right
        causal mask with seqlen_q > seqlen_k outside ``thd`` (cuDNN frontend's SDPA validation:
        bottom-right causal without a padding mask and ``s_q > s_kv`` is "not supported"; TE sends
        ``thd`` with the padding mask), and of ``seqlen_q == seqlen_k == 1`` (the longest sequence
        of each side, for ``thd``).

        The bottom-right rule was measured on the H200 (TE 2.20.2, cuDNN 9.19, 2026-12-02, 4517ce8;
        `benchmarks/gpu/results/2026-12-02-4517ce8-default/manifest.json`): b1 sq2 sk1 bshd
        bottom-right causal gave "Disabling FusedAttention: Bottom right causal mask does not support
        max_s_q > max_s_kv" and no backend, 87 ``error:declaration_gap`` results in the 600 s campaign.

        The second was measured on the H200 (TE 2.20.2, cuDNN 9.19, 2026-12-01): TE answered a
        forward-only b1 sq1 sk1 case with "Disabling FusedAttention: s_q = s_kv = 1 is not
        supported" and no backend, which the fuzzer recorded as ``error:declaration_gap``; the
        rule itself is cuDNN frontend's (SDPA graph validation: ``s_q == 1 && s_kv == 1``)."""
        reasons = super().unsupported_reasons(case, variant)
        if _has_window(case) and case.seqlen_q > case.seqlen_k:
            reasons.append("TE FusedAttention does not support sliding windows with seqlen_q > seqlen_k")
        elif case.causal and case.causal_alignment == "bottom_right" and case.qkv_format != "thd" and case.seqlen_q > case.seqlen_k:
            reasons.append("TE FusedAttention (cuDNN) does not support a bottom-right causal mask with seqlen_q > seqlen_k without padding")
        if case.seqlen_q == 1 and case.seqlen_k == 1:
            reasons.append("TE FusedAttention (cuDNN) does not support seqlen_q = seqlen_k = 1")
        return reasons


class TEUnfusedBackend(TEBackend):
    """TE forced onto UnfusedDotProductAttention (plain PyTorch inside TE)."""

    name: ClassVar[str] = "te-unfused"
    environment: ClassVar[str] = "te-unfused"
    design: ClassVar[Design] = TE_UNFUSED_DESIGN
    sub_backend: ClassVar[str] = "unfused"
    env_vars: ClassVar[dict[str, str]] = {**_FLASH_OFF, "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "1"}
    packages: ClassVar[tuple[str, ...]] = TE_PACKAGES
    capabilities: ClassVar[Capabilities] = dataclasses.replace(
        TE_CAPABILITIES,
        dtypes=("bfloat16", "float16", "float32"),
        max_head_dim=512,
        head_dim_multiple=1,
        softcap=True,
        cp=False,  # "Disabling UnfusedDotProductAttention as it does not support context parallelism"
    )


def builtin_backends() -> list[Backend]:
    """The four TE adapters (te-fa2 included; its availability() says when flash-attn is missing)."""
    return [TEFA4Backend(), TEFusedBackend(), TEUnfusedBackend(), TEFA2Backend()]


__all__ = [
    "TEBackend",
    "TEFA2Backend",
    "TEFA4Backend",
    "TEFusedBackend",
    "TEUnfusedBackend",
    "TE_UNFUSED_DESIGN",
    "TE_VARIANTS",
    "builtin_backends",
    "from_te_output",
    "te_attn_mask_type",
    "te_cp_forward_kwargs",
    "te_cp_group_args",
    "te_cp_tensor_kwargs",
    "te_cp_unsupported_reasons",
    "te_forward_kwargs",
    "te_module_kwargs",
    "te_selected_backend",
    "te_selection_matches",
    "te_variant_reasons",
    "te_window_size",
    "to_te_layout",
]
