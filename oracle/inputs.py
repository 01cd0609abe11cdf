"""Deterministic attention inputs: the same case gives the same bits on every device and every run.

Values come from `hash_normal`: a counter-based generator (a 32-bit integer hash of seed, stream
and element index, then Box-Muller) written only with integer operations and IEEE-754 float64
``+ - * /``, each a separate torch operation. Those operations are correctly rounded on CPUs and
CUDA GPUs alike, so the float64 values, and the values cast to the case dtype, are bit-identical
everywhere. ``torch.Generator`` is not used (its streams differ between CPU and CUDA), and neither
are ``torch.log``, ``torch.cos`` and ``torch.sqrt`` (their last bit differs between CPU and CUDA:
measured for sqrt on an H200, 0.8% of float64 results; that would flip an occasional float32
rounding): `hash_normal` evaluates log and cos with fixed polynomials and sqrt by Newton's method.

Streams (``stream`` argument of `hash_normal`): 1 q, 2 k, 3 v, 4 dout, 5 q outlier selection,
6 k outlier selection, 7 near-constant key base. Elements are numbered in the canonical layout
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
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from oracle.config import AttentionCase, torch_dtype

STREAM_Q, STREAM_K, STREAM_V, STREAM_DOUT = 1, 2, 3, 4
STREAM_Q_OUTLIERS, STREAM_K_OUTLIERS, STREAM_K_BASE = 5, 6, 7

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
    runs in numpy, in blocks of ``8192`` elements that stay in cache, with the hash in
    ``uint32`` (wrap-around multiplication, logical shifts: the same bits as the ``int64``
    version masked to 32 bits) and the log and cos polynomials evaluated as one stacked Horner
    loop (the log polynomial padded with a leading ``0``, whose first step ``0 * x + c = c`` is
    exact). Each element still sees exactly the rounded operations of the ``torch`` path used on
    every other device (CUDA), so the bits are the same: ``tests/oracle/test_inputs_hash.py``
    checks them against the original implementation, and ``benchmarks/hash_normal_bench.py``
    measures the speed-up side by side.

    Raises:
        ValueError: ``engine`` is not one of ``"auto"``, ``"numpy"``, ``"torch"``, or ``"numpy"``
            with a device other than the CPU.

    Source: Box & Muller, "A Note on the Generation of Random Normal Deviates", Ann. Math. Statist.
    29(2), 1958; hash constants from https://github.com/skeeto/hash-prospector.
    """
    on_cpu = torch.device(device).type == "cpu"
    if engine not in ("auto", "numpy", "torch") or (engine == "numpy" and not on_cpu):
        raise ValueError(f"engine: {engine!r} on device {device!r}; allowed: 'auto', 'torch', 'numpy' (CPU only)")
    key1 = _mix32(_mix32(seed & _M32) ^ _mix32((stream + 0x9E3779B9) & _M32))
    key2 = _mix32(key1 ^ 0x5BD1E995)
    if on_cpu and engine != "torch":
        import numpy as np

        block = 8192
        ncoef = max(len(_COS_COEFFS), len(_ATANH_COEFFS))
        pad = lambda coeffs: [0.0] * (ncoef - len(coeffs)) + list(reversed(coeffs))  # noqa: E731
        table = np.array([pad(_ATANH_COEFFS), pad(_COS_COEFFS)]).T.copy()[:, :, None]  # [ncoef, 2, 1]
        k1, k2, half_sqrt = np.uint32(key1), np.uint32(key2), math.sqrt(0.5)
        mult = (np.uint32(0x21F0AAAD), np.uint32(0x735A2D97))
        result = np.empty(numel, dtype=np.float64)
        n = min(block, numel)
        c, t = np.empty((2, n), np.uint32), np.empty((2, n), np.uint32)
        f, x, acc = np.empty((2, n)), np.empty((2, n)), np.empty((2, n))
        m, r, w = np.empty(n), np.empty(n), np.empty(n)
        e, flag = np.empty(n, np.int32), np.empty(n, bool)

        def mix(v):  # _mix32 on uint32: wrap-around products are the int64 products & _M32
            for shift, multiplier in ((16, mult[0]), (15, mult[1]), (15, None)):
                np.right_shift(v, shift, out=t)
                v ^= t
                if multiplier is not None:
                    v *= multiplier

        for start in range(0, numel, block):
            if numel - start < n:
                n = numel - start
                c, t, f, x, acc = c[:, :n], t[:, :n], f[:, :n], x[:, :n], acc[:, :n]
                m, r, w, e, flag = m[:n], r[:n], w[:n], e[:n], flag[:n]
            c[0] = np.arange(2 * start, 2 * (start + n), 2, dtype=np.uint32)
            np.add(c[0], np.uint32(1), out=c[1])
            c ^= k1
            mix(c)
            c ^= k2
            mix(c)
            f[...] = c
            u1, a = f[0], f[1]
            u1 += 0.5
            u1 *= 2.0**-32  # (0, 1)
            np.frexp(u1, out=(m, e))
            np.less(m, half_sqrt, out=flag)
            np.multiply(m, 2.0, out=m, where=flag)
            np.subtract(e, 1, out=e, where=flag)
            np.subtract(m, 1.0, out=r)
            m += 1.0
            np.divide(r, m, out=r)  # s = (m - 1) / (m + 1)
            a *= 2.0**-31
            a -= 1.0
            np.abs(a, out=a)  # a = |2 u2 - 1|
            np.greater(a, 0.5, out=flag)
            np.subtract(1.0, a, out=a, where=flag)  # b
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
            np.negative(acc[1], out=acc[1], where=~flag)  # cos(2 pi u2)
            r *= -2.0  # y = -2 log(u1) > 0; sqrt(y) as _sqrt does it
            np.frexp(r, out=(m, e))
            np.not_equal(e % 2, 0, out=flag)
            np.multiply(m, 2.0, out=m, where=flag)
            np.subtract(e, 1, out=e, where=flag)
            np.add(m, 1.0, out=r)
            r *= 0.5
            for _ in range(5):
                np.divide(m, r, out=w)
                r += w
                r *= 0.5
            w.view(np.int64)[...] = (e.astype(np.int64) // 2 + 1023) << 52  # 2**(e / 2), exactly
            r *= w
            np.multiply(r, acc[1], out=result[start : start + n])
        return torch.from_numpy(result)
    counter = torch.arange(2 * numel, dtype=torch.int64, device=device)
    counter ^= key1
    bits = _mix32(_mix32(counter) ^ key2).to(torch.float64).view(numel, 2)
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
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> AttentionInputs:
        """A copy with every tensor on ``device`` (values and dtypes unchanged)."""
        moved = {
            f.name: (None if getattr(self, f.name) is None else getattr(self, f.name).to(device, copy=True))
            for f in dataclasses.fields(self)
        }
        return AttentionInputs(**moved)


def _cu_seqlens(lengths: tuple[int, ...], device: torch.device | str) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)


def make_inputs(case: AttentionCase, device: torch.device | str = "cpu") -> AttentionInputs:
    """Build the inputs of ``case``: deterministic, in ``case.dtype``, on ``device``.

    Args:
        case: the attention case (shapes, layout, dtype, ``input_distribution``, ``seed``).
        device: where the tensors are built and live.

    Returns:
        `AttentionInputs` in the canonical layout; bit-identical for equal cases on any device.
    """
    dtype = torch_dtype(case.dtype)
    if case.is_varlen:
        rows_q, rows_k = (case.total_q,), (case.total_k,)
    else:
        rows_q, rows_k = (case.batch_size, case.seqlen_q), (case.batch_size, case.seqlen_k)
    shape_q = (*rows_q, case.num_heads, case.head_dim)
    shape_k = (*rows_k, case.num_heads_kv, case.head_dim)
    shape_v = (*rows_k, case.num_heads_kv, case.head_dim_v)
    shape_out = (*rows_q, case.num_heads, case.head_dim_v)

    def normal(stream: int, shape: tuple[int, ...]) -> torch.Tensor:
        return hash_normal(case.seed, stream, math.prod(shape), device).view(shape)

    q, k = normal(STREAM_Q, shape_q), normal(STREAM_K, shape_k)
    if case.input_distribution == "large_logits":
        q = q * min(LARGE_LOGITS_STD / (case.softmax_scale * math.sqrt(case.head_dim)), MAX_Q_GAIN)
    elif case.input_distribution == "outliers":
        q = torch.where(normal(STREAM_Q_OUTLIERS, shape_q).abs() > OUTLIER_Z, q * OUTLIER_GAIN, q)
        k = torch.where(normal(STREAM_K_OUTLIERS, shape_k).abs() > OUTLIER_Z, k * OUTLIER_GAIN, k)
    elif case.input_distribution == "near_constant":
        base = normal(STREAM_K_BASE, (case.num_heads_kv, case.head_dim)).to(torch.bfloat16).to(torch.float64)
        k = base * (1.0 + NEAR_CONSTANT_NOISE * k.clamp(-1.0, 1.0))
    inputs = AttentionInputs(
        q=q.to(dtype),
        k=k.to(dtype),
        v=normal(STREAM_V, shape_v).to(dtype),
        dout=normal(STREAM_DOUT, shape_out).to(dtype),
    )
    if case.is_varlen:
        inputs.cu_seqlens_q = _cu_seqlens(case.seqlens_q_list, device)
        inputs.cu_seqlens_k = _cu_seqlens(case.seqlens_k_list, device)
    return inputs


__all__ = ["AttentionInputs", "hash_normal", "make_inputs"]
