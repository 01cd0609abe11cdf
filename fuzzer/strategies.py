"""Hypothesis strategies for attention cases, biased toward where attention kernels break.

Bias (each an explicit branch of a ``one_of``, so Hypothesis both generates it and can shrink away
from it): sequence lengths of 1, tile boundaries +-1 around 64 and 128 (and 113, 799, 1023, the
lengths flash-attention's own tests use), seqlen_q != seqlen_k in both directions, windows of 0, 1
and >= seqlen, head dims that are not multiples of 16 and up to 512, GQA ratios, and, through
bottom-right alignment with ``seqlen_q > seqlen_k`` or narrow windows, rows with no visible key.

Shrinking: every draw shrinks toward the first alternative / the lower bound, so a shrunk case
tends to batch 1, one head, seqlen 1, bf16, bshd, normal inputs, seed 0, forward only.

Context parallelism: only when a selected backend declares ``capabilities.cp`` *and* the caller
allows ``max_cp_size >= 2`` (the executor knows how many ranks it can start) is ``cp_size`` drawn:
1 half of the time (first, so shrinking leaves CP), else a power of two up to ``max_cp_size``, with a
``cp_comm_type`` (``a2a+p2p`` only for ``cp_size >= 4``). CP cases are drawn so that they can be
laid out (`fuzzer.cp.cp_unsupported_reasons`): bshd/sbhd lengths are ``2 * cp_size`` times a
drawn chunk length (so chunk lengths, not totals, sit on tile edges), thd lengths are either such
multiples (no padding: what TE's FlashAttention needs) or anything (padded), and ``a2a``
(``a2a+p2p``) cases get head counts divisible by ``cp_size`` (by 2). Without CP no extra choice is
drawn, so non-CP generation is unchanged.

Source (lengths): flash-attention ``tests/cute/test_flash_attn.py`` seqlen parametrisations.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from fuzzer.backends.base import Capabilities
from oracle.config import CAUSAL_ALIGNMENTS, CP_COMM_TYPES, DTYPES, INPUT_DISTRIBUTIONS, QKV_FORMATS, AttentionCase, cp_heads_unit
from oracle.config import DOUT_DISTRIBUTIONS, MAX_SCORE_OFFSET, MAX_SEQ_SCALE_LOG2, SCORE_OFFSET_MODES
from oracle.errors import AttnFuzzError

TILE_EDGE_SEQLENS = (1, 2, 63, 64, 65, 113, 127, 128, 129, 255, 256, 257, 799, 1023, 1024, 1025, 2047, 2048, 4096)
COMMON_HEAD_DIMS = (64, 128, 32, 96, 256, 80, 192, 16, 8, 512, 40, 72, 160, 224)
GQA_GROUPS = (1, 2, 4, 8)
CP_SIZES = (2, 4, 8)


class StrategyArgumentError(AttnFuzzError, ValueError):
    """A strategy was called with bounds that cannot produce a case (checked before drawing)."""


def merge_capabilities(caps: Sequence[Capabilities]) -> Capabilities:
    """The union of several backends' capabilities (what at least one of them can run).

    Raises:
        StrategyArgumentError: ``caps`` is empty.
    """
    if not caps:
        raise StrategyArgumentError("capabilities: need at least one backend")

    def union(attr: str, order: Sequence[str]) -> tuple[str, ...]:
        values = {v for c in caps for v in getattr(c, attr)}
        return tuple(v for v in order if v in values)

    return Capabilities(
        dtypes=union("dtypes", DTYPES),
        qkv_formats=union("qkv_formats", QKV_FORMATS),
        max_head_dim=max(c.max_head_dim for c in caps),
        head_dim_multiple=min(c.head_dim_multiple for c in caps),
        head_dim_v_differs=any(c.head_dim_v_differs for c in caps),
        gqa=any(c.gqa for c in caps),
        causal_alignments=union("causal_alignments", CAUSAL_ALIGNMENTS),
        windows=any(c.windows for c in caps),
        softcap=any(c.softcap for c in caps),
        backward=any(c.backward for c in caps),
        lse=any(c.lse for c in caps),
        max_seqlen=max(c.max_seqlen for c in caps),
        cp=any(c.cp for c in caps),
    )


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


def window_sizes(max_seqlen: int) -> st.SearchStrategy[int | None]:
    """``None`` (unbounded), 0, 1, a small band, or a band at least as long as the sequence."""
    return st.one_of(
        st.none(),
        st.sampled_from([0, 1]),
        st.integers(2, max(2, max_seqlen // 2)),
        st.integers(max_seqlen, 2 * max_seqlen),
    )


def cp_configs(max_cp_size: int) -> st.SearchStrategy[tuple[int, str | None]]:
    """``(cp_size, cp_comm_type)``: ``(1, None)`` half of the time, else a size of ``CP_SIZES``
    up to ``max_cp_size`` with a comm type it allows (``a2a+p2p`` needs ``cp_size >= 4``).

    Shrinks toward ``(1, None)``.

    Raises:
        StrategyArgumentError: ``max_cp_size < 1``.
    """
    if isinstance(max_cp_size, bool) or not isinstance(max_cp_size, int) or max_cp_size < 1:
        raise StrategyArgumentError(f"max_cp_size: must be an int >= 1, got {max_cp_size!r}")
    with_cp = [
        (size, comm) for size in CP_SIZES if size <= max_cp_size for comm in CP_COMM_TYPES if comm != "a2a+p2p" or size >= 4
    ]
    return st.sampled_from([(1, None)] * max(1, len(with_cp)) + with_cp)


def _cp_lengths(limit: int, unit: int, padded: bool) -> st.SearchStrategy[int]:
    """A sequence length for ``unit = 2 * cp_size``: a multiple of ``unit`` (chunk length drawn by
    `seqlens`), or with ``padded`` also any length in ``[1, limit]``."""
    multiples = seqlens(max(1, limit // unit)).map(lambda chunk: chunk * unit)
    return st.one_of(multiples, seqlens(limit)) if padded else multiples


SCORE_OFFSETS = (-200.0, -120.0, -60.0, 60.0, 120.0, 200.0)
"""Row-LSE offsets (nats) drawn first: -120 is where ``exp(s - lse)`` in a backward breaks when
``lse`` is kept with too little range; +-200 the far ends."""
INPUT_FAMILIES = ("plain", "score_offset", "llm_like")


@st.composite
def input_specs(draw, *, head_dim: int, backward: bool = True) -> dict:
    """The input fields of one case (`oracle.inputs` documents each), as keyword arguments of
    `AttentionCase`: ``input_distribution`` and one input family drawn with its parameters.

    * ``"plain"``: no family (the case as before the families existed);
    * ``"score_offset"``: ``score_offset`` (one of `SCORE_OFFSETS` or any value within
      ``+-MAX_SCORE_OFFSET``) and ``score_offset_mode`` (head or row);
    * ``"llm_like"``: each of ``qk_rank`` (1-8), ``massive_channels`` (1-4), ``attention_sink``,
      ``seq_scale_log2`` (1-3) and ``peaked_rows`` (1/8, 1/2, 1) on or off;
    * with ``backward``: ``dout_distribution`` (normal, tiny, large, sparse).

    Everything shrinks toward the first option: ``normal`` inputs, no family, normal ``dout``.
    """
    spec: dict = {"input_distribution": draw(st.sampled_from(INPUT_DISTRIBUTIONS))}
    family = draw(st.sampled_from(INPUT_FAMILIES))
    if family == "score_offset":
        offsets = st.floats(-MAX_SCORE_OFFSET, MAX_SCORE_OFFSET, allow_nan=False, allow_infinity=False)
        spec["score_offset"] = draw(st.one_of(st.sampled_from(SCORE_OFFSETS), offsets))
        spec["score_offset_mode"] = draw(st.sampled_from(SCORE_OFFSET_MODES))
    elif family == "llm_like":
        if draw(st.booleans()):
            spec["qk_rank"] = draw(st.integers(1, min(8, head_dim)))
        if draw(st.booleans()):
            spec["massive_channels"] = draw(st.integers(1, min(4, head_dim)))
        spec["attention_sink"] = draw(st.booleans())
        if draw(st.booleans()):
            spec["seq_scale_log2"] = draw(st.integers(1, MAX_SEQ_SCALE_LOG2))
        if draw(st.booleans()):
            spec["peaked_rows"] = draw(st.sampled_from([0.125, 0.5, 1.0]))
    if backward:
        spec["dout_distribution"] = draw(st.sampled_from(DOUT_DISTRIBUTIONS))
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
) -> st.SearchStrategy[AttentionCase]:
    """Cases that at least one backend with ``capabilities`` may run.

    Args:
        capabilities: usually ``merge_capabilities`` of the selected backends.
        max_batch_size: largest batch_size.
        max_heads_kv: largest num_heads_kv (num_heads = num_heads_kv x a GQA group in 1, 2, 4, 8).
        max_seqlen: largest seqlen_q/seqlen_k (default: ``capabilities.max_seqlen``).
        max_work: bound on ``batch_size * num_heads * seqlen_q * seqlen_k * head_dim`` (multiply-adds
            of one matmul): sequence lengths are drawn below the bound the other fields leave.
        allow_backward: draw ``backward=True`` cases when the capabilities allow.
        preferred_head_dims: head dims drawn three times as often as others (JIT backends
            compile one kernel per head dim: the worker passes those already compiled).
        max_cp_size: largest ``cp_size`` to draw when ``capabilities.cp`` (1 = no context
            parallelism; the worker passes its executor's ``max_cp_size``).

    Raises:
        StrategyArgumentError: a bound is below 1 (checked here, before anything is drawn).
    """
    for name, value in (("max_batch_size", max_batch_size), ("max_heads_kv", max_heads_kv), ("max_work", max_work)):
        if value < 1:
            raise StrategyArgumentError(f"{name}: must be >= 1, got {value}")
    if max_seqlen is not None and max_seqlen < 1:
        raise StrategyArgumentError(f"max_seqlen: must be >= 1, got {max_seqlen}")
    cp_configs(max_cp_size)  # checks max_cp_size
    return _attention_cases(
        capabilities=capabilities,
        max_batch_size=max_batch_size,
        max_heads_kv=max_heads_kv,
        max_seqlen=max_seqlen,
        max_work=max_work,
        allow_backward=allow_backward,
        preferred_head_dims=tuple(preferred_head_dims),
        max_cp_size=max_cp_size,
    )


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
) -> AttentionCase:
    """The draw behind `attention_cases` (arguments already checked)."""
    caps = capabilities
    max_seqlen = max_seqlen or caps.max_seqlen
    dtype = draw(st.sampled_from(caps.dtypes))
    qkv_format = draw(st.sampled_from(caps.qkv_formats))
    cp_size, cp_comm_type = draw(cp_configs(max_cp_size)) if caps.cp and max_cp_size >= 2 else (1, None)
    # Three CP cases in four are "TE-shaped": self-attention, top-left, head_dim_v == head_dim, thd
    # without padding, windows only with all_gather/a2a (what TransformerEngine 2.20.2 runs under
    # CP: `fuzzer.backends.te.te_cp_unsupported_reasons`); the fourth probes the rest. Free draws
    # shrink towards TE-shaped ones. Without CP nothing extra is drawn.
    te_shaped = cp_size > 1 and draw(st.integers(0, 3)) < 3
    batch_size = draw(st.integers(1, max_batch_size))
    heads_unit = cp_heads_unit(cp_size, cp_comm_type)
    if heads_unit > 1:
        num_heads_kv = heads_unit * draw(st.integers(1, max(1, max_heads_kv // heads_unit)))
    else:
        num_heads_kv = draw(st.integers(1, max_heads_kv))
    group = draw(st.sampled_from(GQA_GROUPS)) if caps.gqa else 1
    num_heads = num_heads_kv * group
    dims = head_dims(caps.max_head_dim, caps.head_dim_multiple)
    preferred = [d for d in preferred_head_dims if d <= caps.max_head_dim and d % caps.head_dim_multiple == 0]
    if preferred:
        dims = st.one_of(*[st.sampled_from(preferred)] * 3, dims)
    head_dim = draw(dims)
    head_dim_v = head_dim
    if caps.head_dim_v_differs and not te_shaped and draw(st.booleans()):
        head_dim_v = draw(dims)
    budget = max(1, int((max_work / (batch_size * num_heads * max(head_dim, head_dim_v))) ** 0.5))
    limit = max(1, min(max_seqlen, budget))
    seqlens_q = seqlens_k = None
    padded = qkv_format == "thd" and not te_shaped
    lengths = seqlens(limit) if cp_size == 1 else _cp_lengths(limit, 2 * cp_size, padded=padded)
    if qkv_format == "thd":
        seqlens_q = tuple(draw(st.lists(lengths, min_size=batch_size, max_size=batch_size)))
        if not te_shaped and draw(st.booleans()):
            seqlens_k = tuple(draw(st.lists(lengths, min_size=batch_size, max_size=batch_size)))
        else:
            seqlens_k = seqlens_q
        seqlen_q, seqlen_k = max(seqlens_q), max(seqlens_k)
    else:
        seqlen_q = draw(lengths)
        seqlen_k = seqlen_q if te_shaped else draw(st.one_of(st.just(seqlen_q), lengths))
    causal = draw(st.booleans())
    window_left = window_right = None
    if caps.windows and not (te_shaped and cp_comm_type == "p2p") and draw(st.booleans()):
        window_left = draw(window_sizes(max(seqlen_q, seqlen_k)))
        window_right = draw(window_sizes(max(seqlen_q, seqlen_k)))
    if te_shaped and "top_left" in caps.causal_alignments:
        causal_alignment = "top_left"
    else:
        causal_alignment = draw(st.sampled_from(caps.causal_alignments))
    softmax_scale = draw(st.one_of(st.none(), st.floats(0.01, 2.0, allow_nan=False)))
    softcap = None
    if caps.softcap:
        softcap = draw(st.one_of(st.none(), st.sampled_from([1.0, 5.0, 30.0, 50.0]), st.floats(0.5, 100.0)))
    backward = bool(caps.backward and allow_backward and draw(st.booleans()))
    input_spec = draw(input_specs(head_dim=head_dim, backward=backward))
    seed = draw(st.integers(0, 2**32 - 1))
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
        causal=causal,
        causal_alignment=causal_alignment,
        window_size_left=window_left,
        window_size_right=window_right,
        softmax_scale=softmax_scale,
        softcap=softcap,
        backward=backward,
        **input_spec,
        seed=seed,
        cp_size=cp_size,
        cp_comm_type=cp_comm_type,
    )
