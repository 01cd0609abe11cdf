"""A CPU attention backend with real context parallelism over ``torch.distributed`` (gloo), and two
planted variants. It exists so that the CP plumbing (sharding, the process groups, the
collectives, the LSE merge, the gather and un-permute) is exercised for real on machines without
a GPU; it is not a kernel under test.

Numerics: float32 scores and accumulators (case dtype in, case dtype out, float32 lse), mask from
`oracle.masks.key_bounds` per sequence, GQA by head groups (query head ``h`` reads kv head
``h // group_size``), rows without a visible key give ``out = 0``, ``lse = -inf``, zero gradient.

Every run, with or without CP, is *blockwise*: the queries of one rank attend one key/value block
at a time and the partial results are merged with the logsumexp rescaling of ring attention::

    lse_new = logaddexp(lse, lse_blk)
    out     = out * exp(lse - lse_new) + out_blk * exp(lse_blk - lse_new)

(both weights 0 where ``lse_new = -inf``: a row that has seen no key yet; without that guard the
merge computes ``exp(-inf - -inf) = NaN``, which is how the seed bug became visible under TE's p2p
ring). The backward recomputes each block's probabilities from the final lse
(``P = exp(S - lse)``, ``dS = P * (dP - rowsum(dout * out))``, FlashAttention-2 Algorithm 2).

Comm types (``case.cp_comm_type``, rank ``r`` of ``n``):

``p2p``         ring: k/v shards travel ``r -> r+1`` with ``isend``/``irecv``, ``n - 1`` exchanges;
                backward: (k, v, dk, dv) travel the ring once more so each block's dk/dv
                accumulators come back to its owner after ``n`` exchanges.
``all_gather``  ``all_gather`` of the k/v shards, then one block per source rank; backward: every
                rank's dk/dv of every block, summed with ``all_reduce`` and each rank keeps its own.
``a2a``         Ulysses: ``all_to_all`` turns sequence shards into head shards (``num_heads / n``
                heads of the whole sequence per rank), attention over the ``n`` source blocks,
                ``all_to_all`` back; the backward sends dout forward and dq/dk/dv back the same way.
``a2a+p2p``     hierarchical: ``a2a`` inside rank pairs ``{2i, 2i+1}`` (head halves), then the
                ``p2p`` ring over the ranks of one parity ``{p, p+2, ...}``, then ``a2a`` back.

Backends:

* `RingAttentionCPUBackend` (``cp-cpu-ring``): correct.
* `PlantedWindowCPUBackend` (``cp-cpu-planted-window``): resolves TE's causal encoding
  ``window_size = (-1, 0)`` the way flash-attention after #2490 does (``-1`` is a real left bound:
  the band ``[i + 1, i]`` is empty), with and without CP: all-zero ``out``, ``-inf`` lse. CP and
  non-CP agree exactly and are both wrong (acceptance 3: only the oracle sees it).
* `PlantedMergeCPUBackend` (``cp-cpu-planted-merge``): forgets to rescale the running output in
  the merge (``out = out + out_blk * exp(lse_blk - lse_new)``). A non-CP run merges one block into
  an empty state, where that is harmless, so only CP runs are wrong: a CP-only bug, which the
  oracle and the CP-vs-non-CP comparison both see.

Source: Liu, Zaharia, Abbeel, "Ring Attention with Blockwise Transformers", arXiv:2310.01889
(ring schedule); Jacobs et al., "DeepSpeed Ulysses", arXiv:2309.14509 (all-to-all over heads);
Dao, "FlashAttention-2", arXiv:2307.08691, Algorithm 2 (backward); TE ``context_parallel.py``
``flash_attn_fwd_out_correction`` / ``flash_attn_fwd_softmax_lse_correction`` (the merge).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fuzzer.backends.base import Backend, BackendOutput, Capabilities, CPProcessGroups, CPShardInputs
from fuzzer.backends.cp_layout import ShardLayout, cp_unsupported_reasons, hierarchical_ranks, shard_layout
from oracle.config import AttentionCase, torch_dtype
from oracle.design import Design
from oracle.masks import key_bounds

CAPABILITIES = Capabilities(
    dtypes=("float32", "bfloat16", "float16"),
    qkv_formats=("bshd", "sbhd", "thd"),
    max_head_dim=128,
    head_dim_multiple=1,
    head_dim_v_differs=True,
    gqa=True,
    causal_alignments=("top_left", "bottom_right"),
    windows=True,
    softcap=False,
    backward=True,
    lse=True,
    max_seqlen=256,
    cp=True,
)


@dataclass
class _Rows:
    """Query-side metadata of a block of tokens: ``seq``, and the visible key range ``[lo, hi)``
    of each token inside its sequence (``lo = hi = 0`` for padding)."""

    seq: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor

    @staticmethod
    def cat(parts: list[_Rows]) -> _Rows:
        return _Rows(*(torch.cat([getattr(p, n) for p in parts]) for n in ("seq", "lo", "hi")))


@dataclass
class _Keys:
    """Key-side metadata of a block of tokens: ``seq`` and ``pos`` (padding: ``pos >= length``)."""

    seq: torch.Tensor
    pos: torch.Tensor

    @staticmethod
    def cat(parts: list[_Keys]) -> _Keys:
        return _Keys(torch.cat([p.seq for p in parts]), torch.cat([p.pos for p in parts]))


def _mask(rows: _Rows, keys: _Keys) -> torch.Tensor:
    """``[rows, keys] bool``: same sequence and ``lo <= pos < hi``."""
    return (
        (rows.seq[:, None] == keys.seq[None, :])
        & (keys.pos[None, :] >= rows.lo[:, None])
        & (keys.pos[None, :] < rows.hi[:, None])
    )


def _batched(case: AttentionCase, x: torch.Tensor) -> torch.Tensor:
    """Canonical ``[b, s, h, d]`` or thd ``[t, h, d]`` -> float32 ``[B, T, h, d]`` (thd: B = 1)."""
    return (x.unsqueeze(0) if case.is_varlen else x).float()


def _unbatched(case: AttentionCase, x: torch.Tensor) -> torch.Tensor:
    """Inverse of `_batched`: drops thd's batch dim (lse ``[1, H, T]`` -> ``[H, T]`` too)."""
    return x.squeeze(0) if case.is_varlen else x


CP_CPU_DESIGN = Design(
    "cp-cpu-float32",
    (),
    "attnfuzz's CPU blockwise reference: q, k, v and dout upcast to float32 (fuzzer/backends/cp_cpu.py:120, "
    "_batched), scores, probabilities, dP, dS and the GQA sums of dk and dv in float32 (_block_forward, "
    "_block_backward: 206-222), the merge and every CP collective on float32 tensors; only out and the "
    "gradients are rounded to the dtype (_output: 258), delta from the rounded out (_delta: 239)",
)
"""The design of every backend here, the planted ones included: they are wrong through the mask
(`PlantedWindowCPUBackend.key_bounds`) or the merge (`PlantedMergeCPUBackend.merge`), not through
their numerics, so a correct float32 emulation does not share their failures."""


class RingAttentionCPUBackend(Backend):
    """Blockwise attention on the CPU; under CP a real distributed implementation (module docstring)."""

    name: ClassVar[str] = "cp-cpu-ring"
    variants: ClassVar[tuple[str, ...]] = ("default",)
    device: ClassVar[str] = "cpu"
    environment: ClassVar[str] = "cp-cpu"
    capabilities: ClassVar[Capabilities] = CAPABILITIES
    design: ClassVar[Design] = CP_CPU_DESIGN

    def unsupported_reasons(self, case: AttentionCase, variant: str) -> list[str]:
        """Base checks plus the CP layout limits (`fuzzer.backends.cp_layout.cp_unsupported_reasons`)."""
        return super().unsupported_reasons(case, variant) + cp_unsupported_reasons(case)

    # ------------------------------------------------------------------ overridable policies
    def key_bounds(self, case: AttentionCase, seqlen_q: int, seqlen_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Visible keys ``[lo, hi)`` of each query row of one sequence (`oracle.masks.key_bounds`)."""
        return key_bounds(case, seqlen_q, seqlen_k)

    def merge(self, out: torch.Tensor, lse: torch.Tensor, out_blk: torch.Tensor, lse_blk: torch.Tensor):
        """Merge a block's partial ``(out_blk [B, T, H, Dv], lse_blk [B, H, T])`` into the running
        ``(out, lse)`` with the logsumexp rescaling; rows with ``lse_new = -inf`` stay ``(0, -inf)``."""
        lse_new = torch.logaddexp(lse, lse_blk)
        seen = torch.isfinite(lse_new)
        w_old = torch.where(seen, torch.exp(lse - lse_new), 0.0)
        w_blk = torch.where(seen, torch.exp(lse_blk - lse_new), 0.0)
        return out * w_old.transpose(1, 2)[..., None] + out_blk * w_blk.transpose(1, 2)[..., None], lse_new

    # ------------------------------------------------------------------ metadata
    def _rows(self, case: AttentionCase, layout: ShardLayout) -> _Rows:
        lengths_q, lengths_k = case.seqlens_q_list, case.seqlens_k_list
        lo = torch.zeros_like(layout.position)
        hi = torch.zeros_like(layout.position)
        for s in torch.unique(layout.sequence).tolist():
            seq_lo, seq_hi = self.key_bounds(case, lengths_q[s], lengths_k[s])
            sel = (layout.sequence == s) & (layout.position < lengths_q[s])
            lo[sel] = seq_lo[layout.position[sel]]
            hi[sel] = seq_hi[layout.position[sel]]
        return _Rows(layout.sequence, lo, hi)

    @staticmethod
    def _keys(layout: ShardLayout) -> _Keys:
        return _Keys(layout.sequence, layout.position)

    def _layouts(self, case: AttentionCase, cp_size: int) -> tuple[list[_Rows], list[_Keys]]:
        rows = [self._rows(case, shard_layout(case, cp_size, r, "q")) for r in range(cp_size)]
        keys = [self._keys(shard_layout(case, cp_size, r, "k")) for r in range(cp_size)]
        return rows, keys

    # ------------------------------------------------------------------ block numerics
    @staticmethod
    def _block_forward(case: AttentionCase, q, k, v, mask):
        """Partial attention of ``q [B, Tq, H, D]`` on one block ``k, v [B, Tk, Hkv, *]``:
        ``(out [B, Tq, H, Dv], lse [B, H, Tq])``, normalised within the block."""
        batch, tq, heads, dim = q.shape
        hkv = k.shape[2]
        qg = q.view(batch, tq, hkv, heads // hkv, dim)
        scores = torch.einsum("bqhgd,bkhd->bhgqk", qg, k) * case.softmax_scale
        scores = scores.masked_fill(~mask, -math.inf)
        lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
        out = torch.einsum("bhgqk,bkhd->bqhgd", probs, v).reshape(batch, tq, heads, v.shape[-1])
        return out, lse.reshape(batch, heads, tq)

    @staticmethod
    def _block_backward(case: AttentionCase, q, k, v, dout, lse, delta, mask):
        """Gradients of one block given the final ``lse [B, H, Tq]`` and ``delta = rowsum(dout * out)``:
        ``(dq [B, Tq, H, D], dk [B, Tk, Hkv, D], dv [B, Tk, Hkv, Dv])``."""
        batch, tq, heads, dim = q.shape
        hkv = k.shape[2]
        group = heads // hkv
        qg = q.view(batch, tq, hkv, group, dim)
        dg = dout.view(batch, tq, hkv, group, dout.shape[-1])
        lse_g = lse.view(batch, hkv, group, tq)
        scores = torch.einsum("bqhgd,bkhd->bhgqk", qg, k) * case.softmax_scale
        scores = scores.masked_fill(~mask, -math.inf)
        probs = torch.exp(scores - torch.where(torch.isfinite(lse_g), lse_g, 0.0)[..., None])
        dv = torch.einsum("bhgqk,bqhgd->bkhd", probs, dg)
        dprobs = torch.einsum("bqhgd,bkhd->bhgqk", dg, v)
        dscores = probs * (dprobs - delta.view(batch, hkv, group, tq)[..., None])
        dq = torch.einsum("bhgqk,bkhd->bqhgd", dscores, k).reshape(batch, tq, heads, dim) * case.softmax_scale
        dk = torch.einsum("bhgqk,bqhgd->bkhd", dscores, qg) * case.softmax_scale
        return dq, dk, dv

    def _empty_state(self, q: torch.Tensor, head_dim_v: int):
        batch, tq, heads, _ = q.shape
        return q.new_zeros(batch, tq, heads, head_dim_v), q.new_full((batch, heads, tq), -math.inf)

    def _attend(self, case, q, rows, blocks):
        """Forward of ``q`` over key blocks ``[(k, v, keys)]``, merged in order."""
        out, lse = self._empty_state(q, case.head_dim_v)
        for k, v, keys in blocks:
            out, lse = self.merge(out, lse, *self._block_forward(case, q, k, v, _mask(rows, keys)))
        return out, lse

    @staticmethod
    def _delta(case: AttentionCase, out: torch.Tensor, dout: torch.Tensor) -> torch.Tensor:
        """``rowsum(dout * out) [B, H, T]`` from the output rounded to the case dtype (as FA does)."""
        rounded = out.to(torch_dtype(case.dtype)).float()
        return (dout * rounded).sum(-1).transpose(1, 2)

    # ------------------------------------------------------------------ non-CP run
    def run(self, case: AttentionCase, inputs: Any, variant: str) -> BackendOutput:
        """One rank holding everything: the same blockwise code with a single block."""
        rows, keys = self._layouts(case, 1)
        q, k, v = (_batched(case, t) for t in (inputs.q, inputs.k, inputs.v))
        out, lse = self._attend(case, q, rows[0], [(k, v, keys[0])])
        grads = (None, None, None)
        if case.backward:
            dout = _batched(case, inputs.dout)
            grads = self._block_backward(case, q, k, v, dout, lse, self._delta(case, out, dout), _mask(rows[0], keys[0]))
        return self._output(case, out, lse, *grads)

    def _output(self, case, out, lse, dq, dk, dv) -> BackendOutput:
        dtype = torch_dtype(case.dtype)

        def back(x):
            return None if x is None else _unbatched(case, x).to(dtype)

        return BackendOutput(
            out=back(out), lse=_unbatched(case, lse), dq=back(dq), dk=back(dk), dv=back(dv),
            selected_kernel=f"{self.name} (float32 blockwise)",
        )

    # ------------------------------------------------------------------ CP run
    def run_cp(self, case: AttentionCase, inputs: CPShardInputs, groups: CPProcessGroups, variant: str) -> BackendOutput:
        """This rank's part of ``case`` with ``case.cp_comm_type`` (see the module docstring)."""
        import torch.distributed as dist  # noqa: F401  (fails early where distributed is missing)

        if inputs.cp_size != case.cp_size or groups.cp_size != case.cp_size:
            raise ValueError(f"cp_size: case {case.cp_size}, inputs {inputs.cp_size}, group {groups.cp_size}")
        rows, keys = self._layouts(case, case.cp_size)
        q, k, v = (_batched(case, t) for t in (inputs.q, inputs.k, inputs.v))
        dout = _batched(case, inputs.dout) if case.backward else None
        run = {
            "p2p": self._run_p2p,
            "all_gather": self._run_all_gather,
            "a2a": self._run_a2a,
            "a2a+p2p": self._run_a2a_p2p,
        }[case.cp_comm_type]
        out, lse, dq, dk, dv = run(case, groups, q, k, v, dout, rows, keys)
        return self._output(case, out, lse, dq, dk, dv)

    # p2p ----------------------------------------------------------------
    def _ring(self, case, group, ring: list[int], me: int, q, k, v, dout, rows: _Rows, block_keys: list[_Keys]):
        """Ring attention over the global ranks ``ring`` (this rank is ``ring[me]``); member ``i``
        owns k/v block ``i`` with metadata ``block_keys[i]``. Returns ``(out, lse, dq, dk, dv)``."""
        size = len(ring)
        send_to, recv_from = ring[(me + 1) % size], ring[(me - 1) % size]
        out, lse = self._empty_state(q, case.head_dim_v)
        block_k, block_v = k, v
        for step in range(size):
            if step:
                block_k, block_v = _exchange([block_k, block_v], group, send_to, recv_from)
            owner = (me - step) % size
            mask = _mask(rows, block_keys[owner])
            out, lse = self.merge(out, lse, *self._block_forward(case, q, block_k, block_v, mask))
        if dout is None:
            return out, lse, None, None, None
        delta = self._delta(case, out, dout)
        dq = torch.zeros_like(q)
        block_k, block_v = k, v
        block_dk, block_dv = torch.zeros_like(k), torch.zeros_like(v)
        for step in range(size):
            owner = (me - step) % size
            mask = _mask(rows, block_keys[owner])
            dq_b, dk_b, dv_b = self._block_backward(case, q, block_k, block_v, dout, lse, delta, mask)
            dq += dq_b
            block_dk, block_dv = block_dk + dk_b, block_dv + dv_b
            if step < size - 1:
                block_k, block_v, block_dk, block_dv = _exchange(
                    [block_k, block_v, block_dk, block_dv], group, send_to, recv_from
                )
            else:  # the accumulators return to their owner
                block_dk, block_dv = _exchange([block_dk, block_dv], group, send_to, recv_from)
        return out, lse, dq, block_dk, block_dv

    def _run_p2p(self, case, groups, q, k, v, dout, rows, keys):
        ring = list(range(groups.cp_size))
        return self._ring(case, groups.group, ring, groups.rank, q, k, v, dout, rows[groups.rank], keys)

    # all_gather ---------------------------------------------------------
    def _run_all_gather(self, case, groups, q, k, v, dout, rows, keys):
        import torch.distributed as dist

        n, me = groups.cp_size, groups.rank
        all_k = [torch.empty_like(k) for _ in range(n)]
        all_v = [torch.empty_like(v) for _ in range(n)]
        dist.all_gather(all_k, k.contiguous(), group=groups.group)
        dist.all_gather(all_v, v.contiguous(), group=groups.group)
        blocks = list(zip(all_k, all_v, keys))
        out, lse = self._attend(case, q, rows[me], blocks)
        if dout is None:
            return out, lse, None, None, None
        delta = self._delta(case, out, dout)
        dq = torch.zeros_like(q)
        dk_all, dv_all = torch.zeros(n, *k.shape), torch.zeros(n, *v.shape)
        for j, (bk, bv, bkeys) in enumerate(blocks):
            dq_b, dk_all[j], dv_all[j] = self._block_backward(case, q, bk, bv, dout, lse, delta, _mask(rows[me], bkeys))
            dq += dq_b
        dist.all_reduce(dk_all, group=groups.group)
        dist.all_reduce(dv_all, group=groups.group)
        return out, lse, dq, dk_all[me], dv_all[me]

    # a2a ----------------------------------------------------------------
    def _run_a2a(self, case, groups, q, k, v, dout, rows, keys):
        members = list(range(groups.cp_size))
        return self._ulysses(case, groups.group, members, groups.rank, q, k, v, dout, rows, keys, ring=None)

    def _ulysses(self, case, group, members, me, q, k, v, dout, rows, keys, ring):
        """All-to-all over ``members`` (heads split ``len(members)`` ways; this rank is
        ``members[me]`` and keeps head chunk ``me``), attention, all-to-all back. With ``ring``
        ``(p2p_group, ring_ranks, my_index, pair_keys)`` the attention itself is a ring over
        pairs (``a2a+p2p``); otherwise it runs locally over every member's block."""
        n = len(members)
        q_h, k_h, v_h = (_to_heads(t, group, n) for t in (q, k, v))  # lists over members: [B, T_j, H/n, *]
        member_rows = _Rows.cat([rows[m] for m in members])
        q_all = torch.cat(q_h, dim=1)
        dout_all = torch.cat(_to_heads(dout, group, n), dim=1) if dout is not None else None
        if ring is None:
            blocks = [(k_h[j], v_h[j], keys[members[j]]) for j in range(n)]
            out, lse = self._attend(case, q_all, member_rows, blocks)
            dq = dk = dv = None
            if dout_all is not None:
                delta = self._delta(case, out, dout_all)
                dq = torch.zeros_like(q_all)
                dks, dvs = [], []
                for bk, bv, bkeys in blocks:
                    dq_b, dk_b, dv_b = self._block_backward(case, q_all, bk, bv, dout_all, lse, delta, _mask(member_rows, bkeys))
                    dq += dq_b
                    dks.append(dk_b)
                    dvs.append(dv_b)
                dk, dv = torch.cat(dks, dim=1), torch.cat(dvs, dim=1)
        else:
            p2p_group, ring_ranks, my_index, pair_keys = ring
            out, lse, dq, dk, dv = self._ring(
                case, p2p_group, ring_ranks, my_index, q_all, torch.cat(k_h, 1), torch.cat(v_h, 1), dout_all,
                member_rows, pair_keys,
            )
        lens_q = [t.shape[1] for t in q_h]
        lens_k = [t.shape[1] for t in k_h]
        out = _from_heads(list(out.split(lens_q, dim=1)), group, n)
        lse = _from_heads_lse(list(lse.split(lens_q, dim=2)), group, n)
        if dq is None:
            return out, lse, None, None, None
        dq = _from_heads(list(dq.split(lens_q, dim=1)), group, n)
        dk = _from_heads(list(dk.split(lens_k, dim=1)), group, n)
        dv = _from_heads(list(dv.split(lens_k, dim=1)), group, n)
        return out, lse, dq, dk, dv

    # a2a+p2p ------------------------------------------------------------
    def _run_a2a_p2p(self, case, groups, q, k, v, dout, rows, keys):
        pair, ring_ranks = hierarchical_ranks(groups.cp_size, groups.rank)
        pair_keys = [_Keys.cat([keys[p - p % 2], keys[p - p % 2 + 1]]) for p in ring_ranks]
        ring = (groups.p2p_group, ring_ranks, ring_ranks.index(groups.rank), pair_keys)
        return self._ulysses(case, groups.a2a_group, pair, groups.rank % 2, q, k, v, dout, rows, keys, ring=ring)


def _exchange(tensors: list[torch.Tensor], group: Any, send_to: int, recv_from: int) -> list[torch.Tensor]:
    """Send ``tensors`` to global rank ``send_to`` and receive tensors of the same shapes from
    ``recv_from`` (one tag per tensor); returns the received ones."""
    import torch.distributed as dist

    sending = [t.contiguous() for t in tensors]
    received = [torch.empty_like(t) for t in sending]
    requests = [dist.isend(t, dst=send_to, group=group, tag=i) for i, t in enumerate(sending)]
    requests += [dist.irecv(t, src=recv_from, group=group, tag=i) for i, t in enumerate(received)]
    for request in requests:
        request.wait()
    return received


def _to_heads(x: torch.Tensor, group: Any, n: int) -> list[torch.Tensor]:
    """``[B, T, H, D]`` sequence shard -> list over members ``j`` of ``[B, T_j, H / n, D]``: member
    ``j``'s tokens of this rank's head chunk (``all_to_all``)."""
    import torch.distributed as dist

    sending = [c.contiguous() for c in x.chunk(n, dim=2)]
    received = [torch.empty_like(sending[0]) for _ in range(n)]
    dist.all_to_all(received, sending, group=group)
    return received


def _from_heads(parts: list[torch.Tensor], group: Any, n: int) -> torch.Tensor:
    """Inverse of `_to_heads`: list over members of ``[B, T_j, H / n, D]`` -> this rank's
    ``[B, T, H, D]`` (head chunks concatenated in member order)."""
    import torch.distributed as dist

    sending = [p.contiguous() for p in parts]
    received = [torch.empty_like(sending[0]) for _ in range(n)]
    dist.all_to_all(received, sending, group=group)
    return torch.cat(received, dim=2)


def _from_heads_lse(parts: list[torch.Tensor], group: Any, n: int) -> torch.Tensor:
    """`_from_heads` for lse: list of ``[B, H / n, T_j]`` -> ``[B, H, T]``."""
    import torch.distributed as dist

    sending = [p.contiguous() for p in parts]
    received = [torch.empty_like(sending[0]) for _ in range(n)]
    dist.all_to_all(received, sending, group=group)
    return torch.cat(received, dim=1)


class PlantedWindowCPUBackend(RingAttentionCPUBackend):
    """Reads a causal mask the way FA4 after flash-attention #2490 reads TE's ``(-1, 0)`` window:
    ``-1`` is a real left bound, so causal rows see the empty band ``[i + 1, i]``. Wrong the same way
    with and without CP (see the module docstring)."""

    name: ClassVar[str] = "cp-cpu-planted-window"

    def key_bounds(self, case: AttentionCase, seqlen_q: int, seqlen_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """TE's ``-1`` encoding resolved as after #2490: widen only if both bounds are negative."""
        from oracle.masks import diagonal_offset

        left = -1 if case.window_size_left is None else case.window_size_left
        right = -1 if case.window_size_right is None else case.window_size_right
        if case.causal:
            right = 0
        if left < 0 and right < 0:  # both unbounded: no mask at all
            return torch.zeros(seqlen_q, dtype=torch.int64), torch.full((seqlen_q,), seqlen_k, dtype=torch.int64)
        diagonal = torch.arange(seqlen_q) + diagonal_offset(seqlen_q, seqlen_k, case.causal_alignment)
        return (diagonal - left).clamp(0, seqlen_k), (diagonal + right + 1).clamp(0, seqlen_k)


class PlantedMergeCPUBackend(RingAttentionCPUBackend):
    """Forgets the rescaling of the running output when merging a block: harmless for one block
    (non-CP), wrong whenever a row's keys span blocks (CP)."""

    name: ClassVar[str] = "cp-cpu-planted-merge"

    def merge(self, out, lse, out_blk, lse_blk):
        """The planted bug: ``out * exp(lse - lse_new)`` is replaced by ``out``."""
        lse_new = torch.logaddexp(lse, lse_blk)
        w_blk = torch.where(torch.isfinite(lse_new), torch.exp(lse_blk - lse_new), 0.0)
        return out + out_blk * w_blk.transpose(1, 2)[..., None], lse_new


def builtin_backends() -> list[Backend]:
    """The correct CPU CP backend and its two planted variants."""
    return [RingAttentionCPUBackend(), PlantedWindowCPUBackend(), PlantedMergeCPUBackend()]


__all__ = [
    "CAPABILITIES",
    "CP_CPU_DESIGN",
    "PlantedMergeCPUBackend",
    "PlantedWindowCPUBackend",
    "RingAttentionCPUBackend",
    "builtin_backends",
]
