"""attnfuzz's portable core: deterministic inputs and their families, the mask, a dense float64
reference and the tile judge, in torch and the standard library only (no import of attnfuzz).

Two users, one source:

* attnfuzz itself: ``oracle/inputs.py`` draws every case's inputs through `float64_inputs` and
  `dout_values` (with its own prefetching draw) and takes the hash, the constants and the input
  families from here; the mask of ``oracle/masks.py`` (``key_bounds``, ``visible_mask``) is
  `key_bounds` and `sequence_mask`;
* the exported repro: ``service/export/repro.py`` copies this file, byte for byte, into every
  pytest file it writes (between the lines ``# ---- attnfuzz oracle/portable.py`` and ``# ---- end
  of oracle/portable.py``), so the file regenerates the inputs bit for bit and judges as the
  fuzzer does with attnfuzz's own code (``tests/service/test_export.py`` checks the copy).

So that the copy runs inside another file: no ``from __future__`` import, no import of attnfuzz,
annotations that evaluate without one. ``case`` is any object with the field names of
``AttentionCase`` (``oracle/config.py``: ``seed``, ``batch_size``, ``seqlen_q``, ``num_heads``,
``head_dim``, ``dtype``, ``qkv_format``, ``causal``, ``causal_alignment``,
``window_size_left``/``right``, ``softmax_scale``, ``softcap``, ``backward``,
``input_distribution``, the input-family fields) and its properties (``group_size``,
``is_varlen``, ``seqlens_q_list``/``seqlens_k_list``, ``total_q``/``total_k``,
``input_families``: the family fields that differ from their defaults). The conventions (the
canonical layout, the mask, the streams and families) are written down in ``oracle/config.py``,
``oracle/masks.py`` and ``oracle/inputs.py``; the dense reference and the judge are checked
against the engine of ``oracle/reference.py`` and the verdicts of ``oracle/compare.py``
(``tests/oracle/test_portable.py``, and the planted-bug tests of ``tests/service/test_export.py``).
"""

import math

import torch

STREAM_Q, STREAM_K, STREAM_V, STREAM_DOUT = 1, 2, 3, 4
STREAM_Q_OUTLIERS, STREAM_K_OUTLIERS, STREAM_K_BASE = 5, 6, 7
STREAM_Q_BASIS, STREAM_K_BASIS, STREAM_MASSIVE, STREAM_PEAKED, STREAM_OFFSET, STREAM_DOUT_SPARSE = 8, 9, 10, 11, 12, 13

MASSIVE_Q_GAIN, MASSIVE_K_GAIN = 4.0, 16.0
SINK_CHANNEL = 0
SINK_MARGIN = 4.0  # nats above ln(keys of the sequence)
PEAK_LOGIT = 24.0  # nats: the score a peaked row gives its chosen key (about)
DOUT_TINY = 2.0**-27  # ~7.5e-9
DOUT_LARGE = 2.0**8
DOUT_SPARSE_ROWS = 1.0 / 8.0
_LN2 = 0.6931471805599453  # math.log(2), written out: host-side constants use no libm

LARGE_LOGITS_STD = 9.0
MAX_Q_GAIN = 256.0
OUTLIER_Z = 3.2905  # P(|z| > 3.2905) = 0.001 for z ~ N(0, 1)
OUTLIER_GAIN = 30.0
NEAR_CONSTANT_NOISE = 2.0**-10  # relative; < half the bf16 spacing 2**-9

_M32 = 0xFFFFFFFF
# cos(pi * b) = sum_k (-1)^k pi^(2k) b^(2k) / (2k)!, truncated after the first term < 1e-16 (b <= 1/2).
_COS_COEFFS = [(-1) ** n * math.pi ** (2 * n) / math.factorial(2 * n) for n in range(11)]
# log(m) = 2 atanh(s) = 2 sum_k s^(2k+1) / (2k+1), s = (m - 1) / (m + 1), |s| <= 0.172, same cut.
_ATANH_COEFFS = [1.0 / (2 * n + 1) for n in range(10)]


# ------------------------------------------------------------------------ the counter hash
def _mix32(x):
    """32-bit xorshift-multiply hash (hash-prospector's ``[16 21f0aaad 15 735a2d97 15]``).

    Takes a python int or an int64 tensor (modified in place) holding values ``< 2**32``; both
    multipliers are ``< 2**31``, so products stay below ``2**63`` and never overflow int64.
    """
    if not isinstance(x, torch.Tensor):  # the same steps on a python int (no tensor overhead)
        for shift, multiplier in ((16, 0x21F0AAAD), (15, 0x735A2D97), (15, None)):
            x ^= x >> shift
            if multiplier is not None:
                x = (x * multiplier) & _M32
        return x
    scratch = torch.empty_like(x)  # in-place steps: fresh large allocations dominate on CPU
    for shift, multiplier in ((16, 0x21F0AAAD), (15, 0x735A2D97), (15, None)):
        x ^= torch.bitwise_right_shift(x, shift, out=scratch)
        if multiplier is not None:
            x *= multiplier
            x &= _M32
    return x


def _horner(x: torch.Tensor, coeffs: list[float]) -> torch.Tensor:
    acc = torch.full_like(x, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc.mul_(x).add_(c)  # two separately rounded IEEE operations (no fused multiply-add)
    return acc


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """``sqrt(x)`` for ``x > 0`` by Newton's method: only exact or IEEE-rounded ``+ - * /`` steps.

    ``torch.sqrt`` is not bit-identical across devices for float64 (measured on an H200: 0.8% of
    results differ from the CPU's in the last bit), so it is avoided.
    """
    mantissa, exponent = torch.frexp(x)  # x = mantissa * 2**exponent, mantissa in [0.5, 1)
    odd = (exponent % 2) != 0
    mantissa = torch.where(odd, mantissa * 2.0, mantissa)  # [0.5, 2), exponent now even
    half = (exponent - odd.to(exponent.dtype)).to(torch.int64) // 2
    root = (mantissa + 1.0) * 0.5  # within 6%; Newton squares the relative error each step
    for _ in range(5):
        root = (root + mantissa / root) * 0.5
    return root * ((half + 1023) << 52).view(torch.float64)  # times 2**half, exactly


def _hash_keys(seed: int, stream: int) -> tuple[int, int]:
    """The two 32-bit keys of ``(seed, stream)`` that `hash_normal` mixes into the counters."""
    key1 = _mix32(_mix32(seed & _M32) ^ _mix32((stream + 0x9E3779B9) & _M32))
    return key1, _mix32(key1 ^ 0x5BD1E995)


def hash_normal_torch(seed: int, stream: int, numel: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """`hash_normal` in torch operations only (its ``engine="torch"``; every device; the exported
    repros copy this one, ``service/export/repro.py``)."""
    key1, key2 = _hash_keys(seed, stream)
    counter = torch.arange(2 * numel, dtype=torch.int64, device=device)
    counter ^= key1
    return _box_muller(_mix32(_mix32(counter) ^ key2).to(torch.float64).view(numel, 2))


def _box_muller(bits: torch.Tensor) -> torch.Tensor:
    """The normals of `hash_normal_torch` from the hashed counters: ``bits`` ``[n, 2]`` float64
    (integers below ``2**32``: the hashes of counters ``2 i`` and ``2 i + 1``) -> ``[n]`` float64,
    ``sqrt(-2 log u1) cos(2 pi u2)`` with the log, cos and sqrt in exact or IEEE-rounded ``+ - * /``
    steps only (the same bits on every device; copied into the exported repros)."""
    u1 = (bits[:, 0] + 0.5) * 2.0**-32  # (0, 1): log(u1) is finite
    mantissa, exponent = torch.frexp(u1)  # u1 = mantissa * 2**exponent, mantissa in [0.5, 1)
    low = mantissa < math.sqrt(0.5)
    mantissa = torch.where(low, mantissa * 2.0, mantissa)
    exponent = (exponent - low.to(exponent.dtype)).to(torch.float64)
    s = (mantissa - 1.0) / (mantissa + 1.0)
    log_u1 = 2.0 * s * _horner(s * s, _ATANH_COEFFS) + exponent * math.log(2.0)
    a = (bits[:, 1] * 2.0**-31 - 1.0).abs()  # cos(2 pi u2) = -cos(pi a), a = |2 u2 - 1| in [0, 1]
    b = torch.where(a > 0.5, 1.0 - a, a)  # cos(pi a) = -cos(pi (1 - a))
    cos_pi_b = _horner(b * b, _COS_COEFFS)
    cos_2pi_u2 = torch.where(a > 0.5, cos_pi_b, -cos_pi_b)
    return _sqrt(-2.0 * log_u1) * cos_2pi_u2


def hash_uniform(seed: int, stream: int, numel: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``numel`` uniforms in ``(0, 1)``, a pure function of ``(seed, stream, index)``.

    The counter hash of `hash_normal` (same keys for the same ``(seed, stream)``) on the counters
    ``0 .. numel - 1``, then ``(bits + 0.5) * 2**-32``: integer operations and one exact float64
    scaling, so bit-identical on every device. Use streams no `hash_normal` call uses.

    Returns:
        ``[numel] float64`` on ``device``, each value a multiple of ``2**-33``.
    """
    key1 = _mix32(_mix32(seed & _M32) ^ _mix32((stream + 0x9E3779B9) & _M32))
    key2 = _mix32(key1 ^ 0x5BD1E995)
    counter = torch.arange(numel, dtype=torch.int64, device=device)
    counter ^= key1
    return (_mix32(_mix32(counter) ^ key2).to(torch.float64) + 0.5) * 2.0**-32


# ------------------------------------------------------------------------ input families
def _power_of_two_near_sqrt(x: float) -> float:
    """``2**m`` with ``m = e // 2`` for ``x = f * 2**e``, ``f`` in [0.5, 1): within a factor 2
    of ``sqrt(x)``; exact host arithmetic (no libm)."""
    _, exponent = math.frexp(x)
    return math.ldexp(1.0, exponent // 2)


def seq_scale_exponents(case) -> list[int]:
    """Per sequence ``b``, the exponent ``e_b`` of its gain ``2**e_b`` (``seq_scale_log2 = L``):
    a ramp from ``+L`` (first sequence) to ``-L`` (last), ``L - round(2 L b / (batch_size - 1))``;
    ``[L]`` for one sequence; all 0 when ``L == 0``."""
    level, count = case.seq_scale_log2, case.batch_size
    if count == 1:
        return [level]
    return [level - (2 * level * b + (count - 1) // 2) // (count - 1) for b in range(count)]


def massive_channel_indices(case) -> list[int]:
    """The ``massive_channels`` channel indices (sorted) whose q and k entries are amplified: the
    first of a permutation of ``range(head_dim)`` by the uniforms of stream ``STREAM_MASSIVE``
    (computed on the CPU: the indices are the same for every device)."""
    if case.massive_channels == 0:
        return []
    order = torch.argsort(hash_uniform(case.seed, STREAM_MASSIVE, case.head_dim), stable=True)
    return sorted(order[: min(case.massive_channels, case.head_dim)].tolist())


def score_offset_channel(case) -> tuple[int, float]:
    """``(channel, key value)`` realising ``score_offset``: the last channel; every key holds
    ``beta`` (a power of two near ``sqrt(|score_offset| / softmax_scale)``) there, and query row
    ``i`` holds ``alpha_i = offset_i / (softmax_scale * beta)``."""
    beta = _power_of_two_near_sqrt(max(abs(case.score_offset), 1.0) / case.softmax_scale)
    return case.head_dim - 1, beta


def _token_layout(case, side: str, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per token of the canonical layout flattened to ``[tokens]`` (``batch_size * seqlen`` or
    ``total``): (sequence index, position in the sequence, start token of that sequence's keys),
    int64 on ``device``."""
    lengths_q, lengths_k = case.seqlens_q_list, case.seqlens_k_list
    lengths = lengths_q if side == "q" else lengths_k
    counts = torch.tensor(lengths, dtype=torch.int64, device=device)
    if case.is_varlen:
        starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()[:-1]], dtype=torch.int64, device=device)
        key_starts = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()[:-1]], dtype=torch.int64, device=device)
    else:
        starts = torch.arange(case.batch_size, dtype=torch.int64, device=device) * lengths[0]
        key_starts = torch.arange(case.batch_size, dtype=torch.int64, device=device) * case.seqlen_k
    sequence = torch.repeat_interleave(torch.arange(case.batch_size, device=device), counts)
    position = torch.arange(int(counts.sum()), dtype=torch.int64, device=device) - starts[sequence]
    return sequence, position, key_starts[sequence]


def _low_rank(case, x: torch.Tensor, stream: int, basis: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` ``[tokens, heads, dim]`` float64 -> ``sum_r x[..., r] * basis[head, r, :] / sqrt(rank)``
    with ``basis`` from ``stream``, summed in index order with separate IEEE operations (no
    matmul, whose summation order differs between devices). ``basis``: that stream's
    ``[heads * rank * dim] float64`` samples when already drawn (`make_inputs` prefetches them);
    None draws them here."""
    heads, dim = x.shape[-2], x.shape[-1]
    rank = min(case.qk_rank, dim)
    if basis is None:
        basis = hash_normal_torch(case.seed, stream, heads * rank * dim, x.device)
    basis = basis.view(heads, rank, dim)
    acc = x[..., 0:1] * basis[:, 0, :]
    for r in range(1, rank):
        acc = acc + x[..., r : r + 1] * basis[:, r, :]
    return acc * (1.0 / math.sqrt(rank))  # python's sqrt of an int: correctly rounded, on the host


def _llm_like_and_offsets(case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype) -> None:
    """Apply massive channels, per-sequence scales, the attention sink, peaked rows and the score
    offset in place to float64 ``[tokens, heads, dim]`` views of q, k, v (module docstring)."""
    device = q.device
    if case.massive_channels:
        channels = torch.tensor(massive_channel_indices(case), device=device)
        q[..., channels] *= MASSIVE_Q_GAIN
        k[..., channels] *= MASSIVE_K_GAIN
    seq_q = seq_k = None
    if case.seq_scale_log2 or case.attention_sink or case.peaked_rows:
        seq_q, pos_q, key_start_q = _token_layout(case, "q", device)
        seq_k, pos_k, _ = _token_layout(case, "k", device)
    if case.seq_scale_log2:
        gains = torch.tensor([2.0**e for e in seq_scale_exponents(case)], dtype=torch.float64, device=device)
        q *= gains[seq_q][:, None, None]  # scores of sequence b scaled by 2**e_b
        v *= gains[seq_k][:, None, None]  # and its output
    if case.attention_sink:
        c = SINK_CHANNEL
        gaps = [SINK_MARGIN + _LN2 * n.bit_length() for n in case.seqlens_k_list]  # >= ln(n) + margin
        beta = _power_of_two_near_sqrt(max(gaps) / case.softmax_scale)
        alphas = torch.tensor([g / (case.softmax_scale * beta) for g in gaps], dtype=torch.float64, device=device)
        k[..., c] = torch.where(pos_k == 0, beta, 0.0)[:, None]
        q[..., c] = alphas[seq_q][:, None]
    if case.peaked_rows:
        tokens, heads = q.shape[0], q.shape[1]
        u = hash_uniform(case.seed, STREAM_PEAKED, 2 * tokens * heads, device).view(tokens, heads, 2)
        lengths_k = torch.tensor(case.seqlens_k_list, dtype=torch.int64, device=device)
        span = torch.minimum(pos_q, lengths_k[seq_q] - 1) + 1  # keys 0 .. min(i, n_k - 1): visible when causal
        chosen = key_start_q[:, None] + (u[..., 1] * span[:, None].to(torch.float64)).to(torch.int64)
        kv_head = torch.arange(heads, device=device) // case.group_size
        rounded_k = k.to(dtype).to(torch.float64)
        gamma = PEAK_LOGIT / (case.softmax_scale * case.head_dim)
        peaked = rounded_k[chosen, kv_head[None, :].expand(tokens, heads)] * gamma
        q.copy_(torch.where((u[..., 0] < case.peaked_rows)[..., None], peaked, q))
    if case.score_offset:
        c, beta = score_offset_channel(case)
        alpha = case.score_offset / (case.softmax_scale * beta)
        k[..., c] = beta
        if case.score_offset_mode == "head":
            q[..., c] = alpha
        else:
            tokens, heads = q.shape[0], q.shape[1]
            w = hash_uniform(case.seed, STREAM_OFFSET, tokens * heads, device).view(tokens, heads) * 2.0 - 1.0
            q[..., c] = w * alpha
    limit = torch.finfo(dtype).max / 2  # keep every input finite in the case dtype
    for x in (q, k, v):
        x.clamp_(-limit, limit)


def _dout(case, dout: torch.Tensor) -> torch.Tensor:
    """``dout`` of ``dout_distribution`` from its N(0, 1) draw ``[..., heads, head_dim_v]``."""
    if case.dout_distribution == "tiny":
        return dout * DOUT_TINY
    if case.dout_distribution == "large":
        return dout * DOUT_LARGE
    if case.dout_distribution == "sparse":
        rows = dout.shape[:-1]
        keep = hash_uniform(case.seed, STREAM_DOUT_SPARSE, math.prod(rows), dout.device).view(rows) < DOUT_SPARSE_ROWS
        return torch.where(keep[..., None], dout, 0.0)
    return dout


# ---------------------------------------------------------------------------------- inputs
def input_shapes(case):
    """``(q, k, v, out)`` shapes of the canonical layout: ``[batch_size, seqlen, heads, dim]``
    (thd ``[total, heads, dim]``); ``out`` (and dout) ``[..., num_heads, head_dim_v]``."""
    if case.is_varlen:
        rows_q, rows_k = (case.total_q,), (case.total_k,)
    else:
        rows_q, rows_k = (case.batch_size, case.seqlen_q), (case.batch_size, case.seqlen_k)
    return (
        (*rows_q, case.num_heads, case.head_dim),
        (*rows_k, case.num_heads_kv, case.head_dim),
        (*rows_k, case.num_heads_kv, case.head_dim_v),
        (*rows_q, case.num_heads, case.head_dim_v),
    )


def float64_inputs(case, normal):
    """q, k, v of ``case``, float64 in the canonical layout: the normal draws, the low-rank q/k,
    the input distribution, then the input families (``oracle/inputs.py`` describes each).

    Args:
        case: the case (see the module docstring).
        normal: ``normal(stream, shape)`` -> float64 tensor of that shape: the `hash_normal`
            samples of ``(case.seed, stream)`` (any engine; the bits are the same).
    """
    shape_q, shape_k, shape_v, _ = input_shapes(case)
    q, k = normal(STREAM_Q, shape_q), normal(STREAM_K, shape_k)
    if case.qk_rank:
        rank = min(case.qk_rank, case.head_dim)
        q = _low_rank(
            case, q.view(-1, case.num_heads, case.head_dim), STREAM_Q_BASIS,
            normal(STREAM_Q_BASIS, (case.num_heads * rank * case.head_dim,)),
        ).view(shape_q)
        k = _low_rank(
            case, k.view(-1, case.num_heads_kv, case.head_dim), STREAM_K_BASIS,
            normal(STREAM_K_BASIS, (case.num_heads_kv * rank * case.head_dim,)),
        ).view(shape_k)
    if case.input_distribution == "large_logits":
        q = q * min(LARGE_LOGITS_STD / (case.softmax_scale * math.sqrt(case.head_dim)), MAX_Q_GAIN)
    elif case.input_distribution == "outliers":
        q = torch.where(normal(STREAM_Q_OUTLIERS, shape_q).abs() > OUTLIER_Z, q * OUTLIER_GAIN, q)
        k = torch.where(normal(STREAM_K_OUTLIERS, shape_k).abs() > OUTLIER_Z, k * OUTLIER_GAIN, k)
    elif case.input_distribution == "near_constant":
        base = normal(STREAM_K_BASE, (case.num_heads_kv, case.head_dim)).to(torch.bfloat16).to(torch.float64)
        k = base * (1.0 + NEAR_CONSTANT_NOISE * k.clamp(-1.0, 1.0))
    v = normal(STREAM_V, shape_v)
    if set(case.input_families) - {"dout_distribution"}:
        q, k = q.contiguous(), k.contiguous()
        _llm_like_and_offsets(
            case, q.view(-1, case.num_heads, case.head_dim), k.view(-1, case.num_heads_kv, case.head_dim),
            v.view(-1, case.num_heads_kv, case.head_dim_v), getattr(torch, case.dtype),
        )
    return q, k, v


def dout_values(case, normal):
    """dout of ``case`` (float64, shaped like the output) from ``normal`` (as `float64_inputs`)."""
    return _dout(case, normal(STREAM_DOUT, input_shapes(case)[3]))


def case_inputs(case, device="cpu"):
    """``(q, k, v, dout, cu_seqlens_q, cu_seqlens_k)`` of ``case`` on ``device``: the tensors in
    the case dtype (bit-identical to ``make_inputs`` of ``oracle/inputs.py``), the ``cu_seqlens`` int32
    ``[batch_size + 1]`` for thd (else None); drawn with `hash_normal_torch`."""

    def normal(stream, shape):
        return hash_normal_torch(case.seed, stream, math.prod(shape), device).view(shape)

    dtype = getattr(torch, case.dtype)
    q, k, v = float64_inputs(case, normal)
    dout = dout_values(case, normal)
    cu_seqlens_q = cu_seqlens_k = None
    if case.is_varlen:
        cu_seqlens_q = torch.tensor([0, *torch.tensor(case.seqlens_q_list).cumsum(0).tolist()], dtype=torch.int32, device=device)
        cu_seqlens_k = torch.tensor([0, *torch.tensor(case.seqlens_k_list).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return q.to(dtype), k.to(dtype), v.to(dtype), dout.to(dtype), cu_seqlens_q, cu_seqlens_k


# ------------------------------------------------------------------------------------ mask
def key_bounds(case, seqlen_q, seqlen_k, device=None):
    """Row ``i`` of one sequence sees keys ``lo[i] <= j < hi[i]`` (``[seqlen_q] int64`` each,
    clipped to ``[0, seqlen_k]``; the row sees no key iff ``lo[i] >= hi[i]``): the diagonal at
    ``i + offset`` with offset 0 (top_left) or ``seqlen_k - seqlen_q`` (bottom_right); causal caps
    the right bound there, a window bounds either side (None: unbounded). ``oracle/masks.py``
    documents the rule and its sources."""
    rows = torch.arange(seqlen_q, dtype=torch.int64, device=device)
    diagonal = rows + (seqlen_k - seqlen_q if case.causal_alignment == "bottom_right" else 0)
    if case.causal:
        right = diagonal  # min(window_size_right, 0) == 0: causal wins over any right window
    elif case.window_size_right is not None:
        right = diagonal + case.window_size_right
    else:
        right = torch.full_like(rows, seqlen_k - 1)
    if case.window_size_left is not None:
        left = diagonal - case.window_size_left
    else:
        left = torch.zeros_like(rows)
    return left.clamp(0, seqlen_k), (right + 1).clamp(0, seqlen_k)


def sequence_mask(case, seqlen_q, seqlen_k, device=None):
    """``[seqlen_q, seqlen_k] bool`` of one sequence: True where the query row may attend the key."""
    lo, hi = key_bounds(case, seqlen_q, seqlen_k, device)
    cols = torch.arange(seqlen_k, dtype=torch.int64, device=device)
    return (cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])


# ---------------------------------------------------------------- dense float64 reference
def _attend(case, q, k, v, dout):
    """One sequence: q ``[sq, h, d]``, k ``[sk, hkv, d]``, v ``[sk, hkv, dv]``, dout ``[sq, h, dv]``
    or None, float64. Returns out ``[sq, h, dv]``, lse ``[h, sq]`` (-inf on rows without a visible
    key), dq, dk, dv (None without dout)."""
    group = case.num_heads // case.num_heads_kv
    k_heads, v_heads = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k_heads) * case.softmax_scale
    tanh = None
    if case.softcap is not None:
        tanh = torch.tanh(scores / case.softcap)
        scores = case.softcap * tanh
    visible = sequence_mask(case, q.shape[0], k.shape[0]).to(q.device)
    scores = scores.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    out = torch.einsum("hqk,khd->qhd", probs, v_heads)
    if dout is None:
        return out, lse, None, None, None
    # FlashAttention-2 (arXiv:2307.08691) Algorithm 2: D = rowsum(dO * O), dS = P * (dP - D).
    delta = (dout * out).sum(-1).transpose(0, 1)
    dscores = probs * (torch.einsum("qhd,khd->hqk", dout, v_heads) - delta[..., None])
    if tanh is not None:
        dscores = dscores * (1.0 - tanh * tanh)
    dq = torch.einsum("hqk,khd->qhd", dscores, k_heads) * case.softmax_scale
    dk = torch.einsum("hqk,qhd->khd", dscores, q) * case.softmax_scale
    dv = torch.einsum("hqk,qhd->khd", probs, dout)
    dk = dk.reshape(k.shape[0], case.num_heads_kv, group, -1).sum(2)
    dv = dv.reshape(k.shape[0], case.num_heads_kv, group, -1).sum(2)
    return out, lse, dq, dk, dv


def dense_reference(case, q, k, v, dout):
    """Float64 ``{"out", "lse", "dq", "dk", "dv"}`` in the canonical layout (lse ``[b, h, sq]``,
    thd ``[h, total_q]``; the gradients None without ``case.backward``), one dense sequence at a
    time: the plain formulas, no blocking (``oracle/reference.py`` is attnfuzz's engine)."""
    q, k, v, dout = (t.to(torch.float64) for t in (q, k, v, dout))
    if not case.backward:
        dout = None
    lengths_q, lengths_k = list(case.seqlens_q_list), list(case.seqlens_k_list)
    if case.is_varlen:
        starts_q = [sum(lengths_q[:i]) for i in range(case.batch_size)]
        starts_k = [sum(lengths_k[:i]) for i in range(case.batch_size)]
        pieces = [
            _attend(case, q[sq:sq + nq], k[sk:sk + nk], v[sk:sk + nk], None if dout is None else dout[sq:sq + nq])
            for sq, nq, sk, nk in zip(starts_q, lengths_q, starts_k, lengths_k)
        ]
        stack = {"out": 0, "lse": 1, "dq": 0, "dk": 0, "dv": 0}
    else:
        pieces = [_attend(case, q[b], k[b], v[b], None if dout is None else dout[b]) for b in range(case.batch_size)]
        stack = None
    result = {}
    for i, name in enumerate(("out", "lse", "dq", "dk", "dv")):
        parts = [p[i] for p in pieces]
        if parts[0] is None:
            result[name] = None
        elif stack is not None:
            result[name] = torch.cat(parts, dim=stack[name])
        else:
            result[name] = torch.stack(parts)
    return result


# ------------------------------------------------------------------------------ tile judge
def row_dims(case):
    """The dim of each tensor that indexes rows (sequence positions) in the canonical layout."""
    if case.is_varlen:
        return {"out": 0, "lse": 1, "dq": 0, "dk": 0, "dv": 0}
    return {"out": 1, "lse": 2, "dq": 1, "dk": 1, "dv": 1}


def group_names(case, name):
    """Names of the dims that separate groups of rows in tensor ``name`` (canonical layout)."""
    heads = "kv_head" if name in ("dk", "dv") else "head"
    return (heads,) if case.is_varlen else ("batch", heads)


def to_grid(x, row_dim):
    """``x`` as ``[groups, rows, features]``: rows along ``row_dim``, features the last dim (lse:
    none), groups every other dim in order (the tiling of ``oracle/tolerance.py``). Returns the grid and the
    group dims' sizes."""
    ndim = x.dim()
    has_features = row_dim != ndim - 1
    group_dims = [i for i in range(ndim) if i != row_dim and not (has_features and i == ndim - 1)]
    perm = group_dims + [row_dim] + ([ndim - 1] if has_features else [])
    groups = [x.shape[i] for i in group_dims]
    features = x.shape[-1] if has_features else 1
    return x.permute(perm).reshape(math.prod(groups), x.shape[row_dim], features), groups


def describe_group(case, name, groups, g):
    """Group ``g`` of tensor ``name`` in words (``"batch 1, head 3"``)."""
    parts = []
    for dim_name, size in reversed(list(zip(group_names(case, name), groups))):
        parts.append(f"{dim_name} {g % size}")
        g //= size
    return ", ".join(reversed(parts))


def tile_judge(case, name, actual, expected, allowed, *, tile_rows, kinds, masked_row_lse=None):
    """The verdict on one tensor as ``oracle/compare.py`` gives it, from the allowed errors it stored:
    ``(signatures, figures as text)``.

    Checks: shape; NaN; +-inf where the reference is finite (but for a correctly rounded overflow,
    or one within the allowed error of the largest value); a finite lse on a row that sees no key
    (the reference's -inf; +-inf accepted there, and ``masked_row_lse``); all zero (outside the
    tolerance); the whole tensor's L2 error against ``allowed["whole"]`` (mismatch); else every
    tile's (``tile_rows`` rows of one group) against ``allowed["tiles"][group][tile]``
    (tile_mismatch; None: tiles not checked).

    Args:
        case: the case (``dtype``, ``is_varlen``).
        name: ``"out"``, ``"lse"``, ``"dq"``, ``"dk"`` or ``"dv"``.
        actual: the kernel's tensor, any float dtype and device.
        expected: the float64 reference (`dense_reference`).
        allowed: ``{"whole": float, "tiles": [[float]] or None}``.
        tile_rows: rows per tile.
        kinds: the signature kinds, most severe first (``tensor_kinds`` of ``oracle/signatures.py``).
        masked_row_lse: a finite value a backend writes on rows that see no key (accepted there).

    Returns:
        ``(["<name>:<kind>", ...] most severe first, text)``.
    """
    if tuple(actual.shape) != tuple(expected.shape):
        return [name + ":shape"], f"{name}: shape {tuple(actual.shape)}, the reference's {tuple(expected.shape)}"
    actual = actual.detach().to("cpu", torch.float64)
    expected = expected.detach().to("cpu", torch.float64)
    if name == "lse" and masked_row_lse is not None:
        actual = actual.masked_fill(torch.isneginf(expected) & (actual == masked_row_lse), -math.inf)
    act, groups = to_grid(actual, row_dims(case)[name])
    ref, _ = to_grid(expected, row_dims(case)[name])
    masked = ~torch.isfinite(ref)  # lse of rows that see no key; nothing else
    finite = ~masked
    # where the reference rounded to the kernel's dtype overflows, that infinity is the correctly
    # rounded result (IEEE 754-2019 4.3.1), not +-inf where the reference is finite
    round_to = getattr(torch, "float32" if name == "lse" else case.dtype)
    rounded = torch.where(finite, ref, 0.0).to(round_to).double()
    wrong_inf = finite & ~(torch.isinf(rounded) & (act == rounded))
    # the overflow edge: within its tile's allowed error of the largest finite value, an infinity of
    # the reference's sign is within the tolerance (the whole tensor's allowance without tiles)
    if allowed["tiles"] is None:
        slack = torch.full(ref.shape[:2], allowed["whole"], dtype=torch.float64)
    else:
        slack = torch.tensor(allowed["tiles"], dtype=torch.float64).repeat_interleave(tile_rows, dim=1)[:, : ref.shape[1]]
    near = finite & (torch.where(finite, ref, 0.0).abs() >= torch.finfo(round_to).max - slack[..., None])
    wrong_inf &= ~(near & (act == torch.sign(torch.where(finite, ref, 0.0)) * math.inf))
    counts = {
        "nan": int(torch.isnan(act).sum()),
        "posinf": int(((act == math.inf) & wrong_inf).sum()),
        "neginf": int(((act == -math.inf) & wrong_inf).sum()),
        "finite_on_masked": int((masked & torch.isfinite(act)).sum()),
    }
    valid = finite & torch.isfinite(act)
    diff = torch.where(valid, act - torch.where(finite, ref, 0.0), 0.0)
    err2_rows = diff.square().sum(-1)  # [groups, rows]
    err_whole = float(err2_rows.sum().sqrt())
    ratio_whole = err_whole / allowed["whole"]
    text = f"{name}: L2 error {err_whole:.4g}, allowed {allowed['whole']:.4g} (ratio {ratio_whole:.3g})"
    worst_tile_ratio = 0.0
    if allowed["tiles"] is None:
        text += "; tiles not checked (no stored tile allowances)"
    else:
        num_groups, num_rows = err2_rows.shape
        pad = (-num_rows) % tile_rows
        err_tiles = torch.nn.functional.pad(err2_rows, (0, pad)).view(num_groups, -1, tile_rows).sum(-1).sqrt()
        allowed_tiles = torch.tensor(allowed["tiles"], dtype=torch.float64)
        ratio_tiles = torch.where(err_tiles > 0, err_tiles / allowed_tiles, 0.0)
        worst = int(ratio_tiles.argmax())
        g, t = divmod(worst, ratio_tiles.shape[1])
        worst_tile_ratio = float(ratio_tiles[g, t])
        last_row = min((t + 1) * tile_rows, num_rows) - 1
        text += (
            f"; worst tile {describe_group(case, name, groups, g)}, rows {t * tile_rows}..{last_row}: error "
            f"{float(err_tiles[g, t]):.4g}, allowed {float(allowed_tiles[g, t]):.4g} (ratio {worst_tile_ratio:.3g}); "
            f"{int((ratio_tiles > 1).sum())} of {ratio_tiles.numel()} tiles over"
        )
    text += "".join(f"; {kind} x{count}" for kind, count in counts.items() if count)
    found = {kind for kind, count in counts.items() if count}
    if bool(finite.any()) and not bool((act[finite] != 0).any()) and max(ratio_whole, worst_tile_ratio) > 1:
        found.add("all_zero")
    if ratio_whole > 1:
        found.add("mismatch")
    elif worst_tile_ratio > 1:
        found.add("tile_mismatch")
    return [name + ":" + kind for kind in kinds if kind in found], text
