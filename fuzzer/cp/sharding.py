"""Context parallelism (CP): the shard layout TransformerEngine expects, its exact inverse, the CP
backend contract, and the CP-vs-non-CP agreement signal.

Layout ("dual chunk swap", TE's only CP layout). With ``n = cp_size`` each sequence is cut into
``2 n`` equal chunks and rank ``r`` holds chunks ``r`` and ``2 n - 1 - r``, in that order, so every
rank gets the same share of a causal mask's work. TE applies it to *every* ``attn_mask_type`` and
``qkv_format`` (``attn_forward_func_with_cp``: "DualChunkSwap ... is applied to all attn_mask_types
and all qkv_formats, and it requires sequence lengths to be, or are padded to be, divisible by
(cp_size * 2)"); non-causal masks therefore use it too, not a contiguous split. Example,
``seqlen = 12``, ``cp_size = 2``: rank 0 holds positions ``0 1 2 9 10 11``, rank 1 ``3 4 5 6 7 8``.

* ``bshd``/``sbhd`` (canonical ``[batch_size, seqlen, heads, dim]`` for both): the split runs along
  the sequence dim of the canonical layout; ``seqlen_q`` and ``seqlen_k`` must each be multiples of
  ``2 cp_size`` (TE pads nothing here and rejects padding masks under CP), else `CPShardError`.
* ``thd`` (packed ``[total, heads, dim]`` with ``cu_seqlens``): every sequence ``b`` is padded at
  its end to ``seqlens_padded[b] = ceil(seqlens[b] / (2 cp_size)) * 2 cp_size`` tokens
  (``cu_seqlens_q_padded``/``cu_seqlens_k_padded``, TE's ``cu_seqlens_*_padded``) and split the same
  way, sequence by sequence: a rank's shard is ``[chunk r of seq 0, chunk 2n-1-r of seq 0, chunk r
  of seq 1, ...]``, ``sum(seqlens_padded) / cp_size`` tokens.
  **Padding tokens**: `shard` fills them with zeros (q, k, v and dout alike); they belong to their
  sequence's range in ``cu_seqlens_*_padded`` but lie beyond its real length in ``cu_seqlens_*``,
  so no query row sees them and no real row's output depends on them. `gather` drops them: the
  gathered tensor holds only the real tokens, in the canonical order, and whatever a backend
  wrote at padding positions (TE writes zeros) is never judged.
* ``lse`` (``[batch_size, num_heads, seqlen_q]`` / ``[num_heads, total_q]``) is split along its
  last dim with the query layout.
* ``cp_size == 1`` is the identity (no padding): a case without CP.

`shard_layout` gives, per rank and side (``"q"``: q, dout, out, dq, lse; ``"k"``: k, v, dk, dv), the
canonical index of every local token (``-1`` for padding), its sequence and its position in the
sequence; `shard` and `gather` are exact inverses on real tokens (`tests/fuzzer/test_cp.py`).

CP backend contract (`is_cp_backend`): a backend with ``capabilities.cp`` implements
``run_cp(case, inputs: CPShardInputs, groups: CPProcessGroups, variant) -> BackendOutput`` and is
called on every rank with that rank's shard and the process group(s); it returns its *local*
out/lse/dq/dk/dv (canonical layout, local length); `fuzzer.cp.executor.CPExecutor` gathers them
with `gather_outputs`. ``cp_group`` etc. are created by the executor, never by the backend.

CP vs non-CP: the oracle (float64, full sequence) is the judge of a CP run. `cp_agreement` is a
second, weaker signal: how far the CP run is from the same backend's non-CP run of the same case,
relative to the oracle's allowed error. `judge_cp` puts it into ``metrics["cp"]`` of the CP result
with ``agree_but_both_wrong``: CP and non-CP agree but both fail the oracle (the seed's blind
spot: TE's CP tests compare ``tensors_cp`` with ``tensors_no_cp`` and pass when both are zero).

Source: NVIDIA/TransformerEngine ``transformer_engine/pytorch/attention/dot_product_attention/
context_parallel.py`` (``attn_forward_func_with_cp`` docstring, ``get_cu_seqlens_on_cp_rank``),
``tests/pytorch/attention/run_attention_with_cp.py`` (``seq_idx = [rank, 2 * world_size - rank -
1]``; ``seqlens_q_padded = (seqlens_q + 2 * world_size - 1) // (world_size * 2) * (world_size * 2)``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from fuzzer.backends.base import Backend, BackendOutput
from fuzzer.executor import TaskOutcome
from oracle.config import CP_COMM_TYPES, AttentionCase, cp_heads_unit
from oracle.errors import AttnFuzzError

CP_LAYOUT = "dual_chunk_swap"
#: Key of the CP block in `fuzzer.results.CaseResult.metrics` (read by `service.db.cp_view`).
CP_METRICS_KEY = "cp"
#: Two runs agree when ``||cp - non_cp|| <= AGREEMENT_RATIO * allowed`` for every tensor: 2 is the
#: triangle bound for two runs that each pass the oracle (each within ``allowed`` of the truth).
AGREEMENT_RATIO = 2.0
#: Tensor names of the query side and the key side (which lengths and layout they follow).
Q_SIDE = ("q", "dout", "out", "dq", "lse")
K_SIDE = ("k", "v", "dk", "dv")
SIDES = ("q", "k")
#: Environment of every CP rank: NVLink SHARP / multicast stay off (see docs/cp.md).
CP_RANK_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


class CPShardError(AttnFuzzError, ValueError):
    """A tensor or case cannot be sharded or gathered (wrong length, bad rank, unknown name).

    Attributes:
        field: the offending field or tensor name, e.g. ``"seqlen_q"``, ``"rank"``, ``"out"``.
    """

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


# ------------------------------------------------------------------------------------- layout
def _check_cp(cp_size: Any, rank: Any | None = None) -> None:
    if isinstance(cp_size, bool) or not isinstance(cp_size, int) or cp_size < 1:
        raise CPShardError("cp_size", f"must be an int >= 1, got {cp_size!r}")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < cp_size):
        raise CPShardError("rank", f"must be an int in [0, {cp_size}), got {rank!r}")


def chunk_ids(cp_size: int, rank: int) -> tuple[int, int]:
    """The two of ``2 * cp_size`` chunks rank ``rank`` holds: ``(rank, 2 * cp_size - 1 - rank)``.

    Raises:
        CPShardError: ``cp_size < 1`` or ``rank`` outside ``[0, cp_size)``.
    """
    _check_cp(cp_size, rank)
    return rank, 2 * cp_size - 1 - rank


def padded_length(length: int, cp_size: int) -> int:
    """``length`` rounded up to a multiple of ``2 * cp_size`` (``length`` for ``cp_size == 1``)."""
    _check_cp(cp_size)
    if cp_size == 1:
        return length
    unit = 2 * cp_size
    return -(-length // unit) * unit


def _side_of(name: str) -> str:
    if name in Q_SIDE:
        return "q"
    if name in K_SIDE:
        return "k"
    raise CPShardError("name", f"unknown tensor name {name!r} (allowed: {', '.join(Q_SIDE + K_SIDE)})")


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
    _check_cp(cp_size, rank)
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
    _check_cp(cp_size)
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
    _check_cp(cp_size)
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


def cp_twin(case: AttentionCase) -> AttentionCase:
    """The same case without context parallelism (``cp_size=1, cp_comm_type=None``).

    Inputs (`oracle.inputs.make_inputs`) and the oracle do not depend on the CP fields, so a case
    and its twin share both.
    """
    return case.replace(cp_size=1, cp_comm_type=None)


# ------------------------------------------------------------------------------------ contract
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
        return hierarchical_ranks(self.cp_size, self.rank)


def hierarchical_ranks(cp_size: int, rank: int) -> tuple[list[int], list[int]]:
    """Rank ``rank``'s a2a pair ``[2i, 2i+1]`` and p2p ring ``[p, p+2, ...]`` for ``a2a+p2p``.

    Source: TE ``tests/pytorch/attention/run_attention_with_cp.py`` (``cp_comm_sub_ranks``: pairs
    ``range(i * 2, (i + 1) * 2)`` for the a2a level, ``range(i, world_size, 2)`` for p2p).

    Raises:
        CPShardError: ``cp_size`` is odd or < 4, or a bad ``rank``.
    """
    _check_cp(cp_size, rank)
    if cp_size < 4 or cp_size % 2:
        raise CPShardError("cp_size", f"a2a+p2p needs an even cp_size >= 4, got {cp_size}")
    pair = [rank - rank % 2, rank - rank % 2 + 1]
    ring = list(range(rank % 2, cp_size, 2))
    return pair, ring


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


@dataclass
class CPTaskOutcome(TaskOutcome):
    """A `fuzzer.executor.TaskOutcome` of a CP run, with the same backend's non-CP run beside it.

    Attributes:
        non_cp: the outcome of the non-CP twin (`cp_twin`) of the case on the same backend and
            variant, with the full inputs, on rank 0 (None when not run).
        rank_status: each rank's status, rank order (``"missing"`` for a rank that did not answer).
    """

    non_cp: TaskOutcome | None = None
    rank_status: list[str] = field(default_factory=list)


def non_cp_outcome(outcome: TaskOutcome) -> TaskOutcome | None:
    """The non-CP twin's outcome carried by a CP outcome, None for any other outcome."""
    return getattr(outcome, "non_cp", None)


# ----------------------------------------------------------------------------------- agreement
def _json_float(x: float) -> float | str:
    if math.isfinite(x):
        return float(x)
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


@dataclass(frozen=True)
class CPAgreement:
    """How close a CP run is to the same backend's non-CP run (see `cp_agreement`).

    Attributes:
        agrees_with_non_cp: every common tensor has ``diff_l2 <= AGREEMENT_RATIO * allowed``.
        max_abs_diff_vs_non_cp: the largest ``|cp - non_cp|`` over the common tensors (``inf``
            when non-finite values differ).
        diff_ratio_vs_non_cp: the largest ``diff_l2 / allowed`` over the common tensors.
        identical: bit-identical (NaN equal to NaN) on every common tensor.
        tensors: per tensor name: ``max_abs_diff``, ``diff_l2``, ``allowed`` (the oracle's global
            allowed error of that tensor) and ``ratio``.
    """

    agrees_with_non_cp: bool
    max_abs_diff_vs_non_cp: float
    diff_ratio_vs_non_cp: float
    identical: bool
    tensors: dict[str, dict[str, float]]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON; non-finite floats become ``"inf"``/``"nan"``."""
        return {
            "agrees_with_non_cp": self.agrees_with_non_cp,
            "max_abs_diff_vs_non_cp": _json_float(self.max_abs_diff_vs_non_cp),
            "diff_ratio_vs_non_cp": _json_float(self.diff_ratio_vs_non_cp),
            "identical": self.identical,
            "tensors": {n: {k: _json_float(v) for k, v in t.items()} for n, t in self.tensors.items()},
        }


def _oracle_allowed(case: AttentionCase, ref: Any, name: str) -> float:
    """The oracle's global allowed error of tensor ``name`` (`oracle.compare` tolerance model)."""
    from oracle.compare import compare_tensor
    from oracle.masks import visible_rows

    expected = getattr(ref, name)
    row_dim = ({"lse": 1} if case.is_varlen else {"lse": 2}).get(name, 0 if case.is_varlen else 1)
    verdict = compare_tensor(
        name, expected, expected, case.dtype, row_dim=row_dim,
        visible_rows=visible_rows(case, expected.device) if name == "lse" else None,
        row_scale=ref.error_scales.get(name),
    )
    return float(verdict.allowed)


def _difference(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, bool]:
    """``(max_abs, l2, identical)`` of two tensors; equal non-finite values count as equal."""
    if a.shape != b.shape:
        return math.inf, math.inf, False
    a, b = a.detach().double().cpu(), b.detach().double().to("cpu")
    both_nan = a.isnan() & b.isnan()
    equal = (a == b) | both_nan
    finite = a.isfinite() & b.isfinite()
    if bool((~finite & ~equal).any()):
        return math.inf, math.inf, False
    diff = torch.where(finite, a - b, torch.zeros_like(a))
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    return max_abs, float(diff.norm()), bool(equal.all())


def cp_agreement(case: AttentionCase, ref: Any, cp_output: BackendOutput, non_cp_output: BackendOutput) -> CPAgreement:
    """Compare a CP run with the same backend's non-CP run, tensor by tensor.

    For each of out, lse, dq, dk, dv present in both (and in the reference): ``diff_l2 =
    ||cp - non_cp||_2`` (positions where both hold the same non-finite value count as equal; a
    non-finite value on one side only makes it ``inf``), ``allowed`` the oracle's global allowed
    error of that tensor for ``case`` (`oracle.compare`), ``ratio = diff_l2 / allowed``. The runs
    agree when every ratio is ``<= AGREEMENT_RATIO``.

    Args:
        case: the CP case (its twin has the same inputs and oracle).
        ref: `oracle.reference.ReferenceResult` of the case.
        cp_output: the gathered CP `BackendOutput` (full canonical layout).
        non_cp_output: the non-CP `BackendOutput` of the same backend and variant.

    Returns:
        `CPAgreement`; with no common tensor it agrees vacuously (``tensors`` empty).
    """
    tensors: dict[str, dict[str, float]] = {}
    identical = True
    for name in ("out", "lse", "dq", "dk", "dv"):
        a, b = getattr(cp_output, name), getattr(non_cp_output, name)
        if a is None or b is None or getattr(ref, name) is None:
            continue
        max_abs, l2, same = _difference(a, b)
        allowed = _oracle_allowed(case, ref, name)
        ratio = l2 / allowed if allowed > 0 else (0.0 if l2 == 0 else math.inf)
        tensors[name] = {"max_abs_diff": max_abs, "diff_l2": l2, "allowed": allowed, "ratio": ratio}
        identical = identical and same
    ratios = [t["ratio"] for t in tensors.values()]
    return CPAgreement(
        agrees_with_non_cp=all(r <= AGREEMENT_RATIO for r in ratios),
        max_abs_diff_vs_non_cp=max((t["max_abs_diff"] for t in tensors.values()), default=0.0),
        diff_ratio_vs_non_cp=max(ratios, default=0.0),
        identical=identical,
        tensors=tensors,
    )


def judge_cp(
    case: AttentionCase,
    ref: Any,
    outcome: TaskOutcome,
    judge: Callable[[AttentionCase, TaskOutcome], Any],
) -> tuple[Any, Any | None]:
    """Judge a CP outcome and its non-CP twin with the worker's judge, and add ``metrics["cp"]``.

    The oracle verdict of the CP run stays its status (pass/fail); ``metrics["cp"]`` adds:
    ``cp_size``, ``cp_comm_type``, ``cp_layout``, ``non_cp_case_id``, ``non_cp_status``,
    ``non_cp_signature``, ``agrees_with_non_cp`` (None unless both runs returned outputs), the
    `CPAgreement` figures, and ``agree_but_both_wrong`` (both fail the oracle while agreeing with
    each other: what a CP-vs-non-CP test cannot see).

    Args:
        case: the case of ``outcome``.
        ref: the oracle of ``case`` (shared by its twin).
        outcome: one task's outcome (a `CPTaskOutcome` for CP runs).
        judge: ``judge(case, outcome) -> CaseResult`` (the worker's ``_judge`` with its oracle,
            timing and phase bound).

    Returns:
        ``(result, twin_result)``: the CP result with ``metrics["cp"]`` and the twin's
        `CaseResult` (for the twin case), or ``(judge(case, outcome), None)`` when ``outcome``
        carries no non-CP run.
    """
    result = judge(case, outcome)
    twin_outcome = non_cp_outcome(outcome)
    if case.cp_size == 1 or twin_outcome is None:
        return result, None
    twin = cp_twin(case)
    twin_result = judge(twin, twin_outcome)
    block: dict[str, Any] = {
        "cp_size": case.cp_size,
        "cp_comm_type": case.cp_comm_type,
        "cp_layout": CP_LAYOUT,
        "non_cp_case_id": twin.case_id,
        "non_cp_status": twin_result.status,
        "non_cp_signature": twin_result.signature,
        "agrees_with_non_cp": None,
        "agree_but_both_wrong": False,
    }
    if outcome.status == "ok" and twin_outcome.status == "ok":
        agreement = cp_agreement(case, ref, outcome.output, twin_outcome.output)
        block.update(agreement.to_json())
        block["agree_but_both_wrong"] = bool(
            agreement.agrees_with_non_cp and result.is_failure and twin_result.is_failure
        )
    metrics = dict(result.metrics)
    metrics[CP_METRICS_KEY] = block
    return dataclasses.replace(result, metrics=metrics), twin_result


__all__ = [
    "AGREEMENT_RATIO",
    "CP_COMM_TYPES",
    "CP_LAYOUT",
    "CP_METRICS_KEY",
    "CP_RANK_ENV",
    "CPAgreement",
    "CPBackend",
    "CPProcessGroups",
    "CPSeqlens",
    "CPShardError",
    "CPShardInputs",
    "CPTaskOutcome",
    "ShardLayout",
    "chunk_ids",
    "cp_agreement",
    "cp_seqlens",
    "cp_twin",
    "cp_unsupported_reasons",
    "gather",
    "gather_outputs",
    "hierarchical_ranks",
    "is_cp_backend",
    "judge_cp",
    "non_cp_outcome",
    "padded_length",
    "shard",
    "shard_indices",
    "shard_inputs",
    "shard_layout",
]
