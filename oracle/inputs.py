"""Deterministic attention inputs: the same case gives the same bits on every device and every run
(one idea over 600 lines: the generator and the input families built on it).

Values come from `hash_normal`: a counter-based generator (a 32-bit integer hash of seed, stream
and element index, then Box-Muller) written only with integer operations and IEEE-754 float64
``+ - * /``, each a separate torch operation. Those operations are correctly rounded on CPUs and
CUDA GPUs alike, so the float64 values, and the values cast to the case dtype, are bit-identical
everywhere. ``torch.Generator`` is not used (its streams differ between CPU and CUDA), and neither
are ``torch.log``, ``torch.cos`` and ``torch.sqrt`` (their last bit differs between CPU and CUDA:
measured for sqrt on an H200, 0.8% of float64 results; that would flip an occasional float32
rounding): `hash_normal` evaluates log and cos with fixed polynomials and sqrt by Newton's method.

Streams (``stream`` argument of `hash_normal` / `hash_uniform`): 1 q, 2 k, 3 v, 4 dout, 5 q
outlier selection, 6 k outlier selection, 7 near-constant key base; the input families: 8 q
basis, 9 k basis, 10 massive channels, 11 peaked rows, 12 row offsets, 13 sparse dout rows. Elements are numbered in the canonical layout
(row-major ``[batch_size, seqlen, heads, dim]``, or ``[total, heads, dim]`` for thd), so bshd and
sbhd cases get identical tensors.

Input distributions (``AttentionCase.input_distribution``):

``normal``
    q, k, v, dout all i.i.d. N(0, 1). Scaled scores have standard deviation
    ``softmax_scale * sqrt(head_dim)`` (1 with the default scale).
``large_logits``
    as normal, but q is multiplied by ``LARGE_LOGITS_STD / (softmax_scale * sqrt(head_dim))``
    (capped at ``MAX_Q_GAIN``) so that the scaled scores have standard deviation ~``9``: softmax
    rows are dominated by a few keys and ``exp`` ranges over many binades.
``outliers``
    as normal, but a deterministic ~0.1% of the entries of q and of k (those whose selection
    stream has ``|z| > OUTLIER_Z``, two-sided probability 0.1%) are multiplied by
    ``OUTLIER_GAIN = 30``, as activation outliers in LLMs are.
``near_constant``
    as normal, but every key row of k is one base vector per kv head times ``1 + ~1e-3`` noise:
    ``k[..., h, :] = base[h, :] * (1 + 2**-10 * clip(z, -1, 1))`` with ``base`` representable in
    bf16. Scores are then nearly equal across keys; in bf16 the keys, hence the scores, are exactly
    equal (the relative noise stays below half a bf16 spacing), in fp16/fp32 they differ slightly.
    This stresses summation order and the cancellation in ``dq = dS k`` (``sum_j dS_ij = 0``).

Input families (further `AttentionCase` fields, each off at its default and then left out of the
JSON, so cases stored before they existed keep their JSON, ``case_id`` and bits). They are applied
after the distribution above, in this order, to float64 q/k/v in the canonical layout, and like
everything here use only exact operations, IEEE ``+ - * /``, gathers and host-side python
arithmetic without libm (powers of two from ``frexp``), never a reduction or matmul (whose summation
order differs between devices):

``qk_rank = r`` (low-rank q/k; ``r`` above head_dim counts as head_dim)
    ``q[t, h, :] = sum_{i < r} z[t, h, i] basis_h[i, :] / sqrt(r)`` (``z`` = the first ``r``
    channels of the normal q, ``basis`` from stream 8; k likewise with stream 9 per kv head),
    summed in index order. Real q/k activations have a low effective rank, which concentrates the
    scores and the cancellation in ``dS`` on a few directions. Source: Singhania et al., "Loki:
    Low-rank Keys for Efficient Sparse Attention", NeurIPS 2024 (keys of LLMs are low rank).
``massive_channels = n`` (a few very large channels; at most head_dim)
    ``n`` channels (`massive_channel_indices`, stream 10) of q are multiplied by
    ``MASSIVE_Q_GAIN = 4`` and of k by ``MASSIVE_K_GAIN = 16``, in every head: fixed outlier
    channels, larger in keys than in queries, as measured in LLM key caches. Sources: Liu et al.,
    "KIVI", ICML 2024 (per-channel key outliers); Sun et al., "Massive Activations in Large
    Language Models", COLM 2024; flashinfer issue #4267 (a kernel returned zeros for rows whose
    logits massive activations drove below its finite ``-inf`` sentinel).
``seq_scale_log2 = L`` (different scales per sequence)
    sequence ``b`` of the batch has q and v multiplied by ``2**e_b`` (`seq_scale_exponents`: a
    ramp from ``+L`` to ``-L``), so scores and outputs of the sequences in one batch (or one
    packed thd tensor) live at scales up to ``2**(2 L)`` apart: per-sequence softmax statistics
    and per-tile rescaling must not leak between sequences (varlen kernels, split-KV combines).
``attention_sink`` (one key taking most of the weight)
    channel ``SINK_CHANNEL = 0``: the first key of every sequence holds ``beta`` (a power of two),
    every other key 0, every query of sequence ``b`` holds ``alpha_b`` with ``softmax_scale *
    alpha_b * beta = SINK_MARGIN + ln(2) * bit_length(seqlen_k_b) >= ln(seqlen_k_b) + 4``: that key
    takes ~95% of the weight of every row that sees it (with normal inputs). Source: Xiao et al.,
    "Efficient Streaming Language Models with Attention Sinks", ICLR 2024.
``peaked_rows = p`` (one-hot or peaked rows)
    a fraction ``p`` of the (query row, head) pairs (stream 11) get ``q_i = gamma k_j`` with ``j``
    uniform among keys ``0 .. min(i, seqlen_k - 1)`` of the sequence (visible under a top-left
    causal mask) and ``gamma = PEAK_LOGIT / (softmax_scale * head_dim)``: the score of that key is
    about ``PEAK_LOGIT = 24`` nats above the others, so the row is one-hot to float32 precision
    (``P = e_j``). The backward then cancels exactly: ``dS_i = P_i (dP_i - D_i)`` with ``D_i =
    dP_ij`` (retrieval / induction heads of trained models attend this way).
``score_offset = O``, ``score_offset_mode`` (row LSE far from 0)
    every score of a row gets a common offset, realised as real q/k values: the last channel
    (`score_offset_channel`) of every key holds ``beta`` (a power of two near ``sqrt(|O| /
    softmax_scale)``) and of query row ``i`` ``alpha_i = O w_i / (softmax_scale beta)``, with
    ``w_i = 1`` (``"head"``: every row of every head) or ``w_i`` uniform in ``(-1, 1)`` per row and
    head (``"row"``, stream 12). That channel then adds exactly ``softmax_scale * alpha_i * beta``
    (with ``alpha_i`` rounded to the dtype) to every score of row ``i``, and ``lse_i`` moves by the
    same amount, to ``+-256`` nats, while the softmax itself is unchanged. Zero-mean inputs always
    have ``lse >= max_j s_ij``, i.e. near or above 0; kernels that keep ``exp(s)`` and
    ``exp(-lse)`` apart, store lse with too little range or initialise the running max with a
    finite sentinel fail only here. With softcap the offset saturates at ``+-softcap``. Sources:
    FlashAttention-2 backward recomputes ``P = exp(s - lse)`` (arXiv:2307.08691, Algorithm 2;
    flash-attention issue #1012); flashinfer issue #4267.
``dout_distribution`` (backward only)
    ``"tiny"``: dout times ``DOUT_TINY = 2**-27`` (~7.5e-9; in float16 mostly subnormal or 0):
    gradients near the bottom of the range, where flushing or a scaled fp8/fp16 dout loses
    everything. ``"large"``: times ``DOUT_LARGE = 2**8``. ``"sparse"``: whole rows of dout are
    zero except a fraction ``DOUT_SPARSE_ROWS = 1/8`` (stream 13), as with a loss on a few tokens
    (prompt masking, last-token losses): ``D_i = 0`` and ``dq_i = 0`` exactly on the zero rows.

Every input is finally clamped to half the dtype's largest finite value. The fuzzer draws the
families (`fuzzer.strategies.input_specs`) with ``qk_rank`` .. ``peaked_rows`` on ``normal``
inputs only: combined with ``large_logits`` or ``near_constant`` keys they make scores of several
hundred nats, or q aligned with every key, where the float32 rounding of ``q . k`` grows like
``sqrt(head_dim) |s|`` and outgrows the error model's score term (`oracle.compare`, whose ``S_i``
term has no ``sqrt(head_dim)``; measured with torch-cpu-math/flash: float32 dk tiles at error
ratio ~8 with large_logits, out at ~1.4 with near_constant keys). For the same reason
``massive_channels`` is drawn for bfloat16/float16 cases only (float32 with a large
``softmax_scale``: dk tiles at ~1.3); in bf16/fp16 that term is scaled by ``rho = 2**-16`` or
``2**-13`` and stays far inside the tolerance.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from oracle.config import AttentionCase, torch_dtype

# The streams, the constants, the counter hash in torch and the input families are the portable
# core's (`oracle.portable`, copied verbatim into every exported repro): imported here under the
# names this module always had.
from oracle.portable import (  # noqa: F401 (re-exported: the names this module always had)
    _ATANH_COEFFS, _COS_COEFFS, _LN2, _M32, DOUT_LARGE, DOUT_SPARSE_ROWS, DOUT_TINY, LARGE_LOGITS_STD, MASSIVE_K_GAIN,
    MASSIVE_Q_GAIN, MAX_Q_GAIN, NEAR_CONSTANT_NOISE, OUTLIER_GAIN, OUTLIER_Z, PEAK_LOGIT, SINK_CHANNEL, SINK_MARGIN,
    STREAM_DOUT, STREAM_DOUT_SPARSE, STREAM_K, STREAM_K_BASE, STREAM_K_BASIS, STREAM_K_OUTLIERS, STREAM_MASSIVE,
    STREAM_OFFSET, STREAM_PEAKED, STREAM_Q, STREAM_Q_BASIS, STREAM_Q_OUTLIERS, STREAM_V, _box_muller, _dout,
    _hash_keys, _horner, _llm_like_and_offsets, _low_rank, _mix32, _power_of_two_near_sqrt, _sqrt, _token_layout,
    dout_values, float64_inputs, hash_normal_torch, hash_uniform, input_shapes, massive_channel_indices,
    score_offset_channel, seq_scale_exponents,
)


def hash_normal(
    seed: int, stream: int, numel: int, device: torch.device | str = "cpu", *, engine: str = "auto"
) -> torch.Tensor:
    """``numel`` standard normal samples, a pure function of ``(seed, stream, index)``.

    Args:
        seed: ``0 <= seed < 2**32``.
        stream: ``0 <= stream < 2**32``, one per tensor (see the module docstring).
        numel: number of samples, ``< 2**31``.
        device: where to compute; the result is bit-identical on every device.
        engine: ``"auto"`` (numpy on the CPU, torch elsewhere), ``"numpy"`` (CPU only) or
            ``"torch"``; every engine gives the same bits (the choice exists for the tests).

    Returns:
        ``[numel] float64`` on ``device``: Box-Muller ``sqrt(-2 log u1) cos(2 pi u2)`` of two
        uniforms per element (element ``i`` hashes the counters ``2 i`` and ``2 i + 1``).

    Implementation: on the CPU the same sequence of integer and IEEE-754 float64 operations
    runs in numpy, in blocks of ``16384`` elements that stay in cache, with the hash in
    ``uint32`` (wrap-around multiplication, logical shifts: the same bits as the ``int64``
    version masked to 32 bits) and the log and cos polynomials evaluated as one stacked Horner
    loop (the log polynomial padded with a leading ``0``, whose first step ``0 * x + c = c`` is
    exact). Each element still sees exactly the rounded operations of the ``torch`` path used on
    every other device (CUDA), so the bits are the same: ``tests/oracle/test_inputs_hash.py``
    checks them against the original implementation, and ``benchmarks/hash_normal_bench.py``
    measures the speed-up side by side. The CPU samples are also cached per ``(seed, stream)``
    (`_hash_normal_cached`, `_HASH_CACHE_BYTES`, 128 MiB): a later call of the same stream copies what was computed and
    computes only the elements past it; every call returns a fresh tensor.

    Raises:
        ValueError: ``engine`` is not one of ``"auto"``, ``"numpy"``, ``"torch"``, or ``"numpy"``
            with a device other than the CPU.

    Source: Box & Muller, "A Note on the Generation of Random Normal Deviates", Ann. Math. Statist.
    29(2), 1958; hash constants from https://github.com/skeeto/hash-prospector.
    """
    return hash_normal_many(seed, [(stream, numel)], device, engine=engine)[0]


def hash_normal_many(
    seed: int, requests: list[tuple[int, int]], device: torch.device | str = "cpu", *, engine: str = "auto"
) -> list[torch.Tensor]:
    """`hash_normal` of several streams of one seed, computed in one pass.

    Args:
        seed: ``0 <= seed < 2**32``.
        requests: ``(stream, numel)`` pairs (streams as in `hash_normal`, ``0 <= numel < 2**31``;
            a stream may repeat, a ``numel`` may be 0).
        device, engine: as in `hash_normal`.

    Returns:
        One ``[numel] float64`` tensor on ``device`` per request, in order, each bit-identical to
        ``hash_normal(seed, stream, numel, device)``. With several requests they are disjoint
        views of one buffer (writing to one never changes another); one request gets a fresh
        tensor of its own, as `hash_normal` returns.

    Why: the cost of a case's inputs was per-call overhead, not arithmetic. In a CPU fuzz run a
    case asks for ~140k samples in all, but the median `hash_normal` call is only 3,860 samples
    (commit 04c98f7, 5,078 calls of a CPU run), and the numpy engine issues ~90 numpy calls per
    block whatever its size; on CUDA `hash_normal_torch` is ~100 small kernel launches per call,
    4+ calls per case (inputs were 3.3% of an H200 campaign's wall time). `make_inputs` therefore
    asks for all its streams at once: the counters of every request are concatenated and each
    element is xored with its own stream's keys (``key1``, ``key2`` of `_hash_keys`, broadcast
    per element as arrays/tensors instead of scalars); every element then goes through exactly
    the integer and IEEE float64 operations of the one-stream path (an xor with a key array has
    the bits of an xor with the scalar key), so the bits are unchanged
    (``tests/oracle/test_inputs_many.py``; ``benchmarks/make_inputs_bench.py`` measures it).

    On the CPU (numpy engine) the per-``(seed, stream)`` prefix cache of `hash_normal` is used as
    there: a request whose stream is cached far enough is copied from the cache, the missing
    tails of the others are computed in one combined pass (`_hash_normal_numpy_segments`) and
    cached. Elsewhere (torch engine) one pass of `hash_normal_torch`'s operations runs with
    per-element key tensors (`_hash_normal_torch_many`; one request: `hash_normal_torch` itself).

    Raises:
        ValueError: as `hash_normal`.
    """
    on_cpu = torch.device(device).type == "cpu"
    if engine not in ("auto", "numpy", "torch") or (engine == "numpy" and not on_cpu):
        raise ValueError(f"engine: {engine!r} on device {device!r}; allowed: 'auto', 'torch', 'numpy' (CPU only)")
    requests = [(int(stream), int(numel)) for stream, numel in requests]
    if on_cpu and engine != "torch":
        keys = [_hash_keys(seed, stream) for stream, _ in requests]
        return [torch.from_numpy(a) for a in _hash_normal_cached_many(keys, [n for _, n in requests])]
    if len(requests) == 1:
        return [hash_normal_torch(seed, requests[0][0], requests[0][1], device)]
    return _hash_normal_torch_many(seed, requests, device)


# Per-process cache of `hash_normal` samples on the CPU: element ``i`` of a stream is a pure
# function of ``(seed, stream, i)``, so the samples computed for one call serve every later call
# of the same ``(seed, stream)`` up to their length, and a longer call computes only its tail.
# Hypothesis draws the same seeds again and again (seed 0; its target phase's hill climbing
# changes shapes and keeps the seed): in a CPU fuzz run about 30% of the samples asked for had
# been computed before (as many with 32 MiB as with no bound). With the CPU's pool of 8 seeds
# (`fuzzer.strategies.seeds`) the streams are fewer and longer: 32 MiB left 34% of the samples
# to compute, 128 MiB 16% (the inputs' hashing 2.16 -> 1.06 ms a case, 20 s CPU runs side by side,
# 2026-12-02), 256 MiB 14%. The least recently used streams are dropped past `_HASH_CACHE_BYTES`
# (per process: each CPU worker keeps its own).
_HASH_CACHE_BYTES = 128 << 20
_hash_cache: OrderedDict[tuple[int, int], Any] = OrderedDict()
_hash_cache_bytes = 0
_hash_cache_lock = threading.Lock()


def _hash_normal_cached(key1: int, key2: int, numel: int) -> Any:
    """`hash_normal`'s ``numel`` samples of the keys ``(key1, key2)`` on the CPU (numpy engine):
    a fresh ``float64`` numpy array (the caller may change it), its prefix from the cache, the
    rest computed by `_hash_normal_numpy` and then cached."""
    return _hash_normal_cached_many([(key1, key2)], [numel])[0]


def _hash_normal_cached_many(keys: list[tuple[int, int]], numels: list[int]) -> list[Any]:
    """`_hash_normal_cached` of several ``(key1, key2)`` streams: one ``[numel] float64`` numpy
    array per stream (one request: a fresh array; several: disjoint views of one fresh buffer),
    the cached prefixes copied, every missing tail computed in ONE `_hash_normal_numpy_segments`
    pass, then each stream cached as `_hash_normal_cached` does."""
    import numpy as np

    global _hash_cache_bytes
    if len(numels) == 1:
        results = [np.empty(numels[0], dtype=np.float64)]
    else:
        buffer = np.empty(sum(numels), dtype=np.float64)
        bounds = np.cumsum([0, *numels]).tolist()
        results = [buffer[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    segments, targets, computed = [], [], []
    for key, numel, result in zip(keys, numels, results):
        with _hash_cache_lock:
            cached = _hash_cache.get(key)
            if cached is not None:
                _hash_cache.move_to_end(key)
        have = 0 if cached is None else min(len(cached), numel)
        if have:
            result[:have] = cached[:have]
        computed.append(have)
        if have < numel:
            segments.append((key[0], key[1], have, numel))
            targets.append(result[have:])
    if not segments:
        return results
    _hash_normal_numpy_segments(segments, targets)
    for key, numel, result, have in zip(keys, numels, results, computed):
        if have == numel or result.nbytes > _HASH_CACHE_BYTES:  # fully cached: nothing new
            continue
        with _hash_cache_lock:
            old = _hash_cache.pop(key, None)
            if old is not None:
                _hash_cache_bytes -= old.nbytes
            keep = old if old is not None and len(old) >= numel else result.copy()
            _hash_cache[key] = keep
            _hash_cache_bytes += keep.nbytes
            while _hash_cache_bytes > _HASH_CACHE_BYTES:
                _, dropped = _hash_cache.popitem(last=False)
                _hash_cache_bytes -= dropped.nbytes
    return results


def _hash_normal_numpy(key1: int, key2: int, start0: int, stop: int, result: Any) -> None:
    """Samples ``start0 .. stop - 1`` of the stream with keys ``(key1, key2)`` into ``result``
    (``[stop - start0] float64``): the numpy engine of `hash_normal` (see its Implementation note;
    every element is computed on its own from its index, so a range has the bits of the whole
    stream there)."""
    _hash_normal_numpy_segments([(key1, key2, start0, stop)], [result])


def _hash_normal_numpy_segments(segments: list[tuple[int, int, int, int]], targets: list[Any]) -> None:
    """Several `_hash_normal_numpy` ranges in one pass: segment ``(key1, key2, start, stop)``
    writes its samples into ``targets[j]`` (``[stop - start] float64``). The segments are packed
    one after the other into blocks of ``16384`` elements: a block inside one segment runs with
    scalar keys and counters from ``arange`` (as one stream always did, written straight into its
    target); a block straddling segments (the point: many small streams share one block's ~90
    numpy calls) gets per-element ``uint32`` arrays of the counters ``2 i`` and of both keys,
    filled per piece, and is copied to the targets' pieces after. Every element sees the same
    operations either way (xor with its key, then the same hash, Box-Muller, polynomials and
    Newton steps), so the bits are those of one stream at a time."""
    import numpy as np

    block = 16384  # elements per block: 8192 was 5-10% slower (numpy call overhead), 32768 no faster

    def blocks():  # lists of pieces (key1, key2, start, stop, target piece), all but the last full
        pieces, fill = [], 0
        for (key1, key2, lo, hi), target in zip(segments, targets):
            pos = lo
            while pos < hi:
                take = min(hi - pos, block - fill)
                pieces.append((key1, key2, pos, pos + take, target[pos - lo : pos - lo + take]))
                fill, pos = fill + take, pos + take
                if fill == block:
                    yield pieces
                    pieces, fill = [], 0
        if pieces:
            yield pieces

    total = sum(hi - lo for _, _, lo, hi in segments)
    if total == 0:
        return
    ncoef = max(len(_COS_COEFFS), len(_ATANH_COEFFS))
    pad = lambda coeffs: [0.0] * (ncoef - len(coeffs)) + list(reversed(coeffs))  # noqa: E731
    table = np.array([pad(_ATANH_COEFFS), pad(_COS_COEFFS)]).T.copy()[:, :, None]  # [ncoef, 2, 1]
    half_sqrt = math.sqrt(0.5)
    mult = (np.uint32(0x21F0AAAD), np.uint32(0x735A2D97))
    n = min(block, total)
    c, t = np.empty((2, n), np.uint32), np.empty((2, n), np.uint32)
    f, x, acc = np.empty((2, n)), np.empty((2, n)), np.empty((2, n))
    m, r, w, g = np.empty(n), np.empty(n), np.empty(n), np.empty(n)
    e, flag, bit = np.empty(n, np.int32), np.empty(n, bool), np.empty(n, np.int32)
    kk1, kk2, scratch = np.empty(n, np.uint32), np.empty(n, np.uint32), np.empty(n)
    # no masked (``where=``) ufuncs below: they are several times slower than plain ones; each
    # select is an exact multiplication by 1.0/2.0/-1.0, an integer subtraction of 0/1 or a
    # minimum, the same bits as the select it replaces

    def mix(v):  # _mix32 on uint32: wrap-around products are the int64 products & _M32
        for shift, multiplier in ((16, mult[0]), (15, mult[1]), (15, None)):
            np.right_shift(v, shift, out=t)
            v ^= t
            if multiplier is not None:
                v *= multiplier

    for pieces in blocks():
        size = sum(hi - lo for _, _, lo, hi, _ in pieces)
        if size < n:
            n = size
            c, t, f, x, acc = c[:, :n], t[:, :n], f[:, :n], x[:, :n], acc[:, :n]
            m, r, w, g, e, flag, bit = m[:n], r[:n], w[:n], g[:n], e[:n], flag[:n], bit[:n]
        if len(pieces) == 1:
            key1, key2, lo, hi, out = pieces[0]
            c[0] = np.arange(2 * lo, 2 * hi, 2, dtype=np.uint32)
            b1, b2 = np.uint32(key1), np.uint32(key2)
        else:
            at = 0
            for key1, key2, lo, hi, _ in pieces:
                c[0, at : at + hi - lo] = np.arange(2 * lo, 2 * hi, 2, dtype=np.uint32)
                kk1[at : at + hi - lo] = key1
                kk2[at : at + hi - lo] = key2
                at += hi - lo
            b1, b2, out = kk1[:n], kk2[:n], scratch[:n]  # keys broadcast over both counters
        np.add(c[0], np.uint32(1), out=c[1])
        c ^= b1
        mix(c)
        c ^= b2
        mix(c)
        f[...] = c
        u1, a = f[0], f[1]
        u1 += 0.5
        u1 *= 2.0**-32  # (0, 1)
        np.frexp(u1, out=(m, e))
        np.less(m, half_sqrt, out=flag)
        np.add(flag, 1.0, out=g)
        m *= g  # m * 2 where flag (exact)
        np.subtract(e, flag, out=e)  # e - 1 where flag
        np.subtract(m, 1.0, out=r)
        m += 1.0
        np.divide(r, m, out=r)  # s = (m - 1) / (m + 1)
        a *= 2.0**-31
        a -= 1.0
        np.abs(a, out=a)  # a = |2 u2 - 1|
        np.greater(a, 0.5, out=flag)
        np.subtract(1.0, a, out=w)
        np.minimum(a, w, out=a)  # b: 1 - a where a > 0.5 (then 1 - a < a), else a (<= 1 - a)
        np.multiply(r, r, out=x[0])
        np.multiply(a, a, out=x[1])
        acc[...] = table[0]
        for coefficient in table[1:]:
            acc *= x
            acc += coefficient
        np.multiply(r, 2.0, out=r)
        r *= acc[0]
        np.multiply(e, math.log(2.0), out=w)  # int32 -> float64 exactly, then one rounding
        r += w  # log(u1)
        np.multiply(flag, 2.0, out=g)
        g -= 1.0
        acc[1] *= g  # cos(2 pi u2): negated where not flag (exact)
        r *= -2.0  # y = -2 log(u1) > 0; sqrt(y) as _sqrt does it
        np.frexp(r, out=(m, e))
        np.bitwise_and(e, 1, out=bit)  # e odd (two's complement: also for e < 0)
        np.add(bit, 1.0, out=g)
        m *= g  # m * 2 where e is odd (exact)
        e -= bit
        np.add(m, 1.0, out=r)
        r *= 0.5
        for _ in range(5):
            np.divide(m, r, out=w)
            r += w
            r *= 0.5
        bits64 = w.view(np.int64)
        np.copyto(bits64, e)
        bits64 >>= 1  # e is even: e // 2
        bits64 += 1023
        bits64 <<= 52  # 2**(e / 2), exactly
        r *= w
        np.multiply(r, acc[1], out=out)
        if len(pieces) > 1:
            at = 0
            for _, _, lo, hi, piece in pieces:
                piece[...] = out[at : at + hi - lo]
                at += hi - lo


def _hash_normal_torch_many(seed: int, requests: list[tuple[int, int]], device: torch.device | str) -> list[torch.Tensor]:
    """`hash_normal_torch` of several ``(stream, numel)`` requests in one pass (the torch engine of
    `hash_normal_many`): element ``j`` of the concatenation belongs to request ``r`` (found with
    ``searchsorted`` on the device from one small host table of offsets and keys) and gets the
    counters ``2 i``, ``2 i + 1`` (``i`` its index in its stream) xored with ``key1[r]``, then
    ``key2[r]``, as int64 tensors; after the hash, `_box_muller` (as `hash_normal_torch`) on the
    whole ``[total]`` tensor. About 110 kernel launches for all the requests (against ~100 per
    request). Returns ``[numel] float64`` views, one per request, of one buffer."""
    numels = [numel for _, numel in requests]
    total = sum(numels)
    keys = [_hash_keys(seed, stream) for stream, _ in requests]
    ends, offsets, acc = [], [], 0
    for numel in numels:
        offsets.append(acc)
        acc += numel
        ends.append(acc)
    table = torch.tensor([ends, offsets, [k for k, _ in keys], [k for _, k in keys]], dtype=torch.int64)
    table = table.to(device)  # one host-to-device copy
    element = torch.arange(total, dtype=torch.int64, device=device)
    owner = torch.searchsorted(table[0], element, right=True)  # request of each element
    index = element - table[1][owner]
    counter = (index * 2)[:, None] + torch.arange(2, dtype=torch.int64, device=device)  # [total, 2]: 2i, 2i+1
    counter ^= table[2][owner][:, None]
    values = _box_muller(_mix32(_mix32(counter) ^ table[3][owner][:, None]).to(torch.float64))
    return list(values.split(numels))


@dataclass
class AttentionInputs:
    """The tensors of one case in the canonical layout (see `oracle.config`), in the case dtype.

    Attributes:
        q: ``[batch_size, seqlen_q, num_heads, head_dim]`` (thd: ``[total_q, num_heads, head_dim]``).
        k: ``[batch_size, seqlen_k, num_heads_kv, head_dim]`` (thd: ``[total_k, ...]``).
        v: ``[batch_size, seqlen_k, num_heads_kv, head_dim_v]`` (thd: ``[total_k, ...]``).
        dout: gradient of the loss w.r.t. the output, shaped like the output
            ``[batch_size, seqlen_q, num_heads, head_dim_v]`` (thd: ``[total_q, ...]``).
        cu_seqlens_q: thd only, ``[batch_size + 1] int32`` cumulative query lengths from 0.
        cu_seqlens_k: thd only, ``[batch_size + 1] int32`` cumulative key lengths from 0.

    `make_inputs` of a forward-only case (``backward=False``) builds ``dout`` lazily: on the first
    read of ``inputs.dout`` (the same bits as an eager build); `dout_built` says whether it exists
    yet and `dout_meta` gives its ``(shape, dtype)`` without building it.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None

    def __getattr__(self, name: str):  # only for a missing attribute: the lazy ``dout``
        lazy = self.__dict__.get("_lazy_dout")
        if name != "dout" or lazy is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        value = lazy[2]()
        self.__dict__["dout"] = value
        del self.__dict__["_lazy_dout"]
        return value

    def __getstate__(self) -> dict:  # a pickled or copied AttentionInputs carries a built dout
        self.dout
        return self.__dict__

    @property
    def dout_built(self) -> bool:
        """Whether ``dout`` exists (False only while a lazy ``dout`` has not been read)."""
        return "dout" in self.__dict__

    @property
    def dout_meta(self) -> tuple[tuple[int, ...], torch.dtype]:
        """``(shape, dtype)`` of ``dout``, without building a lazy one."""
        if self.dout_built:
            return tuple(self.dout.shape), self.dout.dtype
        shape, dtype, _ = self.__dict__["_lazy_dout"]
        return shape, dtype

    def to(self, device: torch.device | str) -> AttentionInputs:
        """A copy with every tensor on ``device`` (values and dtypes unchanged)."""
        moved = {
            f.name: (None if getattr(self, f.name) is None else getattr(self, f.name).to(device, copy=True))
            for f in dataclasses.fields(self)
        }
        return AttentionInputs(**moved)


def _cu_seqlens(lengths: tuple[int, ...], device: torch.device | str) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)


def _prefetch_requests(case: AttentionCase, shape_q, shape_k, shape_v, shape_out) -> list[tuple[int, int]]:
    """The ``(stream, numel)`` `hash_normal` draws `make_inputs` certainly makes for ``case``, with
    the numel of each (shapes as there; dout only with ``case.backward``)."""
    numel = math.prod
    requests = [(STREAM_Q, numel(shape_q)), (STREAM_K, numel(shape_k)), (STREAM_V, numel(shape_v))]
    if case.qk_rank:
        rank = min(case.qk_rank, case.head_dim)
        requests.append((STREAM_Q_BASIS, case.num_heads * rank * case.head_dim))
        requests.append((STREAM_K_BASIS, case.num_heads_kv * rank * case.head_dim))
    if case.input_distribution == "outliers":
        requests += [(STREAM_Q_OUTLIERS, numel(shape_q)), (STREAM_K_OUTLIERS, numel(shape_k))]
    elif case.input_distribution == "near_constant":
        requests.append((STREAM_K_BASE, case.num_heads_kv * case.head_dim))
    if case.backward:
        requests.append((STREAM_DOUT, numel(shape_out)))
    return requests


def make_inputs(case: AttentionCase, device: torch.device | str = "cpu") -> AttentionInputs:
    """Build the inputs of ``case``: deterministic, in ``case.dtype``, on ``device``.

    Args:
        case: the attention case (shapes, layout, dtype, ``input_distribution``, ``seed``).
        device: where the tensors are built and live.

    Returns:
        `AttentionInputs` in the canonical layout; bit-identical for equal cases on any device.

    Every `hash_normal` stream the case certainly reads (q, k, v; dout when ``case.backward``;
    the outlier selections of ``outliers``; the key base of ``near_constant``; the q/k bases of
    ``qk_rank``) is drawn up front in ONE `hash_normal_many` call (`_prefetch_requests`), with the
    numel each later draw asks for: per-call overhead, not arithmetic, dominated the cost (see
    `hash_normal_many`). The steps are the portable core's (`oracle.portable.float64_inputs`,
    `oracle.portable.dout_values`, the code every exported repro copies); their draws take their
    tensor from the prefetched ones (a stream absent from them is drawn directly); a forward-only
    case's dout stays lazy and drawn on its own. The bits are those of the per-stream draws
    (``tests/oracle/test_inputs_many.py``).
    """
    dtype = torch_dtype(case.dtype)
    shape_q, shape_k, shape_v, shape_out = input_shapes(case)

    requests = _prefetch_requests(case, shape_q, shape_k, shape_v, shape_out)
    drawn = dict(zip(requests, hash_normal_many(case.seed, requests, device)))

    def normal(stream: int, shape: tuple[int, ...]) -> torch.Tensor:
        numel = math.prod(shape)
        values = drawn.pop((stream, numel), None)
        return (hash_normal(case.seed, stream, numel, device) if values is None else values).view(shape)

    q, k, v = float64_inputs(case, normal)  # the portable core's steps, with the prefetched draws

    def dout() -> torch.Tensor:
        return dout_values(case, normal).to(dtype)

    inputs = AttentionInputs(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), dout=dout() if case.backward else None)
    if not case.backward:  # forward-only: dout is built on its first read (see AttentionInputs)
        del inputs.__dict__["dout"]
        inputs.__dict__["_lazy_dout"] = (tuple(shape_out), dtype, dout)
    if case.is_varlen:
        inputs.cu_seqlens_q = _cu_seqlens(case.seqlens_q_list, device)
        inputs.cu_seqlens_k = _cu_seqlens(case.seqlens_k_list, device)
    return inputs


__all__ = [
    "AttentionInputs",
    "hash_normal",
    "hash_normal_many",
    "hash_uniform",
    "make_inputs",
    "massive_channel_indices",
    "score_offset_channel",
    "seq_scale_exponents",
]
