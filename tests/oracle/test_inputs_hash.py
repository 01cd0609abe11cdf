"""The vectorised `oracle.inputs.hash_normal` gives the bits of the original implementation.

`reference_hash_normal` below is the implementation every stored case was generated with (commit
992da02, verbatim but for its name): integer hash, Box-Muller with log and cos by Horner, sqrt by
Newton, each step a separate torch operation. Stored corpus cases replay by their recorded inputs,
so the new code must reproduce it bit for bit, on every size (block edges of the numpy path
included), seed, stream and device, and through every cast to a case dtype.
"""

from __future__ import annotations

import math

import pytest
import torch

from oracle.inputs import hash_normal

_M32 = 0xFFFFFFFF
_COS_COEFFS = [(-1) ** n * math.pi ** (2 * n) / math.factorial(2 * n) for n in range(11)]
_ATANH_COEFFS = [1.0 / (2 * n + 1) for n in range(10)]


def _mix32(x):
    if not isinstance(x, torch.Tensor):
        return int(_mix32(torch.tensor([x], dtype=torch.int64)))
    scratch = torch.empty_like(x)
    for shift, multiplier in ((16, 0x21F0AAAD), (15, 0x735A2D97), (15, None)):
        x ^= torch.bitwise_right_shift(x, shift, out=scratch)
        if multiplier is not None:
            x *= multiplier
            x &= _M32
    return x


def _horner(x, coeffs):
    acc = torch.full_like(x, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc.mul_(x).add_(c)
    return acc


def _sqrt(x):
    mantissa, exponent = torch.frexp(x)
    odd = (exponent % 2) != 0
    mantissa = torch.where(odd, mantissa * 2.0, mantissa)
    half = (exponent - odd.to(exponent.dtype)).to(torch.int64) // 2
    root = (mantissa + 1.0) * 0.5
    for _ in range(5):
        root = (root + mantissa / root) * 0.5
    return root * ((half + 1023) << 52).view(torch.float64)


def reference_hash_normal(seed, stream, numel, device="cpu"):
    """The original `hash_normal` (see the module docstring)."""
    key1 = _mix32(_mix32(seed & _M32) ^ _mix32((stream + 0x9E3779B9) & _M32))
    key2 = _mix32(key1 ^ 0x5BD1E995)
    counter = torch.arange(2 * numel, dtype=torch.int64, device=device)
    counter ^= key1
    bits = _mix32(_mix32(counter) ^ key2).to(torch.float64).view(numel, 2)
    u1 = (bits[:, 0] + 0.5) * 2.0**-32
    mantissa, exponent = torch.frexp(u1)
    low = mantissa < math.sqrt(0.5)
    mantissa = torch.where(low, mantissa * 2.0, mantissa)
    exponent = (exponent - low.to(exponent.dtype)).to(torch.float64)
    s = (mantissa - 1.0) / (mantissa + 1.0)
    log_u1 = 2.0 * s * _horner(s * s, _ATANH_COEFFS) + exponent * math.log(2.0)
    a = (bits[:, 1] * 2.0**-31 - 1.0).abs()
    b = torch.where(a > 0.5, 1.0 - a, a)
    cos_pi_b = _horner(b * b, _COS_COEFFS)
    cos_2pi_u2 = torch.where(a > 0.5, cos_pi_b, -cos_pi_b)
    return _sqrt(-2.0 * log_u1) * cos_2pi_u2


_SAME_WIDTH_INT = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def assert_bit_identical(actual: torch.Tensor, expected: torch.Tensor, what) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    as_int = _SAME_WIDTH_INT[actual.dtype]
    differ = int((actual.contiguous().view(as_int) != expected.contiguous().view(as_int)).sum())
    assert differ == 0, f"{what}: {differ} of {actual.numel()} values differ"


SIZES = (0, 1, 2, 3, 7, 8191, 8192, 8193, 16383, 16384, 16384 + 5, 32768 + 1, 70_001)  # the numpy path works in blocks of 16384
SEEDS_STREAMS = [(0, 0), (1, 1), (2**32 - 1, 7), (12345, 3), (7, 2**32 - 1), (2**31, 4), (99991, 13)]


@pytest.mark.parametrize("numel", SIZES)
def test_hash_normal_is_bit_identical_to_the_original_on_every_size(numel):
    for seed, stream in SEEDS_STREAMS:
        assert_bit_identical(hash_normal(seed, stream, numel), reference_hash_normal(seed, stream, numel), (seed, stream, numel))


def test_hash_normal_is_bit_identical_to_the_original_over_many_seeds_and_streams():
    for i in range(300):
        seed, stream = (i * 2654435761) % 2**32, i % 17
        numel = 1 + (i * 37) % 1500
        assert_bit_identical(hash_normal(seed, stream, numel), reference_hash_normal(seed, stream, numel), (seed, stream, numel))


def test_hash_normal_over_a_million_values_matches_the_original_and_every_dtype_cast():
    new, old = hash_normal(2024, 1, 1_000_003), reference_hash_normal(2024, 1, 1_000_003)
    assert_bit_identical(new, old, "float64")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert_bit_identical(new.to(dtype), old.to(dtype), dtype)


@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_each_engine_is_bit_identical_to_the_original(engine):
    """The torch engine is what CUDA runs; here it runs on the CPU against the original."""
    for numel in (1, 8193, 20_000):
        for seed, stream in SEEDS_STREAMS:
            actual = hash_normal(seed, stream, numel, engine=engine)
            assert_bit_identical(actual, reference_hash_normal(seed, stream, numel), (engine, seed, stream, numel))


def test_an_unknown_engine_is_refused_naming_the_allowed_values():
    with pytest.raises(ValueError, match="engine.*'auto', 'torch', 'numpy'"):
        hash_normal(0, 0, 4, engine="fast")
    with pytest.raises(ValueError, match="CPU only"):
        hash_normal(0, 0, 4, "cuda", engine="numpy")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_hash_normal_on_cuda_is_bit_identical_to_the_original_on_the_cpu():
    for numel in (1, 8193, 2_000_000):
        for seed, stream in SEEDS_STREAMS[:4]:
            cuda = hash_normal(seed, stream, numel, "cuda").cpu()
            assert_bit_identical(cuda, reference_hash_normal(seed, stream, numel), (seed, stream, numel))


def test_the_cpu_cache_gives_the_bits_of_the_original_through_prefixes_growth_and_eviction(monkeypatch) -> None:
    """A stream asked for again (shorter, equal, longer: its tail computed past the cached part,
    across block edges) or after it was evicted gives the original bits, and every call returns a
    fresh tensor: writing into one changes no later result."""
    import oracle.inputs as inputs

    monkeypatch.setattr(inputs, "_hash_cache", type(inputs._hash_cache)())
    monkeypatch.setattr(inputs, "_hash_cache_bytes", 0)
    monkeypatch.setattr(inputs, "_HASH_CACHE_BYTES", 8 * 40_000)  # room for about two streams
    for seed, stream, numel in [(7, 1, 100), (7, 1, 50), (7, 1, 100), (7, 1, 16384 + 77), (7, 1, 20_000),
                                (7, 2, 30_000), (8, 1, 30_000), (7, 1, 20_001), (7, 2, 1), (9, 3, 50_000)]:
        got = hash_normal(seed, stream, numel)
        assert torch.equal(got.view(torch.int64), reference_hash_normal(seed, stream, numel).view(torch.int64)), (seed, stream, numel)
        got.fill_(0.0)  # the caller owns its tensor
        assert inputs._hash_cache_bytes <= inputs._HASH_CACHE_BYTES
        assert inputs._hash_cache_bytes == sum(a.nbytes for a in inputs._hash_cache.values())
    assert inputs._hash_keys(9, 3) not in inputs._hash_cache  # larger than the bound: never kept
    assert torch.equal(hash_normal(9, 3, 5), reference_hash_normal(9, 3, 5))
    assert len(inputs._hash_cache[inputs._hash_keys(9, 3)]) == 5
