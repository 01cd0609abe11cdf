"""`oracle.inputs.hash_normal_many` and the prefetching `make_inputs` give the bits of the
per-stream path they replace.

`reference_make_inputs` below is `make_inputs` as of commit 04c98f7 (before the prefetch): every
`hash_normal` stream drawn by its own call, through `reference_hash_normal` (the original
implementation, `tests.oracle.test_inputs_hash`), so it checks the whole new path: the combined
numpy/torch pass, the prefix cache and the prefetch bookkeeping in `make_inputs`. Cases come from
`oracle.calibration.random_case` with every input family, dtype, layout (bshd, sbhd, thd) and
backward on/off layered on top.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch

import oracle.inputs as inputs_module
from oracle.calibration import random_case
from oracle.config import AttentionCase, torch_dtype
from oracle.inputs import (
    LARGE_LOGITS_STD,
    MAX_Q_GAIN,
    NEAR_CONSTANT_NOISE,
    OUTLIER_GAIN,
    OUTLIER_Z,
    STREAM_DOUT,
    STREAM_K,
    STREAM_K_BASE,
    STREAM_K_BASIS,
    STREAM_K_OUTLIERS,
    STREAM_Q,
    STREAM_Q_BASIS,
    STREAM_Q_OUTLIERS,
    STREAM_V,
    _dout,
    _llm_like_and_offsets,
    hash_normal,
    hash_normal_many,
    make_inputs,
)
from tests.oracle.test_inputs_hash import reference_hash_normal


def clear_cache() -> None:
    with inputs_module._hash_cache_lock:
        inputs_module._hash_cache.clear()
        inputs_module._hash_cache_bytes = 0


def bits(x: torch.Tensor) -> torch.Tensor:
    """An integer view of ``x``'s bits (float64/32 -> int64/32, 16-bit floats -> int16)."""
    return x.contiguous().view({8: torch.int64, 4: torch.int32, 2: torch.int16}[x.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def reference_make_inputs(case: AttentionCase, normal_fn=reference_hash_normal, device="cpu", *, dout: bool = True) -> dict:
    """`make_inputs` before the prefetch (commit 04c98f7): one ``normal_fn`` (a `hash_normal`)
    call per stream; returns ``{name: tensor}`` of q, k, v, dout (unless ``dout=False``) and
    cu_seqlens (`benchmarks/make_inputs_bench.py` times it with ``normal_fn=hash_normal``)."""
    dtype = torch_dtype(case.dtype)
    if case.is_varlen:
        rows_q, rows_k = (case.total_q,), (case.total_k,)
    else:
        rows_q, rows_k = (case.batch_size, case.seqlen_q), (case.batch_size, case.seqlen_k)
    shape_q = (*rows_q, case.num_heads, case.head_dim)
    shape_k = (*rows_k, case.num_heads_kv, case.head_dim)
    shape_v = (*rows_k, case.num_heads_kv, case.head_dim_v)
    shape_out = (*rows_q, case.num_heads, case.head_dim_v)

    def normal(stream, shape):
        return normal_fn(case.seed, stream, math.prod(shape), device).view(shape)

    def low_rank(x, stream):
        heads, dim = x.shape[-2], x.shape[-1]
        rank = min(case.qk_rank, dim)
        basis = normal_fn(case.seed, stream, heads * rank * dim, device).view(heads, rank, dim)
        acc = x[..., 0:1] * basis[:, 0, :]
        for r in range(1, rank):
            acc = acc + x[..., r : r + 1] * basis[:, r, :]
        return acc * (1.0 / math.sqrt(rank))

    q, k = normal(STREAM_Q, shape_q), normal(STREAM_K, shape_k)
    if case.qk_rank:
        q = low_rank(q.view(-1, case.num_heads, case.head_dim), STREAM_Q_BASIS).view(shape_q)
        k = low_rank(k.view(-1, case.num_heads_kv, case.head_dim), STREAM_K_BASIS).view(shape_k)
    if case.input_distribution == "large_logits":
        q = q * min(LARGE_LOGITS_STD / (case.softmax_scale * math.sqrt(case.head_dim)), MAX_Q_GAIN)
    elif case.input_distribution == "outliers":
        q = torch.where(normal(STREAM_Q_OUTLIERS, shape_q).abs() > OUTLIER_Z, q * OUTLIER_GAIN, q)
        k = torch.where(normal(STREAM_K_OUTLIERS, shape_k).abs() > OUTLIER_Z, k * OUTLIER_GAIN, k)
    elif case.input_distribution == "near_constant":
        base = normal(STREAM_K_BASE, (case.num_heads_kv, case.head_dim)).to(torch.bfloat16).to(torch.float64)
        k = base * (1.0 + NEAR_CONSTANT_NOISE * k.clamp(-1.0, 1.0))
    v = normal(STREAM_V, shape_v)
    if case.input_families.keys() - {"dout_distribution"}:
        q, k = q.contiguous(), k.contiguous()
        _llm_like_and_offsets(
            case, q.view(-1, case.num_heads, case.head_dim), k.view(-1, case.num_heads_kv, case.head_dim),
            v.view(-1, case.num_heads_kv, case.head_dim_v), dtype,
        )
    out = {"q": q.to(dtype), "k": k.to(dtype), "v": v.to(dtype)}
    if dout:
        out["dout"] = _dout(case, normal(STREAM_DOUT, shape_out)).to(dtype)
    if case.is_varlen:
        out["cu_seqlens_q"] = inputs_module._cu_seqlens(case.seqlens_q_list, device)
        out["cu_seqlens_k"] = inputs_module._cu_seqlens(case.seqlens_k_list, device)
    return out


def _with_families(case: AttentionCase, rng: random.Random) -> AttentionCase:
    """``case`` with a random layout, backward flag and input families (valid combinations)."""
    fields: dict = {"backward": rng.random() < 0.6}
    if not case.is_varlen and rng.random() < 0.3:
        fields["qkv_format"] = "sbhd"
    choice = rng.randrange(4)
    if choice == 1:
        fields["score_offset"] = rng.choice((-200.0, -3.5, 40.0, 150.0))
        fields["score_offset_mode"] = rng.choice(("head", "row"))
    elif choice == 2:
        fields["input_distribution"] = "normal"
        if rng.random() < 0.6:
            fields["qk_rank"] = rng.randint(1, min(8, case.head_dim))
        if case.dtype != "float32" and rng.random() < 0.5:
            fields["massive_channels"] = rng.randint(1, min(4, case.head_dim))
        fields["attention_sink"] = rng.random() < 0.5
        if rng.random() < 0.5:
            fields["seq_scale_log2"] = rng.randint(1, 3)
        if rng.random() < 0.5:
            fields["peaked_rows"] = rng.choice((0.125, 0.5, 1.0))
    elif choice == 3:
        fields["qk_rank"] = rng.randint(1, min(case.head_dim + 2, 64))  # any distribution; rank above head_dim too
    if fields["backward"]:
        fields["dout_distribution"] = rng.choice(("normal", "tiny", "large", "sparse"))
    return dataclasses.replace(case, **fields)


def _cases(count: int, seed: int, max_seqlen: int) -> list[AttentionCase]:
    rng = random.Random(seed)
    return [_with_families(random_case(rng, max_seqlen=max_seqlen), rng) for _ in range(count)]


CASES = _cases(120, seed=1234, max_seqlen=160)


def test_the_cases_cover_every_family_dtype_and_layout():
    assert {c.dtype for c in CASES} == {"bfloat16", "float16", "float32"}
    assert {c.qkv_format for c in CASES} == {"bshd", "sbhd", "thd"}
    assert {c.input_distribution for c in CASES} == {"normal", "large_logits", "outliers", "near_constant"}
    assert {c.backward for c in CASES} == {True, False}
    families = set().union(*(c.input_families.keys() for c in CASES))
    assert families >= {"qk_rank", "massive_channels", "attention_sink", "seq_scale_log2", "peaked_rows",
                        "score_offset", "score_offset_mode", "dout_distribution"}


@pytest.mark.parametrize("warm", [False, True], ids=["fresh-cache", "warm-cache"])
def test_make_inputs_bits_equal_the_per_stream_path(warm):
    """Every tensor of every case, cache empty (all computed in the combined pass) or warm (the
    same cases again: prefixes and whole streams from the cache)."""
    clear_cache()
    if warm:
        for case in CASES:
            make_inputs(dataclasses.replace(case, backward=False))
    for case in CASES:
        expected = reference_make_inputs(case)
        got = make_inputs(case)
        assert got.dout_built == case.backward, case.describe()
        for name, tensor in expected.items():
            assert same_bits(getattr(got, name), tensor), (name, case.describe())


def test_make_inputs_torch_engine_bits_equal_the_per_stream_path(monkeypatch):
    """The torch engine of the combined pass (the one CUDA runs), here on the CPU."""
    original = inputs_module.hash_normal_many
    monkeypatch.setattr(inputs_module, "hash_normal_many", lambda seed, requests, device: original(seed, requests, device, engine="torch"))
    monkeypatch.setattr(inputs_module, "hash_normal", lambda seed, stream, numel, device: inputs_module.hash_normal_torch(seed, stream, numel, device))
    for case in CASES[:60]:
        expected = reference_make_inputs(case)
        got = make_inputs(case)
        for name, tensor in expected.items():
            assert same_bits(getattr(got, name), tensor), (name, case.describe())


SIZES = [0, 1, 7, 3860, 16383, 16384, 16385, 40001]


@pytest.mark.parametrize("engine", ["numpy", "torch"])
@pytest.mark.parametrize("cached", [False, True], ids=["uncached", "cached-prefix"])
def test_hash_normal_many_equals_per_stream_hash_normal(engine, cached):
    clear_cache()
    seed = 0xDEADBEEF
    requests = [(stream, n) for stream, n in zip([1, 2, 3, 4, 5, 6, 7, 8, 2], SIZES + [5])]
    if cached:  # prefixes shorter, equal and longer than the request; one stream fully cached twice over
        for stream, n in requests[::2]:
            hash_normal(seed, stream, n // 2 + 3, engine="numpy")
        hash_normal(seed, 5, 20000)
    got = hash_normal_many(seed, requests, engine=engine)
    assert len(got) == len(requests)
    for (stream, n), tensor in zip(requests, got):
        assert tensor.dtype == torch.float64 and tensor.shape == (n,)
        assert same_bits(tensor, reference_hash_normal(seed, stream, n)), (stream, n)
        assert same_bits(tensor, hash_normal(seed, stream, n, engine=engine)), (stream, n)
    # the cache now holds the full streams the combined pass computed
    if engine == "numpy":
        for stream, n in requests:
            assert same_bits(hash_normal(seed, stream, n), reference_hash_normal(seed, stream, n))


def test_hash_normal_many_results_are_disjoint_and_writable():
    clear_cache()
    a, b = hash_normal_many(3, [(1, 100), (2, 50)])
    expected_b = b.clone()
    a.fill_(0.0)
    assert torch.equal(b, expected_b)
    assert same_bits(hash_normal(3, 1, 100), reference_hash_normal(3, 1, 100))  # the cache is untouched


@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_planted_wrong_key_is_caught(engine, monkeypatch):
    """Streams of equal numel in one pass differ and each equals its own single-stream draw; a
    combined pass that gives one request the keys of another fails that check."""
    clear_cache()
    requests = [(1, 999), (2, 999), (3, 999)]

    def check() -> None:
        clear_cache()
        got = hash_normal_many(11, requests, engine=engine)
        assert not torch.equal(got[0], got[1]) and not torch.equal(got[1], got[2])
        for (stream, n), tensor in zip(requests, got):
            assert same_bits(tensor, reference_hash_normal(11, stream, n)), stream

    check()
    real_keys = inputs_module._hash_keys
    calls = []

    def planted(seed, stream):  # the keys of stream 2 are replaced by stream 1's for the combined pass
        calls.append(stream)
        return real_keys(seed, 1 if stream == 2 else stream)

    monkeypatch.setattr(inputs_module, "_hash_keys", planted)
    with pytest.raises(AssertionError):
        check()
    assert 2 in calls


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_make_inputs_bits_equal_the_cpu_per_stream_path():
    for case in CASES[:60]:
        expected = reference_make_inputs(case)
        got = make_inputs(case, "cuda")
        for name, tensor in expected.items():
            assert same_bits(getattr(got, name).cpu(), tensor), (name, case.describe())
    requests = [(stream, n) for stream, n in zip(range(1, 9), SIZES)]
    for (stream, n), tensor in zip(requests, hash_normal_many(5, requests, "cuda")):
        assert same_bits(tensor.cpu(), reference_hash_normal(5, stream, n)), (stream, n)
