"""Context parallelism (CP): moving tensors between the full canonical layout and the ranks'
shards, exactly and in both directions.

The layout itself (which tokens rank ``r`` holds: "dual chunk swap", the thd padding to multiples
of ``2 cp_size``, the errors) is index arithmetic in `fuzzer.backends.cp_layout`; the contract a CP
backend implements (`CPShardInputs`, `CPProcessGroups`, `CPBackend`) is in `fuzzer.backends.base`;
judging a CP run is `fuzzer.cp.judge`. Here:

* ``bshd``/``sbhd`` (canonical ``[batch_size, seqlen, heads, dim]`` for both): the split runs along
  the sequence dim of the canonical layout.
* ``thd`` (packed ``[total, heads, dim]`` with ``cu_seqlens``): a rank's shard is ``[chunk r of seq
  0, chunk 2n-1-r of seq 0, chunk r of seq 1, ...]``, ``sum(seqlens_padded) / cp_size`` tokens.
  **Padding tokens**: `shard` fills them with zeros (q, k, v and dout alike); they belong to their
  sequence's range in ``cu_seqlens_*_padded`` but lie beyond its real length in ``cu_seqlens_*``,
  so no query row sees them and no real row's output depends on them. `gather` drops them: the
  gathered tensor holds only the real tokens, in the canonical order, and whatever a backend
  wrote at padding positions (TE writes zeros) is never judged.
* ``lse`` (``[batch_size, num_heads, seqlen_q]`` / ``[num_heads, total_q]``) is split along its
  last dim with the query layout.
* ``cp_size == 1`` is the identity (no padding): a case without CP.

`shard` and `gather` are exact inverses on real tokens (`tests/fuzzer/test_cp.py`); `shard_inputs`
and `gather_outputs` apply them to a case's inputs and a backend's outputs.

Source: NVIDIA/TransformerEngine ``tests/pytorch/attention/run_attention_with_cp.py`` (how the
test shards and un-permutes ``tensors_cp``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fuzzer.backends.base import BackendOutput, CPShardInputs
from fuzzer.backends.cp_layout import (
    CP_LAYOUT,
    K_SIDE,
    Q_SIDE,
    CPShardError,
    check_cp_size,
    cp_seqlens,
    shard_layout,
)
from oracle.config import AttentionCase


def _side_of(name: str) -> str:
    if name in Q_SIDE:
        return "q"
    if name in K_SIDE:
        return "k"
    raise CPShardError("name", f"unknown tensor name {name!r} (allowed: {', '.join(Q_SIDE + K_SIDE)})")


def _seq_dim(case: AttentionCase, name: str, ndim: int) -> int:
    if name == "lse":
        return ndim - 1  # [b, h, s] or [h, t]
    return 0 if case.is_varlen else 1  # [t, h, d] or [b, s, h, d]


def _full_len(case: AttentionCase, side: str) -> int:
    if case.is_varlen:
        return case.total_q if side == "q" else case.total_k
    return case.seqlen_q if side == "q" else case.seqlen_k


def shard(tensor: torch.Tensor, case: AttentionCase, cp_size: int, rank: int, *, name: str) -> torch.Tensor:
    """Rank ``rank``'s part of a full canonical tensor.

    Args:
        tensor: the full tensor in the canonical layout of ``name``: q/k/v/dout/out/dq/dk/dv
            ``[batch_size, seqlen, heads, dim]`` (thd ``[total, heads, dim]``), lse
            ``[batch_size, num_heads, seqlen_q]`` (thd ``[num_heads, total_q]``); any dtype/device.
        case: the case.
        cp_size: number of ranks.
        rank: this rank.
        name: the tensor's name (selects side and sequence dim).

    Returns:
        The local tensor: same dims, sequence dim ``local_len`` (see `shard_layout`), same dtype
        and device; padding tokens are 0.

    Raises:
        CPShardError: unknown ``name``, the sequence dim of ``tensor`` is not the case's full
            length, or as `shard_layout`.
    """
    side = _side_of(name)
    layout = shard_layout(case, cp_size, rank, side)
    dim = _seq_dim(case, name, tensor.dim())
    want = _full_len(case, side)
    if tensor.dim() <= dim or tensor.shape[dim] != want:
        raise CPShardError(name, f"has shape {tuple(tensor.shape)}; dim {dim} must be the full length {want}")
    index = layout.index.to(tensor.device)
    local = tensor.index_select(dim, index.clamp(min=0))
    if not bool(layout.is_real.all()):
        shape = [1] * local.dim()
        shape[dim] = -1
        local = local.masked_fill(~layout.is_real.to(tensor.device).view(shape), 0)
    return local


def gather(shards: Sequence[torch.Tensor], case: AttentionCase, cp_size: int, *, name: str) -> torch.Tensor:
    """The full canonical tensor from every rank's part: the exact inverse of `shard` on real
    tokens; padding tokens are dropped.

    Args:
        shards: ``cp_size`` local tensors, rank order, as `shard` returns them (same dtype and
            device, equal non-sequence dims).
        case: the case.
        cp_size: number of ranks.
        name: the tensor's name.

    Returns:
        The full tensor (canonical layout of ``name``), dtype and device of ``shards[0]``.

    Raises:
        CPShardError: wrong number of shards, a shard whose sequence dim is not its rank's
            ``local_len`` or whose other dims, dtype or device differ from rank 0's, or as
            `shard_layout`.
    """
    check_cp_size(cp_size)
    side = _side_of(name)
    if len(shards) != cp_size:
        raise CPShardError(name, f"got {len(shards)} shards for cp_size={cp_size}")
    first = shards[0]
    dim = _seq_dim(case, name, first.dim())
    shape = list(first.shape)
    shape[dim] = _full_len(case, side)
    full = first.new_zeros(shape)
    for rank, local in enumerate(shards):
        layout = shard_layout(case, cp_size, rank, side)
        rest_ok = local.dim() == first.dim() and all(
            local.shape[d] == first.shape[d] for d in range(first.dim()) if d != dim
        )
        if not rest_ok or local.shape[dim] != layout.local_len:
            raise CPShardError(
                name,
                f"rank {rank} returned shape {tuple(local.shape)}; expected dim {dim} = {layout.local_len} "
                f"and the other dims of rank 0's {tuple(first.shape)}",
            )
        if local.dtype != first.dtype or local.device != first.device:
            raise CPShardError(
                name, f"rank {rank} returned {local.dtype} on {local.device}, rank 0 {first.dtype} on {first.device}"
            )
        real = layout.is_real.nonzero().flatten().to(local.device)
        full.index_copy_(dim, layout.index.to(local.device).index_select(0, real), local.index_select(dim, real))
    return full


def shard_inputs(case: AttentionCase, inputs: Any, cp_size: int, rank: int) -> CPShardInputs:
    """Rank ``rank``'s `CPShardInputs` from the full `oracle.inputs.AttentionInputs` of ``case``.

    Raises:
        CPShardError: as `shard`.
    """
    return CPShardInputs(
        q=shard(inputs.q, case, cp_size, rank, name="q"),
        k=shard(inputs.k, case, cp_size, rank, name="k"),
        v=shard(inputs.v, case, cp_size, rank, name="v"),
        dout=shard(inputs.dout, case, cp_size, rank, name="dout"),
        rank=rank,
        cp_size=cp_size,
        seqlens=cp_seqlens(case, cp_size),
    )


def gather_outputs(case: AttentionCase, cp_size: int, outputs: Sequence[BackendOutput]) -> BackendOutput:
    """Every rank's local `BackendOutput` gathered into one in the full canonical layout.

    lse and each gradient are gathered when every rank returned one, else left None;
    ``selected_kernel`` and ``extra`` come from rank 0 (``extra`` gains ``cp_layout``);
    ``compile_ms`` is the largest over the ranks.

    Raises:
        CPShardError: a rank returned no ``out``, or a tensor of the wrong local shape (see `gather`).
    """
    if len(outputs) != cp_size:
        raise CPShardError("outputs", f"got {len(outputs)} outputs for cp_size={cp_size}")
    gathered: dict[str, Any] = {}
    for name in ("out", "lse", "dq", "dk", "dv"):
        parts = [getattr(o, name) for o in outputs]
        if name == "out" and any(p is None for p in parts):
            raise CPShardError("out", f"rank {[p is None for p in parts].index(True)} returned no out")
        gathered[name] = gather(parts, case, cp_size, name=name) if all(p is not None for p in parts) else None
    extra = dict(outputs[0].extra)
    extra["cp_layout"] = CP_LAYOUT
    return BackendOutput(
        **gathered,
        selected_kernel=outputs[0].selected_kernel,
        compile_ms=max(o.compile_ms for o in outputs),
        extra=extra,
    )


__all__ = [
    "gather",
    "gather_outputs",
    "shard",
    "shard_inputs",
]
