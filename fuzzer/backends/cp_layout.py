"""The context-parallel (CP) shard layout as index arithmetic: which tokens each rank holds.

This is the half of the CP backend contract (`fuzzer.backends.base.CPBackend`) that says what a
rank's shard *is*; an adapter that computes masks per rank (`fuzzer.backends.cp_cpu`) reads it
here, and `fuzzer.cp.sharding` moves tensors with it (``shard``/``gather``). Pure functions of the
case, no tensor of the case is touched.

Layout ("dual chunk swap", TE's only CP layout). With ``n = cp_size`` each sequence is cut into
``2 n`` equal chunks and rank ``r`` holds chunks ``r`` and ``2 n - 1 - r``, in that order, so every
rank gets the same share of a causal mask's work. TE applies it to *every* ``attn_mask_type`` and
``qkv_format`` (``attn_forward_func_with_cp``: "DualChunkSwap ... is applied to all attn_mask_types
and all qkv_formats, and it requires sequence lengths to be, or are padded to be, divisible by
(cp_size * 2)"); non-causal masks therefore use it too, not a contiguous split. Example,
``seqlen = 12``, ``cp_size = 2``: rank 0 holds positions ``0 1 2 9 10 11``, rank 1 ``3 4 5 6 7 8``.

* ``bshd``/``sbhd``: ``seqlen_q`` and ``seqlen_k`` must each be multiples of ``2 cp_size`` (TE pads
  nothing here and rejects padding masks under CP), else `CPShardError`.
* ``thd``: every sequence ``b`` is padded at its end to ``seqlens_padded[b] = ceil(seqlens[b] /
  (2 cp_size)) * 2 cp_size`` tokens (`CPSeqlens`: ``cu_seqlens_q_padded``/``cu_seqlens_k_padded``,
  TE's ``cu_seqlens_*_padded``) and split the same way, sequence by sequence.
* ``cp_size == 1`` is the identity (no padding): a case without CP.

`shard_layout` gives, per rank and side (``"q"``: q, dout, out, dq, lse; ``"k"``: k, v, dk, dv), the
canonical index of every local token (``-1`` for padding), its sequence and its position in the
sequence.

Source: NVIDIA/TransformerEngine ``transformer_engine/pytorch/attention/dot_product_attention/
context_parallel.py`` (``attn_forward_func_with_cp`` docstring, ``get_cu_seqlens_on_cp_rank``),
``tests/pytorch/attention/run_attention_with_cp.py`` (``seq_idx = [rank, 2 * world_size - rank -
1]``; ``seqlens_q_padded = (seqlens_q + 2 * world_size - 1) // (world_size * 2) * (world_size * 2)``;
``cp_comm_sub_ranks``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from oracle.config import AttentionCase, cp_heads_unit
from oracle.errors import AttnFuzzError

CP_LAYOUT = "dual_chunk_swap"
#: Tensor names of the query side and the key side (which lengths and layout they follow).
Q_SIDE = ("q", "dout", "out", "dq", "lse")
K_SIDE = ("k", "v", "dk", "dv")
SIDES = ("q", "k")


class CPShardError(AttnFuzzError, ValueError):
    """A tensor or case cannot be sharded or gathered (wrong length, bad rank, unknown name).

    Attributes:
        field: the offending field or tensor name, e.g. ``"seqlen_q"``, ``"rank"``, ``"out"``.
    """

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


def check_cp_size(cp_size: Any, rank: Any | None = None) -> None:
    """Check ``cp_size`` (an int ``>= 1``) and, when given, ``rank`` (an int in ``[0, cp_size)``).

    Raises:
        CPShardError: naming ``"cp_size"`` or ``"rank"``.
    """
    if isinstance(cp_size, bool) or not isinstance(cp_size, int) or cp_size < 1:
        raise CPShardError("cp_size", f"must be an int >= 1, got {cp_size!r}")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < cp_size):
        raise CPShardError("rank", f"must be an int in [0, {cp_size}), got {rank!r}")


def chunk_ids(cp_size: int, rank: int) -> tuple[int, int]:
    """The two of ``2 * cp_size`` chunks rank ``rank`` holds: ``(rank, 2 * cp_size - 1 - rank)``.

    Raises:
        CPShardError: ``cp_size < 1`` or ``rank`` outside ``[0, cp_size)``.
    """
    check_cp_size(cp_size, rank)
    return rank, 2 * cp_size - 1 - rank


def padded_length(length: int, cp_size: int) -> int:
    """``length`` rounded up to a multiple of ``2 * cp_size`` (``length`` for ``cp_size == 1``)."""
    check_cp_size(cp_size)
    if cp_size == 1:
        return length
    unit = 2 * cp_size
    return -(-length // unit) * unit



def _lengths(case: AttentionCase, side: str) -> tuple[int, ...]:
    if side not in SIDES:
        raise CPShardError("side", f"unknown value {side!r} (allowed: q, k)")
    return case.seqlens_q_list if side == "q" else case.seqlens_k_list


@dataclass(frozen=True)
class ShardLayout:
    """The tokens of one side (q or k) that one rank holds, in local order.

    Attributes:
        index: ``[local_len] int64``: the canonical index of each local token: its sequence
            position for bshd/sbhd, its packed index (into ``[total, ...]``) for thd; ``-1`` for a
            padding token.
        sequence: ``[local_len] int64``: the sequence (batch entry) of each token; 0 for bshd/sbhd,
            where every batch entry has the same layout.
        position: ``[local_len] int64``: each token's position inside its sequence; a padding
            token's position is ``>=`` its sequence's real length.
    """

    index: torch.Tensor
    sequence: torch.Tensor
    position: torch.Tensor

    @property
    def local_len(self) -> int:
        """Tokens on this rank, padding included."""
        return int(self.index.numel())

    @property
    def is_real(self) -> torch.Tensor:
        """``[local_len] bool``: True for real (non-padding) tokens."""
        return self.index >= 0


def shard_layout(case: AttentionCase, cp_size: int, rank: int, side: str = "q") -> ShardLayout:
    """Which tokens of ``side`` rank ``rank`` holds under the dual-chunk-swap layout.

    Args:
        case: the case (lengths and ``qkv_format``; ``case.cp_size`` is not read).
        cp_size: number of ranks, ``>= 1``.
        rank: ``0 <= rank < cp_size``.
        side: ``"q"`` (q, dout, out, dq, lse) or ``"k"`` (k, v, dk, dv).

    Returns:
        `ShardLayout` (CPU tensors).

    Raises:
        CPShardError: bad ``cp_size``/``rank``/``side``, or a bshd/sbhd ``seqlen_q``/``seqlen_k``
            that is not a multiple of ``2 * cp_size`` (the field is named).
    """
    check_cp_size(cp_size, rank)
    lengths = _lengths(case, side)
    seqlen_name = "seqlen_q" if side == "q" else "seqlen_k"
    if not case.is_varlen:
        length = lengths[0]
        if cp_size == 1:
            position = torch.arange(length, dtype=torch.int64)
        else:
            if length % (2 * cp_size):
                raise CPShardError(
                    seqlen_name,
                    f"{length} is not a multiple of 2 * cp_size = {2 * cp_size}; bshd/sbhd shards are "
                    "not padded (TE requires seq_len % (2 * cp_size) == 0)",
                )
            chunk = length // (2 * cp_size)
            position = torch.cat([torch.arange(c * chunk, (c + 1) * chunk, dtype=torch.int64) for c in chunk_ids(cp_size, rank)])
        return ShardLayout(index=position, sequence=torch.zeros_like(position), position=position)
    indices, sequences, positions = [], [], []
    start = 0
    for b, length in enumerate(lengths):
        if cp_size == 1:
            pos = torch.arange(length, dtype=torch.int64)
        else:
            chunk = padded_length(length, cp_size) // (2 * cp_size)
            pos = torch.cat([torch.arange(c * chunk, (c + 1) * chunk, dtype=torch.int64) for c in chunk_ids(cp_size, rank)])
        indices.append(torch.where(pos < length, start + pos, torch.full_like(pos, -1)))
        sequences.append(torch.full_like(pos, b))
        positions.append(pos)
        start += length
    return ShardLayout(index=torch.cat(indices), sequence=torch.cat(sequences), position=torch.cat(positions))


def shard_indices(case: AttentionCase, cp_size: int, rank: int, side: str = "q") -> torch.Tensor:
    """``[local_len] int64``: canonical token index of each of rank ``rank``'s tokens, ``-1`` =
    padding (thd only). See `shard_layout` (same arguments and errors)."""
    return shard_layout(case, cp_size, rank, side).index


@dataclass(frozen=True)
class CPSeqlens:
    """Global varlen metadata of a thd case under CP (what TE's ``forward`` takes on every rank).

    Attributes:
        cu_seqlens_q, cu_seqlens_k: ``[batch_size + 1] int32``: real lengths, cumulative from 0.
        cu_seqlens_q_padded, cu_seqlens_k_padded: ``[batch_size + 1] int32``: lengths padded to
            multiples of ``2 * cp_size``, cumulative from 0 (token offsets in the padded packing).
        max_seqlen_q, max_seqlen_k: the largest padded length, tokens.
    """

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    cu_seqlens_q_padded: torch.Tensor
    cu_seqlens_k_padded: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int


def _cumulative(lengths: Sequence[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(list(lengths)).cumsum(0).tolist()], dtype=torch.int32)


def cp_seqlens(case: AttentionCase, cp_size: int) -> CPSeqlens:
    """The real and padded ``cu_seqlens`` of a case for ``cp_size`` ranks (see `CPSeqlens`).

    For bshd/sbhd the "sequences" are the batch entries, all of length ``seqlen_q``/``seqlen_k``.

    Raises:
        CPShardError: ``cp_size < 1``.
    """
    check_cp_size(cp_size)
    padded_q = [padded_length(n, cp_size) for n in case.seqlens_q_list]
    padded_k = [padded_length(n, cp_size) for n in case.seqlens_k_list]
    return CPSeqlens(
        cu_seqlens_q=_cumulative(case.seqlens_q_list),
        cu_seqlens_k=_cumulative(case.seqlens_k_list),
        cu_seqlens_q_padded=_cumulative(padded_q),
        cu_seqlens_k_padded=_cumulative(padded_k),
        max_seqlen_q=max(padded_q),
        max_seqlen_k=max(padded_k),
    )


def cp_unsupported_reasons(case: AttentionCase) -> list[str]:
    """Why ``case`` cannot be laid out for its ``cp_size``/``cp_comm_type`` (empty = it can).

    Layout limits shared by every CP backend: bshd/sbhd lengths must be multiples of
    ``2 * cp_size``; ``a2a`` splits heads over the ranks (``num_heads`` and ``num_heads_kv``
    multiples of ``cp_size``); ``a2a+p2p`` splits them over pairs of ranks (``cp_size``,
    ``num_heads`` and ``num_heads_kv`` even). Nothing for ``cp_size == 1``.
    """
    if case.cp_size == 1:
        return []
    n = case.cp_size
    reasons = []
    if not case.is_varlen:
        for name in ("seqlen_q", "seqlen_k"):
            value = getattr(case, name)
            if value % (2 * n):
                reasons.append(f"{name}={value} is not a multiple of 2 * cp_size = {2 * n}")
    heads_unit = cp_heads_unit(n, case.cp_comm_type)
    if heads_unit > 1:
        for name in ("num_heads", "num_heads_kv"):
            value = getattr(case, name)
            if value % heads_unit:
                reasons.append(f"{case.cp_comm_type} splits heads over {heads_unit} ranks: {name}={value} is not a multiple")
    if case.cp_comm_type == "a2a+p2p" and n % 2:
        reasons.append(f"a2a+p2p pairs ranks: cp_size={n} must be even")
    return reasons


def hierarchical_ranks(cp_size: int, rank: int) -> tuple[list[int], list[int]]:
    """Rank ``rank``'s a2a pair ``[2i, 2i+1]`` and p2p ring ``[p, p+2, ...]`` for ``a2a+p2p``.

    Source: TE ``tests/pytorch/attention/run_attention_with_cp.py`` (``cp_comm_sub_ranks``: pairs
    ``range(i * 2, (i + 1) * 2)`` for the a2a level, ``range(i, world_size, 2)`` for p2p).

    Raises:
        CPShardError: ``cp_size`` is odd or < 4, or a bad ``rank``.
    """
    check_cp_size(cp_size, rank)
    if cp_size < 4 or cp_size % 2:
        raise CPShardError("cp_size", f"a2a+p2p needs an even cp_size >= 4, got {cp_size}")
    pair = [rank - rank % 2, rank - rank % 2 + 1]
    ring = list(range(rank % 2, cp_size, 2))
    return pair, ring


def cp_twin(case: AttentionCase) -> AttentionCase:
    """The same case without context parallelism (``cp_size=1, cp_comm_type=None``).

    Inputs (`oracle.inputs.make_inputs`) and the oracle do not depend on the CP fields, so a case
    and its twin share both.
    """
    return case.replace(cp_size=1, cp_comm_type=None)


__all__ = [
    "CP_LAYOUT",
    "K_SIDE",
    "Q_SIDE",
    "SIDES",
    "CPSeqlens",
    "CPShardError",
    "ShardLayout",
    "check_cp_size",
    "chunk_ids",
    "cp_seqlens",
    "cp_twin",
    "cp_unsupported_reasons",
    "hierarchical_ranks",
    "padded_length",
    "shard_indices",
    "shard_layout",
]
