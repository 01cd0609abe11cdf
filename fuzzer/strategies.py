"""Hypothesis strategies for attention cases, biased toward where attention kernels break.

Bias (each an explicit branch of a ``one_of``, so Hypothesis both generates it and can shrink away
from it): sequence lengths of 1, tile boundaries +-1 around 64 and 128 (and 113, 799, 1023, the
lengths flash-attention's own tests use), seqlen_q != seqlen_k in both directions, windows of 0, 1
and >= seqlen, head dims that are not multiples of 16 and up to 512, GQA ratios, and, through
bottom-right alignment with ``seqlen_q > seqlen_k`` or narrow windows, rows with no visible key.

Case space: a work budget on the product ``seqlen_q * seqlen_k`` (``max_work`` divided by
``batch_size * num_heads * head_dim``, `seqlen_pairs_budget`), not on each length, so one query
row may be long; one case in `DECODE_SHARE` is decode-like (``seqlen_q`` 1-16 against ``seqlen_k``
up to ``max_seqlen``, biased to `LONG_ROW_EDGES`, +-1 around 1024, 2048, 4096 and 8192), where
split-KV and long-row kernels break. ``max_elements`` bounds each input tensor, so on CPU such a
case stays cheap (`CPU_BOUNDS`); `GPU_BOUNDS` lets an H200 reach 8192 where the budget allows.

Targets: `attention_cases` draws inside one ``Capabilities``; the worker draws each case for one
target backend's capabilities (`fuzzer.coverage.target_plan`) or for their union
(`merge_capabilities`, ``draw="union"``).

Shrinking: every draw shrinks toward the first alternative / the lower bound, so a shrunk case
tends to batch 1, one head, seqlen 1, bf16, bshd, normal inputs, seed 0, forward only.

Input-family weights (the worker's known buckets, `fuzzer.known`): with ``family_weights`` a
family whose cases keep hitting buckets past their hit budget is drawn with a smaller share,
never none (`input_specs`); without, the draw is unchanged.

Kernel templates (the worker's compile budget for JIT backends): with ``kernel_templates``, a
share ``template_share`` of the draws takes the fields that select a compiled kernel
(`KernelTemplate`: dtype, layout, head dims, GQA group, causal, which window bounds are set,
softcap or not, backward) from a case already run, and draws everything else as usual; the
branch choice shrinks toward the free draw.

Context parallelism: only when a selected backend declares ``capabilities.cp`` *and* the caller
allows ``max_cp_size >= 2`` (the executor knows how many ranks it can start) is ``cp_size`` drawn:
1 half of the time (first, so shrinking leaves CP), else a power of two up to ``max_cp_size``, with a
``cp_comm_type`` (``a2a+p2p`` only for ``cp_size >= 4``), three in four "TE-shaped" (those draws
are `fuzzer.cp.strategies`). CP cases are drawn so that they can be laid out
(`fuzzer.backends.cp_layout.cp_unsupported_reasons`): bshd/sbhd lengths are ``2 * cp_size`` times a
drawn chunk length (so chunk lengths, not totals, sit on tile edges), thd lengths are either such
multiples (no padding: what TE's FlashAttention needs) or anything (padded), and ``a2a``
(``a2a+p2p``) cases get head counts divisible by ``cp_size`` (by 2). Without CP no extra choice is
drawn, so non-CP generation is unchanged.

Source (lengths): flash-attention ``tests/cute/test_flash_attn.py`` seqlen parametrisations.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from fuzzer.backends.base import Capabilities
from fuzzer.cp.strategies import NO_CP, CPShape, cp_lengths, cp_shapes, cp_size_and_comm_types
from fuzzer.known import FAMILIES, FULL_WEIGHT, MIN_WEIGHT
from oracle import mask_kinds
from oracle.config import CAUSAL_ALIGNMENTS, DTYPES, INPUT_DISTRIBUTIONS, QKV_FORMATS, AttentionCase
from oracle.config import DOUT_DISTRIBUTIONS, MAX_SCORE_OFFSET, MAX_SEQ_SCALE_LOG2, SCORE_OFFSET_MODES, max_oracle_bytes
from oracle.errors import AttnFuzzError

TILE_EDGE_SEQLENS = (
    1, 2, 63, 64, 65, 113, 127, 128, 129, 255, 256, 257, 799,
    1023, 1024, 1025, 2047, 2048, 2049, 4095, 4096, 4097, 8191, 8192, 8193,
)  # fmt: skip
LONG_ROW_EDGES = (1023, 1024, 1025, 2047, 2048, 2049, 4095, 4096, 4097, 8191, 8192, 8193)
"""Key lengths of decode-like cases: +-1 around the 1024/2048/4096/8192 boundaries where split-KV
and long-row kernels change their tiling (each kept only where ``max_seqlen`` and the work budget
allow)."""
DECODE_MAX_SEQLEN_Q = 16
"""Decode-like cases have ``1 <= seqlen_q <= DECODE_MAX_SEQLEN_Q`` (one token, or a few with
speculative decoding) against ``seqlen_k`` up to ``max_seqlen``."""
DECODE_SHARE = 3
"""One case in ``DECODE_SHARE`` is drawn decode-like (non-CP cases only; shrinks to the other
shapes)."""


@dataclass(frozen=True)
class DrawBounds:
    """Size bounds of drawn cases (see `attention_cases`).

    Attributes:
        max_seqlen: largest seqlen_q/seqlen_k; None = each target's ``capabilities.max_seqlen``.
        max_work: bound on ``batch_size * num_heads * seqlen_q * seqlen_k * head_dim``
            (multiply-adds of one matmul).
        max_elements: bound on the elements of each of q, k, v (``batch_size * seqlen *
            heads * head_dim``); on CPU generating inputs costs about 0.3 us per element, so
            this keeps long-row (decode-like) cases cheap there.
        seed_pool: seeds ``0 .. seed_pool - 1`` are drawn seven times in eight (`seeds`); 0:
            every seed drawn freely.
    """

    max_seqlen: int | None
    max_work: int
    max_elements: int | None
    seed_pool: int = 0


CPU_BOUNDS = DrawBounds(max_seqlen=None, max_work=2**23, max_elements=2**18, seed_pool=8)
"""CPU defaults: cases stay small, many per second. With the worker's other defaults (batch 2,
4 kv heads) the modelled mean cost of a case (0.35 us per input element generated plus 8 ns per
multiply-add, both measured on the 2-core CI machine; `benchmarks/draw_cost.py`, 3,000 draws
each) is 40.4 ms for the CPU backends and 36.8 ms for a plugin with the default ``max_seqlen``
(4096), against 40.2 ms and 34.4 ms with the earlier bound of ``sqrt(2**24 / (batch * heads *
head_dim))`` on each length (ratios 1.01 and 1.07); 2.7% of the plugin's cases are decode-like
with ``seqlen_k > 1024``, which the earlier bound never drew."""
GPU_BOUNDS = DrawBounds(max_seqlen=8192, max_work=2**32, max_elements=2**25)
"""``device="cuda"`` defaults (an H200-class GPU): a case of 2**32 multiply-adds costs
milliseconds in the kernels and the float64 tensor-core oracle, so lengths reach 8192 where the
batch, heads and head dims leave room (8192 x 8192 needs ``batch*heads*head_dim <= 64``);
2**25 elements (64 MiB per bf16 tensor) keep the float64 oracle's working set within its default
bound (`ORACLE_BYTES_PER_ELEMENT` times 2**25 is 6.5 GiB of 8). 8192 is above every backend's
declared soft cap. No seed pool: the GPU's inputs are not cached (`seeds`), and with lanes a case
drawn again runs again (on the H200, 2026-12-02, a pool of 8 made 973 of 3,542 cases repeats)."""

ORACLE_BYTES_PER_ELEMENT = 208
"""Upper bound of `AttentionCase.oracle_working_set_bytes` per unit of ``max_elements`` when every
input tensor has at most ``max_elements`` elements: forward ``<= 5 E`` (q, out and lse ``<= 3 E``,
k and v ``<= 2 E``), twice with backward, plus two score rows per head ``<= 8 E`` (GQA group 8),
8 bytes each: ``8 * (10 + 16) = 208``. `attention_cases` cuts ``max_elements`` to
``max_oracle_bytes() // 208``, so no drawn case is refused by the oracle's bound."""
COMMON_HEAD_DIMS = (64, 128, 32, 96, 256, 80, 192, 16, 8, 512, 40, 72, 160, 224)
GQA_GROUPS = (1, 2, 4, 8)


class StrategyArgumentError(AttnFuzzError, ValueError):
    """A strategy was called with bounds that cannot produce a case (checked before drawing)."""

    exit_code = 2


KERNEL_TEMPLATE_SLOTS = 64
"""The template index is one ``integers(0, max(KERNEL_TEMPLATE_SLOTS, len(templates)) - 1)``
choice, taken modulo the number of templates: its bounds do not change as templates are added
(up to this many), so a choice sequence replayed from an earlier chunk keeps its layout and index
``i < len(templates)`` keeps naming the same (first-seen order) template."""


@dataclass(frozen=True)
class KernelTemplate:
    """The fields of a case that select a JIT backend's compiled kernel (see
    `fuzzer.backends.base.Backend.kernel_key`): a case drawn from a template has exactly these,
    everything else (lengths, batch, heads, window values, softcap value, scale, inputs, seed) is
    drawn freely.

    Attributes:
        dtype, qkv_format, head_dim, head_dim_v, backward: the case's own.
        group: ``num_heads // num_heads_kv`` (1: no GQA).
        causal: the causal flag.
        window_left, window_right: whether ``window_size_left`` / ``window_size_right`` is set.
        softcap: whether ``softcap`` is set.
        causal_alignment: the case's alignment when it matters (causal or a window), else None
            (then drawn as usual: `AttentionCase` stores ``top_left`` for such cases anyway).
        others: ``(kind name, switches)`` of each mask kind that is on and declares no
            ``template_fields`` (`oracle.mask_kinds.MaskKind`), in declaration order.

    The mask fields are each kind's `oracle.mask_kinds.MaskKind.switches` (`switches`).
    """

    dtype: str
    qkv_format: str
    head_dim: int
    head_dim_v: int
    group: int
    causal: bool
    window_left: bool
    window_right: bool
    softcap: bool
    backward: bool
    causal_alignment: str | None = None
    others: tuple[tuple[str, tuple[bool, ...]], ...] = ()

    @classmethod
    def of(cls, case: AttentionCase) -> KernelTemplate:
        """The template of ``case`` (whatever its ``cp_size``: the worker keeps non-CP cases only)."""
        fields: dict[str, bool] = {"causal": False, "window_left": False, "window_right": False, "softcap": False}
        others = []
        for kind in mask_kinds.MASK_KINDS:
            on = kind.switches(case)
            if kind.template_fields:
                fields.update(zip(kind.template_fields, on))
            elif any(on):
                others.append((kind.name, on))
        windowed = case.window_size_left is not None or case.window_size_right is not None
        return cls(
            dtype=case.dtype,
            qkv_format=case.qkv_format,
            head_dim=case.head_dim,
            head_dim_v=case.head_dim_v,
            group=case.num_heads // case.num_heads_kv,
            **fields,
            backward=case.backward,
            causal_alignment=case.causal_alignment if case.causal or windowed else None,
            others=tuple(others),
        )

    def switches(self, kind: mask_kinds.MaskKind) -> tuple[bool, ...]:
        """The template's switches of mask kind ``kind`` (all off for a kind it does not hold)."""
        if kind.template_fields:
            return tuple(bool(getattr(self, name, False)) for name in kind.template_fields)
        return dict(self.others).get(kind.name, (False,) * len(kind.fields))

    def matches(self, case: AttentionCase) -> bool:
        """Whether ``case`` has this template's fields (its alignment only where this one has one)."""
        other = KernelTemplate.of(case)
        if self.causal_alignment is None:
            other = dataclasses.replace(other, causal_alignment=None)
        return other == self


def usable_templates(
    templates: Sequence[KernelTemplate], capabilities: Capabilities, allow_backward: bool = True
) -> tuple[KernelTemplate, ...]:
    """The ``templates`` a draw inside ``capabilities`` may take, in order, without repeats: the
    dtype, layout and alignment declared, head dims within ``max_head_dim`` and multiples of
    ``head_dim_multiple`` (``head_dim_v`` different only with ``head_dim_v_differs``), a GQA
    group of `GQA_GROUPS` (other than 1 only with ``gqa``), each mask kind (`oracle.mask_kinds`:
    windows, softcap, ...) and backward only where declared (backward also only with ``allow_backward``). Template draws are never CP
    draws, so no CP shape can refuse one."""
    caps = capabilities

    def fits(t: KernelTemplate) -> bool:
        dims_ok = all(1 <= d <= caps.max_head_dim and d % caps.head_dim_multiple == 0 for d in (t.head_dim, t.head_dim_v))
        return (
            t.dtype in caps.dtypes
            and t.qkv_format in caps.qkv_formats
            and dims_ok
            and (t.head_dim_v == t.head_dim or caps.head_dim_v_differs)
            and t.group in GQA_GROUPS
            and (t.group == 1 or caps.gqa)
            and all(kind.granted(caps) or not any(t.switches(kind)) for kind in mask_kinds.MASK_KINDS)
            and (not t.backward or (caps.backward and allow_backward))
            and (t.causal_alignment is None or t.causal_alignment in caps.causal_alignments)
        )

    return tuple(t for t in dict.fromkeys(templates) if fits(t))


MERGE_VOCABULARIES: dict[str, tuple[str, ...]] = {
    "dtypes": DTYPES,
    "qkv_formats": QKV_FORMATS,
    "causal_alignments": CAUSAL_ALIGNMENTS,
}
"""Tuple fields of `Capabilities` whose union keeps only (and is ordered by) the values attnfuzz
knows (`oracle.config`); other tuple fields keep every value, in order of first appearance."""
SMALLER_IS_MORE = frozenset({"head_dim_multiple"})
"""Integer fields of `Capabilities` where the smaller value grants more (the union takes the
minimum); `LARGER_IS_MORE` are those where the larger grants more (the maximum)."""
LARGER_IS_MORE = frozenset({"max_head_dim", "max_seqlen"})


def _union_of_tuples(attr: str, values: Sequence[tuple]) -> tuple:
    seen = tuple(dict.fromkeys(v for value in values for v in value))
    order = MERGE_VOCABULARIES.get(attr)
    return seen if order is None else tuple(v for v in order if v in seen)


def merge_rules(capabilities_type: type = Capabilities) -> dict[str, Callable[[str, Sequence[Any]], Any]]:
    """The union rule of every field of ``capabilities_type`` (a `Capabilities` dataclass), by
    the field's kind: ``bool`` -> any; ``tuple[...]`` -> union (`MERGE_VOCABULARIES`); ``int`` ->
    maximum (`LARGER_IS_MORE`) or minimum (`SMALLER_IS_MORE`), which must be said per field.

    Raises:
        TypeError: a field has no rule (an ``int`` in neither set, or another kind): a new field
            must say how it merges before any union is drawn from.
    """
    hints = typing.get_type_hints(capabilities_type)
    rules: dict[str, Callable[[str, Sequence[Any]], Any]] = {}
    for f in dataclasses.fields(capabilities_type):
        kind = hints[f.name]
        if kind is bool:
            rules[f.name] = lambda attr, values: any(values)
        elif typing.get_origin(kind) is tuple:
            rules[f.name] = _union_of_tuples
        elif kind is int and f.name in LARGER_IS_MORE:
            rules[f.name] = lambda attr, values: max(values)
        elif kind is int and f.name in SMALLER_IS_MORE:
            rules[f.name] = lambda attr, values: min(values)
        else:
            raise TypeError(
                f"{capabilities_type.__name__}.{f.name} ({kind}): no union rule; bool and tuple fields merge by kind, "
                "an int field must be named in fuzzer.strategies.LARGER_IS_MORE or SMALLER_IS_MORE"
            )
    return rules


_MERGE_RULES = merge_rules()  # at import: a Capabilities field without a rule fails here, not in a draw


def merge_capabilities(caps: Sequence[Capabilities]) -> Capabilities:
    """The union of several backends' capabilities (what at least one of them can run), field by
    field with `merge_rules` (derived from the dataclass fields, so a new field is never left at
    its default). The result has the type of ``caps[0]``.

    Raises:
        StrategyArgumentError: ``caps`` is empty.
        TypeError: a field has no union rule (`merge_rules`).
    """
    if not caps:
        raise StrategyArgumentError("capabilities: need at least one backend")
    cls = type(caps[0])
    rules = _MERGE_RULES if cls is Capabilities else merge_rules(cls)
    return cls(**{name: rule(name, [getattr(c, name) for c in caps]) for name, rule in rules.items()})


STRATEGY_CACHE_SIZE = 4096
"""Strategy objects kept per builder (`seqlens`, `head_dims`, `window_sizes`, ... and the draw's
inner composites): a case's draw builds its inner strategies from bounds that earlier choices set,
and a new object per draw made Hypothesis validate it and compute its cached properties
(``is_empty``, ``has_reusable_values``) again every time (about a fifth of the engine's samples
in a CPU fuzz run, py-spy, 2026-12-02). The same arguments give the same object, so the same
draws."""


@functools.lru_cache(maxsize=STRATEGY_CACHE_SIZE)
def _sampled_from(options: tuple) -> st.SearchStrategy:
    """``st.sampled_from(options)``, one object per distinct tuple (`STRATEGY_CACHE_SIZE`):
    Hypothesis does not cache ``sampled_from`` strategies, so each draw's new one was validated
    again (with `_integers` and `_same_or`, about a quarter of the drawing's samples in a CPU fuzz
    run, py-spy, 2026-12-02)."""
    return st.sampled_from(options)


@functools.lru_cache(maxsize=STRATEGY_CACHE_SIZE)
def _integers(min_value: int, max_value: int) -> st.SearchStrategy[int]:
    """``st.integers(min_value, max_value)``, one object per distinct bounds (see `_sampled_from`)."""
    return st.integers(min_value, max_value)


@functools.lru_cache(maxsize=STRATEGY_CACHE_SIZE)
def _same_or(value: int, other: st.SearchStrategy[int]) -> st.SearchStrategy[int]:
    """``st.one_of(st.just(value), other)``, one object per distinct arguments (see `_sampled_from`)."""
    return st.one_of(st.just(value), other)


@functools.lru_cache(maxsize=STRATEGY_CACHE_SIZE)
def _lists_of(elements: st.SearchStrategy[int], size: int) -> st.SearchStrategy[list[int]]:
    """``st.lists(elements, min_size=size, max_size=size)``, one object per distinct arguments."""
    return st.lists(elements, min_size=size, max_size=size)


@functools.lru_cache(maxsize=STRATEGY_CACHE_SIZE)
def seqlens(max_seqlen: int) -> st.SearchStrategy[int]:
    """A sequence length in ``[1, max_seqlen]``: small values, tile edges, or anything.

    Shrinks toward 1.

    Raises:
        StrategyArgumentError: ``max_seqlen < 1``.
    """
    if max_seqlen < 1:
        raise StrategyArgumentError(f"max_seqlen: must be >= 1, got {max_seqlen}")
    edges = [n for n in TILE_EDGE_SEQLENS if n <= max_seqlen]
    return st.one_of(
        st.integers(1, min(16, max_seqlen)),
        st.sampled_from(edges),
        st.integers(1, max_seqlen),
    )


@functools.lru_cache(maxsize=STRATEGY_CACHE_SIZE)
def decode_seqlens_k(max_seqlen: int) -> st.SearchStrategy[int]:
    """``seqlen_k`` of a decode-like case: any length in ``[1, max_seqlen]`` (first, so it shrinks
    toward 1), one of `LONG_ROW_EDGES` that fits, or a long row in the upper half.

    Raises:
        StrategyArgumentError: ``max_seqlen < 1``.
    """
    base = seqlens(max_seqlen)
    edges = [n for n in LONG_ROW_EDGES if n <= max_seqlen]
    long_rows = st.integers(max(1, max_seqlen // 2), max_seqlen)
    return st.one_of(base, st.sampled_from(edges), long_rows) if edges else st.one_of(base, long_rows)


def seqlen_pairs_budget(max_work: int, batch_size: int, num_heads: int, head_dim: int) -> int:
    """How many (query, key) pairs one case may have: ``max_work // (batch_size * num_heads *
    head_dim)``, at least 1. ``seqlen_q * seqlen_k`` (for thd: the longest query times the longest
    key sequence) is drawn at or below it, so a case's work ``batch_size * num_heads * seqlen_q *
    seqlen_k * head_dim`` (multiply-adds of one matmul) stays within ``max_work``: one query may
    see many keys (decode), many queries few keys, or both be medium."""
    return max(1, max_work // (batch_size * num_heads * head_dim))


def default_bounds(device: str) -> DrawBounds:
    """The default bounds of a worker on ``device``: `CPU_BOUNDS` or `GPU_BOUNDS`.

    Raises:
        StrategyArgumentError: ``device`` is not ``"cpu"`` or ``"cuda"``.
    """
    if device == "cpu":
        return CPU_BOUNDS
    if device == "cuda":
        return GPU_BOUNDS
    raise StrategyArgumentError(f"device: unknown value {device!r} (allowed: cpu, cuda)")


@functools.lru_cache(maxsize=STRATEGY_CACHE_SIZE)
def head_dims(max_head_dim: int, multiple: int = 1) -> st.SearchStrategy[int]:
    """A head dimension: common sizes first, then any multiple of ``multiple`` up to the max.

    Raises:
        StrategyArgumentError: no head dim satisfies the bounds.
    """
    if max_head_dim < multiple or multiple < 1:
        raise StrategyArgumentError(f"max_head_dim={max_head_dim}, multiple={multiple}: no head_dim fits")
    common = [d for d in COMMON_HEAD_DIMS if d <= max_head_dim and d % multiple == 0]
    anything = st.integers(1, max_head_dim // multiple).map(lambda n: n * multiple)
    return st.one_of(st.sampled_from(common), anything) if common else anything


@functools.lru_cache(maxsize=STRATEGY_CACHE_SIZE)
def window_sizes(max_seqlen: int) -> st.SearchStrategy[int | None]:
    """``None`` (unbounded), 0, 1, a small band, or a band at least as long as the sequence."""
    return st.one_of(
        st.none(),
        st.sampled_from([0, 1]),
        st.integers(2, max(2, max_seqlen // 2)),
        st.integers(max_seqlen, 2 * max_seqlen),
    )


@functools.lru_cache(maxsize=STRATEGY_CACHE_SIZE)
def window_bounds(max_seqlen: int) -> st.SearchStrategy[int]:
    """A set window bound: `window_sizes` without ``None`` (a template's window that is set)."""
    return st.one_of(
        st.sampled_from([0, 1]),
        st.integers(2, max(2, max_seqlen // 2)),
        st.integers(max_seqlen, 2 * max_seqlen),
    )


def cp_configs(max_cp_size: int) -> st.SearchStrategy[tuple[int, str | None]]:
    """``(cp_size, cp_comm_type)``: ``(1, None)`` half of the time, else a size of
    `fuzzer.cp.strategies.CP_SIZES` up to ``max_cp_size`` with a comm type it allows (``a2a+p2p``
    needs ``cp_size >= 4``).

    Shrinks toward ``(1, None)``.

    Raises:
        StrategyArgumentError: ``max_cp_size < 1``.
    """
    if isinstance(max_cp_size, bool) or not isinstance(max_cp_size, int) or max_cp_size < 1:
        raise StrategyArgumentError(f"max_cp_size: must be an int >= 1, got {max_cp_size!r}")
    return cp_size_and_comm_types(max_cp_size)


@functools.lru_cache(maxsize=STRATEGY_CACHE_SIZE)  # one strategy object per distinct arguments
@st.composite
def _sequence_lengths(
    draw, qkv_format: str, batch_size: int, max_q: int, max_k: int, pairs: int, cp: CPShape
) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None, int, int]:
    """``(seqlens_q, seqlens_k, seqlen_q, seqlen_k)`` with ``seqlen_q * seqlen_k <= pairs`` (the
    maxima for thd; see `seqlen_pairs_budget`), ``seqlen_q <= max_q`` and ``seqlen_k <= max_k``.

    Non-CP cases are decode-like one time in `DECODE_SHARE` (``seqlen_q`` in ``[1,
    DECODE_MAX_SEQLEN_Q]``, ``seqlen_k`` from `decode_seqlens_k`), else ``seqlen_q`` is drawn up to
    ``isqrt(pairs)`` and ``seqlen_k`` equal to it or up to ``pairs // seqlen_q`` (so a short
    query row may see a long key row). CP cases keep the CP layouts of
    `fuzzer.cp.strategies.cp_lengths` with the same budget (self-attention ones, `CPShape`:
    ``seqlen_k == seqlen_q``). The budget never forces a length below 1 (or below one CP unit).
    """
    thd = qkv_format == "thd"
    cp_size, self_attention = cp.cp_size, cp.is_self_attention
    if cp_size > 1:
        unit = cp.length_unit
        padded = thd and not cp.te_shaped
        limit_q = max(1, min(max_q, max_k, math.isqrt(pairs)) if self_attention else min(max_q, math.isqrt(pairs)))

        def lengths(limit: int) -> st.SearchStrategy[int]:
            return cp_lengths(max(1, limit), unit, padded, seqlens)

    else:
        decode = draw(_integers(0, DECODE_SHARE - 1)) == DECODE_SHARE - 1
        limit_q = max(1, min(max_q, pairs, DECODE_MAX_SEQLEN_Q) if decode else min(max_q, math.isqrt(pairs)))
        lengths = seqlens
    if thd:
        seqlens_q = tuple(draw(_lists_of(lengths(limit_q), batch_size)))
        limit_k = max(1, min(max_k, pairs // max(seqlens_q)))
        if cp_size == 1 and decode:
            seqlens_k = tuple(draw(_lists_of(decode_seqlens_k(limit_k), batch_size)))
        elif not self_attention and draw(st.booleans()):
            seqlens_k = tuple(draw(_lists_of(lengths(limit_k), batch_size)))
        else:
            seqlens_k = seqlens_q
        return seqlens_q, seqlens_k, max(seqlens_q), max(seqlens_k)
    seqlen_q = draw(lengths(limit_q))
    limit_k = max(1, min(max_k, pairs // seqlen_q))
    if self_attention:
        seqlen_k = seqlen_q
    elif cp_size == 1 and decode:
        seqlen_k = draw(decode_seqlens_k(limit_k))
    elif seqlen_q <= limit_k:
        seqlen_k = draw(_same_or(seqlen_q, lengths(limit_k)))
    else:
        seqlen_k = draw(lengths(limit_k))
    return None, None, seqlen_q, seqlen_k


SCORE_OFFSETS = (-200.0, -120.0, -60.0, 60.0, 120.0, 200.0)
"""Row-LSE offsets (nats) drawn first: -120 is where ``exp(s - lse)`` in a backward breaks when
``lse`` is kept with too little range; +-200 the far ends."""
SCORE_OFFSET_VALUES = st.one_of(
    st.sampled_from(SCORE_OFFSETS), st.floats(-MAX_SCORE_OFFSET, MAX_SCORE_OFFSET, allow_nan=False, allow_infinity=False)
)
"""A score offset: one of `SCORE_OFFSETS` or any finite value within ``+-MAX_SCORE_OFFSET`` (one
object for every draw, as `SOFTCAPS`)."""
INPUT_FAMILIES = ("plain", "score_offset", "llm_like")


LLM_LIKE_FAMILIES = ("qk_rank", "massive_channels", "attention_sink", "seq_scale_log2", "peaked_rows")
"""The families of `fuzzer.known.FAMILIES` drawn in the ``llm_like`` branch of `input_specs`."""


def check_family_weights(family_weights: Any) -> tuple[tuple[str, int], ...]:
    """``family_weights`` as `input_specs` takes it: ``(family, weight)`` pairs, each family one of
    `fuzzer.known.FAMILIES` at most once, each weight an integer in ``[MIN_WEIGHT, FULL_WEIGHT]``
    (`fuzzer.known`); returned in `FAMILIES` order without the entries at `FULL_WEIGHT`.

    Raises:
        StrategyArgumentError: an unknown family, a repeated one, or a weight out of range.
    """
    seen: dict[str, int] = {}
    for entry in family_weights:
        try:
            name, weight = entry
        except (TypeError, ValueError):
            raise StrategyArgumentError(f"family_weights: entries must be (family, weight) pairs, got {entry!r}") from None
        if name not in FAMILIES:
            raise StrategyArgumentError(f"family_weights: unknown family {name!r} (allowed: {', '.join(FAMILIES)})")
        if name in seen:
            raise StrategyArgumentError(f"family_weights: {name!r} given twice")
        if isinstance(weight, bool) or not isinstance(weight, int) or not MIN_WEIGHT <= weight <= FULL_WEIGHT:
            raise StrategyArgumentError(
                f"family_weights: the weight of {name!r} must be an integer in [{MIN_WEIGHT}, {FULL_WEIGHT}], got {weight!r}"
            )
        seen[name] = weight
    return tuple((name, seen[name]) for name in FAMILIES if seen.get(name, FULL_WEIGHT) < FULL_WEIGHT)


@functools.lru_cache(maxsize=STRATEGY_CACHE_SIZE)  # one strategy object per distinct arguments
@st.composite
def input_specs(
    draw, *, head_dim: int, backward: bool = True, dtype: str = "bfloat16", family_weights: tuple[tuple[str, int], ...] = ()
) -> dict:
    """The input fields of one case (`oracle.inputs` documents each), as keyword arguments of
    `AttentionCase`: ``input_distribution`` and one input family drawn with its parameters.

    * ``"plain"``: no family (the case as before the families existed);
    * ``"score_offset"``: ``score_offset`` (one of `SCORE_OFFSETS` or any value within
      ``+-MAX_SCORE_OFFSET``) and ``score_offset_mode`` (head or row);
    * ``"llm_like"``: each of ``qk_rank`` (1-8), ``massive_channels`` (1-4), ``attention_sink``,
      ``seq_scale_log2`` (1-3) and ``peaked_rows`` (1/8, 1/2, 1) on or off, on ``normal`` inputs
      (``massive_channels`` only for bfloat16/float16: in float32 the few big products reach
      scores whose rounding outgrows the error model, `oracle.inputs`);
    * with ``backward``: ``dout_distribution`` (normal, tiny, large, sparse).

    Everything shrinks toward the first option: ``normal`` inputs, no family, normal ``dout``.

    ``family_weights`` (`check_family_weights`; the worker's `fuzzer.known.family_weights` of the
    families whose recent cases hit spent buckets): a family of weight ``w`` is drawn with its
    default share times ``w / FULL_WEIGHT`` (``score_offset`` and ``llm_like`` a third of the
    cases each, each ``llm_like`` field on in half of those, a ``dout_distribution`` other than
    normal in three backward cases of four), the rest going to its "off" option; the ``llm_like``
    branch takes the largest weight of `LLM_LIKE_FAMILIES` and each field its own relative to it,
    so a field's share is scaled once. A weighted choice is one ``integers`` choice that shrinks
    to 0, the "off" option. Empty (the default): the draw as without weights, choice for choice.
    """
    weights = dict(family_weights)
    full = FULL_WEIGHT
    w_offset = weights.get("score_offset", full)
    w_llm = max(weights.get(name, full) for name in LLM_LIKE_FAMILIES)
    if w_offset < full or w_llm < full:
        n = draw(_integers(0, 3 * full - 1))  # plain below 3 * full - w_offset - w_llm, then score_offset, then llm_like
        family = "plain" if n < 3 * full - w_offset - w_llm else "score_offset" if n < 3 * full - w_llm else "llm_like"
    else:
        family = draw(_sampled_from(INPUT_FAMILIES))

    def is_on(name: str) -> bool:
        """An ``llm_like`` field on or off: half of the time at full weight (``st.booleans()``)."""
        w = weights.get(name, full)
        if w >= w_llm:
            return draw(st.booleans())
        return draw(_integers(0, 2 * w_llm - 1)) >= 2 * w_llm - w

    # LLM-like features replace the q/k statistics: they are drawn on normal inputs only (with
    # large_logits or near_constant keys they reach scores the error model under-covers in fp32,
    # see `oracle.inputs`).
    distributions = INPUT_DISTRIBUTIONS if family != "llm_like" else INPUT_DISTRIBUTIONS[:1]
    spec: dict = {"input_distribution": draw(_sampled_from(tuple(distributions)))}
    if family == "score_offset":
        spec["score_offset"] = draw(SCORE_OFFSET_VALUES)
        spec["score_offset_mode"] = draw(_sampled_from(tuple(SCORE_OFFSET_MODES)))
    elif family == "llm_like":
        if is_on("qk_rank"):
            spec["qk_rank"] = draw(_integers(1, min(8, head_dim)))
        if dtype != "float32" and is_on("massive_channels"):
            spec["massive_channels"] = draw(_integers(1, min(4, head_dim)))
        spec["attention_sink"] = is_on("attention_sink")
        if is_on("seq_scale_log2"):
            spec["seq_scale_log2"] = draw(_integers(1, MAX_SEQ_SCALE_LOG2))
        if is_on("peaked_rows"):
            spec["peaked_rows"] = draw(_sampled_from((0.125, 0.5, 1.0)))
    if backward:
        w_dout = weights.get("dout_distribution", full)
        if w_dout < full:  # normal below 4 * full - 3 * w_dout, then one of the other three
            others = tuple(d for d in DOUT_DISTRIBUTIONS if d != DOUT_DISTRIBUTIONS[0])
            if draw(_integers(0, 4 * full - 1)) < 4 * full - len(others) * w_dout:
                spec["dout_distribution"] = DOUT_DISTRIBUTIONS[0]
            else:
                spec["dout_distribution"] = draw(_sampled_from(others))
        else:
            spec["dout_distribution"] = draw(_sampled_from(tuple(DOUT_DISTRIBUTIONS)))
    return spec


def attention_cases(
    *,
    capabilities: Capabilities,
    max_batch_size: int = 4,
    max_heads_kv: int = 4,
    max_seqlen: int | None = None,
    max_work: int = 2**26,
    allow_backward: bool = True,
    preferred_head_dims: tuple[int, ...] = (),
    max_cp_size: int = 1,
    max_elements: int | None = None,
    kernel_templates: tuple[KernelTemplate, ...] = (),
    template_share: float = 0.0,
    seed_pool: int = 0,
    family_weights: Sequence[tuple[str, int]] = (),
) -> st.SearchStrategy[AttentionCase]:
    """Cases that at least one backend with ``capabilities`` may run.

    Args:
        capabilities: usually ``merge_capabilities`` of the selected backends.
        max_batch_size: largest batch_size.
        max_heads_kv: largest num_heads_kv (num_heads = num_heads_kv x a GQA group in 1, 2, 4, 8).
        max_seqlen: largest seqlen_q/seqlen_k (default: ``capabilities.max_seqlen``).
        max_work: bound on ``batch_size * num_heads * seqlen_q * seqlen_k * head_dim`` (multiply-adds
            of one matmul, with the larger of head_dim and head_dim_v): the product ``seqlen_q *
            seqlen_k`` is drawn below the bound the other fields leave (`seqlen_pairs_budget`),
            so one query may see ``max_seqlen`` keys.
        allow_backward: draw ``backward=True`` cases when the capabilities allow.
        preferred_head_dims: head dims drawn three times as often as others (JIT backends
            compile one kernel per head dim: the worker passes those already compiled).
        max_cp_size: largest ``cp_size`` to draw when ``capabilities.cp`` (1 = no context
            parallelism; the worker passes its executor's ``max_cp_size``).
        max_elements: bound on the elements of each of q, k and v (``batch_size * seqlen_q *
            num_heads * head_dim``, ``batch_size * seqlen_k * num_heads_kv * head_dim``); None = no
            bound. Lengths are not cut below 1 (or one CP unit) by it. Cut to
            ``max_oracle_bytes() // ORACLE_BYTES_PER_ELEMENT``.
        kernel_templates: kernel-selecting fields of cases already run (`KernelTemplate`; the
            worker passes a JIT backend's, to reuse its compiled kernels). Those the capabilities
            cannot take are dropped first (`usable_templates`); with none left (or
            ``template_share == 0``) nothing extra is drawn and generation is as without them.
        template_share: the share of draws, in ``[0, 1]``, that take one of the templates (in
            steps of 1/100): an ``integers(0, 99)`` choice, template when ``>= 100 - round(100 *
            template_share)``, so it shrinks to 0, the free draw (toward the smallest case, as
            everything else here); then the template index (`KERNEL_TEMPLATE_SLOTS`), drawn in
            both branches so that the branch choice does not move later choices. A template draw
            is never a CP draw.
        seed_pool: seeds ``0 .. seed_pool - 1`` are drawn seven times in eight (`seeds`); 0 (the
            default): any 32-bit seed.
        family_weights: ``(family, weight)`` pairs of input families drawn less than their
            default share (`input_specs`, `check_family_weights`; the worker passes
            `fuzzer.known.family_weights` of the families whose cases hit spent buckets). Empty
            (the default) or every weight at `fuzzer.known.FULL_WEIGHT`: the draw as without.

    Raises:
        StrategyArgumentError: a bound is below 1, ``seed_pool`` is negative, ``template_share``
            is outside ``[0, 1]``, a template is not a `KernelTemplate` or ``family_weights``
            names an unknown family or a weight out of range (checked here, before anything is
            drawn).
    """
    bounds = (("max_batch_size", max_batch_size), ("max_heads_kv", max_heads_kv), ("max_work", max_work))
    if max_elements is not None:
        bounds += (("max_elements", max_elements),)
    for name, value in bounds:
        if value < 1:
            raise StrategyArgumentError(f"{name}: must be >= 1, got {value}")
    if max_elements is not None:
        max_elements = max(1, min(max_elements, max_oracle_bytes() // ORACLE_BYTES_PER_ELEMENT))
    if max_seqlen is not None and max_seqlen < 1:
        raise StrategyArgumentError(f"max_seqlen: must be >= 1, got {max_seqlen}")
    cp_configs(max_cp_size)  # checks max_cp_size
    if isinstance(seed_pool, bool) or not isinstance(seed_pool, int) or seed_pool < 0:
        raise StrategyArgumentError(f"seed_pool: must be an integer >= 0, got {seed_pool!r}")
    if isinstance(template_share, bool) or not isinstance(template_share, (int, float)) or not 0 <= template_share <= 1:
        raise StrategyArgumentError(f"template_share: must be a number in [0, 1], got {template_share!r}")
    for t in kernel_templates:
        if not isinstance(t, KernelTemplate):
            raise StrategyArgumentError(f"kernel_templates: must be KernelTemplate instances, got {t!r}")
    weights = check_family_weights(family_weights)
    templates = usable_templates(kernel_templates, capabilities, allow_backward)
    share_pct = round(100 * template_share)
    if not share_pct:
        templates = ()
    return _attention_cases(
        capabilities=capabilities,
        max_batch_size=max_batch_size,
        max_heads_kv=max_heads_kv,
        max_seqlen=max_seqlen,
        max_work=max_work,
        allow_backward=allow_backward,
        preferred_head_dims=tuple(preferred_head_dims),
        max_cp_size=max_cp_size,
        max_elements=max_elements,
        templates=templates,
        share_pct=share_pct,
        seed_pool=seed_pool,
        family_weights=weights,
    )


SOFTMAX_SCALES = st.one_of(st.none(), st.floats(0.01, 2.0, allow_nan=False))
"""``softmax_scale``: the kernel's default (None) or any scale in ``[0.01, 2]``."""
SOFTCAPS = st.one_of(st.sampled_from([1.0, 5.0, 30.0, 50.0]), st.floats(0.5, 100.0))
"""A ``softcap`` when one is drawn: the usual values first, then any in ``[0.5, 100]``."""

@functools.lru_cache(maxsize=STRATEGY_CACHE_SIZE)  # one strategy object per pool (see `_sampled_from`)
@st.composite
def seeds(draw, pool: int = 0) -> int:
    """A case's ``seed`` (``0 <= seed < 2**32``): with ``pool`` (> 0), seven draws in eight one of
    the pooled seeds ``0 .. pool - 1``, else any 32-bit seed (shrinks toward the pool, then
    toward seed 0); with ``pool`` 0 any 32-bit seed (shrinks toward 0). The CPU's default
    (`CPU_BOUNDS`) pools 8 seeds.

    Why a pool: a case's inputs are a pure function of ``(seed, stream, index)``
    (`oracle.inputs.hash_normal`, one stream per tensor role), and the CPU engine keeps each
    ``(seed, stream)``'s samples (`oracle.inputs._hash_normal_cached`), so a case on a pooled
    seed copies its inputs instead of computing them: on the 2-core CPU machine the inputs were
    16% of a worker's samples (py-spy, 2026-12-02, `benchmarks/pyspy_split.py`), about as much as
    the float64 oracle. The values still differ from case to case (the shape decides which
    indices a tensor takes), what a case tests is its shape, mask and input family, and one draw
    in eight keeps the whole seed space reachable."""
    if pool and draw(_integers(0, 7)) < 7:
        return draw(_integers(0, pool - 1))
    return draw(_integers(0, 2**32 - 1))


@functools.lru_cache(maxsize=STRATEGY_CACHE_SIZE)
def _head_dims_preferring(max_head_dim: int, multiple: int, preferred_head_dims: tuple[int, ...]) -> st.SearchStrategy[int]:
    """`head_dims`, three times as likely one of ``preferred_head_dims`` that fit (the head-dim pool
    of ``reuse_kernels``)."""
    dims = head_dims(max_head_dim, multiple)
    preferred = [d for d in preferred_head_dims if d <= max_head_dim and d % multiple == 0]
    return st.one_of(*[st.sampled_from(preferred)] * 3, dims) if preferred else dims


def _mask_kind_fields(
    draw: Callable[[st.SearchStrategy], Any], kind: mask_kinds.MaskKind, caps: Capabilities, cp: CPShape, on: tuple[bool, ...] | None, longest: int
) -> dict[str, Any]:
    """The fields of one mask kind (`oracle.mask_kinds.MaskKind`) of a drawn case, as keyword
    arguments of `AttentionCase`, drawn with the case's own ``draw`` (a plain function, not a
    strategy of its own: a nested strategy adds spans, and spans change how Hypothesis generates).

    With a template's switches ``on``, exactly those fields are set (a bound from
    `window_bounds`, a scale from `SOFTCAPS`, a flag True). Else, where ``caps`` grants the kind
    (and a TE-shaped ``p2p`` CP shape does not leave it off), it is on one time in ``kind.share``
    (one boolean for 2, one ``integers(0, share - 1)`` equal to ``share - 1`` above, shrinking to
    off; no choice for None) and each field is then drawn: a flag as a boolean, a bound from
    `window_sizes` (None included), a scale from `SOFTCAPS`. Off fields are False (flag) or None.

    The draws of the declared kinds are the draws made before the declaration existed, choice
    for choice: causal one boolean; windows one boolean then two `window_sizes`; softcap (one
    case in four: two in three made most cases unsupported on te-fused, torch-sdpa-*, te-fa4,
    issue 15) one ``integers(0, 3)`` then `SOFTCAPS`.
    """
    off: Any = False if kind.switch == "flag" else None

    def value() -> Any:
        if kind.switch == "flag":
            return True
        if kind.switch == "bound":
            return draw(window_bounds(longest))
        return draw(SOFTCAPS)

    if on is not None:
        return {name: value() if is_on else off for name, is_on in zip(kind.fields, on)}
    if not kind.granted(caps) or (kind.off_in_te_shaped_p2p and not cp.allows_windows):
        return dict.fromkeys(kind.fields, off)
    if kind.share is None:
        if kind.switch == "flag":
            return {name: draw(st.booleans()) for name in kind.fields}
    elif not (draw(st.booleans()) if kind.share == 2 else draw(_integers(0, kind.share - 1)) == kind.share - 1):
        return dict.fromkeys(kind.fields, off)
    if kind.switch == "bound":
        return {name: draw(window_sizes(longest)) for name in kind.fields}
    return {name: value() for name in kind.fields}


@st.composite
def _attention_cases(
    draw,
    *,
    capabilities: Capabilities,
    max_batch_size: int = 4,
    max_heads_kv: int = 4,
    max_seqlen: int | None = None,
    max_work: int = 2**26,
    allow_backward: bool = True,
    preferred_head_dims: tuple[int, ...] = (),
    max_cp_size: int = 1,
    max_elements: int | None = None,
    templates: tuple[KernelTemplate, ...] = (),
    share_pct: int = 0,
    seed_pool: int = 0,
    family_weights: tuple[tuple[str, int], ...] = (),
) -> AttentionCase:
    """The draw behind `attention_cases` (arguments already checked, ``templates`` already the
    usable ones, ``family_weights`` as `check_family_weights` returns them)."""
    caps = capabilities
    max_seqlen = max_seqlen or caps.max_seqlen
    t: KernelTemplate | None = None
    if templates:
        use_template = draw(_integers(0, 99)) >= 100 - share_pct  # shrinks to 0: the free draw
        index = draw(_integers(0, max(KERNEL_TEMPLATE_SLOTS, len(templates)) - 1))
        if use_template:
            t = templates[index % len(templates)]
    dtype = t.dtype if t else draw(_sampled_from(tuple(caps.dtypes)))
    qkv_format = t.qkv_format if t else draw(_sampled_from(tuple(caps.qkv_formats)))
    # the CP shape (and three CP cases in four "TE-shaped": `fuzzer.cp.strategies`); without CP
    # nothing extra is drawn; a template draw is never CP
    cp = draw(cp_shapes(max_cp_size)) if caps.cp and max_cp_size >= 2 and t is None else NO_CP
    batch_size = draw(_integers(1, max_batch_size))
    heads_unit = cp.heads_unit
    if heads_unit > 1:
        num_heads_kv = heads_unit * draw(_integers(1, max(1, max_heads_kv // heads_unit)))
    else:
        num_heads_kv = draw(_integers(1, max_heads_kv))
    if t:
        group = t.group
    else:
        group = draw(_sampled_from(tuple(GQA_GROUPS))) if caps.gqa else 1
    num_heads = num_heads_kv * group
    if t:
        head_dim, head_dim_v = t.head_dim, t.head_dim_v
    else:
        dims = _head_dims_preferring(caps.max_head_dim, caps.head_dim_multiple, preferred_head_dims)
        head_dim = draw(dims)
        head_dim_v = head_dim
        if caps.head_dim_v_differs and cp.allows_head_dim_v_differs and draw(st.booleans()):
            head_dim_v = draw(dims)
    widest = max(head_dim, head_dim_v)
    pairs = seqlen_pairs_budget(max_work, batch_size, num_heads, widest)
    max_q = max_k = max_seqlen
    if max_elements is not None:
        max_q = max(1, min(max_q, max_elements // (batch_size * num_heads * widest)))
        max_k = max(1, min(max_k, max_elements // (batch_size * num_heads_kv * widest)))
    seqlens_q, seqlens_k, seqlen_q, seqlen_k = draw(
        _sequence_lengths(qkv_format, batch_size, max_q, max_k, pairs, cp)
    )
    longest = max(seqlen_q, seqlen_k)
    mask = {}  # each mask kind's fields (`oracle.mask_kinds`), drawn at its stage
    for kind in mask_kinds.kinds("mask"):
        mask.update(_mask_kind_fields(draw, kind, caps, cp, t.switches(kind) if t else None, longest))
    if t and t.causal_alignment is not None:
        causal_alignment = t.causal_alignment
    elif cp.prefers_top_left and "top_left" in caps.causal_alignments:
        causal_alignment = "top_left"
    else:
        causal_alignment = draw(_sampled_from(tuple(caps.causal_alignments)))
    softmax_scale = draw(SOFTMAX_SCALES)
    for kind in mask_kinds.kinds("scores"):
        mask.update(_mask_kind_fields(draw, kind, caps, cp, t.switches(kind) if t else None, longest))
    backward = t.backward if t else bool(caps.backward and allow_backward and draw(st.booleans()))
    if family_weights:
        input_spec = draw(input_specs(head_dim=head_dim, backward=backward, dtype=dtype, family_weights=family_weights))
    else:  # the strategy objects of the draw without weights
        input_spec = draw(input_specs(head_dim=head_dim, backward=backward, dtype=dtype))
    seed = draw(seeds(seed_pool))
    return AttentionCase(
        batch_size=batch_size,
        seqlen_q=seqlen_q,
        seqlen_k=seqlen_k,
        num_heads=num_heads,
        num_heads_kv=num_heads_kv,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        dtype=dtype,
        qkv_format=qkv_format,
        seqlens_q=seqlens_q,
        seqlens_k=seqlens_k,
        causal_alignment=causal_alignment,
        softmax_scale=softmax_scale,
        **mask,
        backward=backward,
        **input_spec,
        seed=seed,
        cp_size=cp.cp_size,
        cp_comm_type=cp.cp_comm_type,
    )
