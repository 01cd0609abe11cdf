"""The input families of `oracle.inputs`: closed-form checks of what each one does to q, k, v,
dout and the softmax, determinism, the JSON/case_id compatibility of `AttentionCase`, validation,
and the Hypothesis draw (`fuzzer.strategies.input_specs`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from oracle.config import INPUT_FAMILY_DEFAULTS, AttentionCase
from oracle.errors import CaseValidationError
from oracle.inputs import (
    DOUT_LARGE,
    DOUT_SPARSE_ROWS,
    DOUT_TINY,
    MASSIVE_K_GAIN,
    MASSIVE_Q_GAIN,
    SINK_CHANNEL,
    hash_uniform,
    make_inputs,
    massive_channel_indices,
    score_offset_channel,
    seq_scale_exponents,
)
from oracle.reference import reference

ROOT = Path(__file__).resolve().parents[2]
FAMILY_CASES = [
    dict(score_offset=-200.0),
    dict(score_offset=150.0, score_offset_mode="row"),
    dict(qk_rank=3),
    dict(massive_channels=2),
    dict(attention_sink=True),
    dict(seq_scale_log2=2),
    dict(peaked_rows=0.5),
    dict(dout_distribution="tiny"),
    dict(dout_distribution="large"),
    dict(dout_distribution="sparse"),
    dict(qk_rank=2, massive_channels=1, attention_sink=True, seq_scale_log2=1, peaked_rows=0.125),
]


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    as_int = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(as_int[a.dtype]), b.view(as_int[b.dtype]))


def _scores(case: AttentionCase, inputs) -> torch.Tensor:
    """float64 ``[b, h, sq, sk]`` scaled scores of a dense (bshd) case, GQA expanded."""
    k = inputs.k.double().repeat_interleave(case.group_size, dim=2)
    return torch.einsum("bqhd,bkhd->bhqk", inputs.q.double(), k) * case.softmax_scale


# ------------------------------------------------------------------ JSON, case_id, validation
def test_every_corpus_case_keeps_its_json_and_case_id():
    files = sorted((ROOT / "corpus").rglob("*.json"))
    assert files
    for path in files:
        data = json.loads(path.read_text())
        case = AttentionCase.from_json(data["case"])
        assert case.to_json() == data["case"], path
        assert path.stem.endswith(case.case_id), path


def test_a_case_without_families_has_the_json_and_id_it_had_before_they_existed():
    case = AttentionCase(batch_size=2, seqlen_q=33, seqlen_k=17, num_heads=4, num_heads_kv=2, head_dim=24, seed=9,
                         input_distribution="outliers")
    assert case.case_id == "4713967b4d3dd18a"  # computed with the config of commit 992da02
    assert not set(INPUT_FAMILY_DEFAULTS) & set(case.to_json())
    assert case.input_families == {}


@pytest.mark.parametrize("fields", FAMILY_CASES)
def test_family_fields_round_trip_and_change_the_case_id(fields):
    base = AttentionCase(seqlen_q=8, seqlen_k=8, head_dim=16, seed=1)
    case = base.replace(**fields)
    assert AttentionCase.from_json(json.loads(json.dumps(case.to_json()))) == case
    assert case.case_id != base.case_id
    assert set(case.input_families) == set(fields)
    assert all(f"{name}=" in case.describe() for name in fields)


def test_rank_and_massive_channels_above_head_dim_act_as_head_dim_so_a_shrunk_case_stays_valid():
    wide = AttentionCase(seqlen_q=6, seqlen_k=6, head_dim=64, qk_rank=8, massive_channels=4, seed=3)
    narrow = wide.replace(head_dim=2)  # what a minimiser may try
    inputs = make_inputs(narrow)
    assert inputs.q.shape[-1] == 2 and massive_channel_indices(narrow) == [0, 1]
    assert bool(torch.isfinite(inputs.q).all())


def test_equal_cases_hash_equally_whatever_the_spelling():
    plain = AttentionCase(seqlen_q=4, seqlen_k=4, head_dim=8)
    assert plain.replace(score_offset=-0.0, score_offset_mode="row").case_id == plain.case_id
    assert plain.replace(score_offset=-120).to_json()["score_offset"] == -120.0


@pytest.mark.parametrize(
    "fields, field, allowed",
    [
        (dict(score_offset=300.0), "score_offset", "-256 <= score_offset <= 256"),
        (dict(score_offset=math.inf), "score_offset", None),
        (dict(score_offset="big"), "score_offset", None),
        (dict(score_offset_mode="column"), "score_offset_mode", "head, row"),
        (dict(qk_rank=65), "qk_rank", "0 <= qk_rank <= 64"),
        (dict(qk_rank=-1), "qk_rank", None),
        (dict(massive_channels=1.5), "massive_channels", None),
        (dict(attention_sink=1), "attention_sink", "true, false"),
        (dict(seq_scale_log2=4), "seq_scale_log2", "0 <= seq_scale_log2 <= 3"),
        (dict(peaked_rows=1.5), "peaked_rows", "0 <= peaked_rows <= 1"),
        (dict(dout_distribution="huge"), "dout_distribution", "normal, tiny, large, sparse"),
    ],
)
def test_bad_family_values_are_refused_naming_the_field_and_the_allowed_values(fields, field, allowed):
    with pytest.raises(CaseValidationError) as info:
        AttentionCase(head_dim=16, **fields)
    assert field in str(info.value)
    if allowed is not None:
        assert allowed in str(info.value)


# ------------------------------------------------------------------ determinism and layouts
@pytest.mark.parametrize("fields", FAMILY_CASES)
def test_family_inputs_are_deterministic_and_the_same_in_every_dense_layout(fields):
    case = AttentionCase(batch_size=3, seqlen_q=12, seqlen_k=20, num_heads=4, num_heads_kv=2, head_dim=16,
                         dtype="float32", seed=77, **fields)
    first, again = make_inputs(case), make_inputs(case)
    sbhd = make_inputs(case.replace(qkv_format="sbhd"))
    thd = make_inputs(case.replace(qkv_format="thd"))  # equal lengths: the same tokens, packed
    for name in ("q", "k", "v", "dout"):
        a = getattr(first, name)
        assert _bits_equal(a, getattr(again, name)) and _bits_equal(a, getattr(sbhd, name)), name
        assert _bits_equal(a.reshape(-1, *a.shape[2:]), getattr(thd, name)), name
        assert bool(torch.isfinite(a).all()), name


def test_hash_uniform_is_uniform_in_the_open_unit_interval():
    u = hash_uniform(3, 11, 200_000)
    assert float(u.min()) > 0 and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 5 * math.sqrt(1 / 12 / u.numel())
    assert not torch.equal(u, hash_uniform(3, 12, 200_000))


# ------------------------------------------------------------------ closed-form checks
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("offset", [-200.0, 120.0])
def test_score_offset_moves_every_row_lse_by_exactly_the_shared_channel(dtype, offset):
    case = AttentionCase(batch_size=2, seqlen_q=40, seqlen_k=56, num_heads=2, head_dim=32, dtype=dtype, seed=4,
                         causal=True, causal_alignment="bottom_right", score_offset=offset)
    inputs = make_inputs(case)
    channel, beta = score_offset_channel(case)
    assert bool((inputs.k[..., channel].double() == beta).all())  # every key, every head
    without = make_inputs(case)
    without.q[..., channel] = 0
    shift = case.softmax_scale * inputs.q[..., channel].double() * beta  # [b, sq, h]
    lse, lse0 = reference(case, inputs).lse, reference(case, without).lse  # [b, h, sq]
    assert float((lse - lse0 - shift.permute(0, 2, 1)).abs().max()) < 1e-9 * abs(offset)
    assert float((shift - offset).abs().max()) < abs(offset) * 2**-7  # alpha rounded to the dtype
    assert float((lse - offset).abs().max()) < 8  # the rows' own spread is a few nats


def test_row_offsets_spread_row_lse_far_below_and_far_above_zero():
    case = AttentionCase(seqlen_q=256, seqlen_k=64, num_heads=2, head_dim=64, dtype="float32", seed=8,
                         score_offset=200.0, score_offset_mode="row")
    lse = reference(case, make_inputs(case)).lse
    assert float(lse.min()) < -150 and float(lse.max()) > 150
    assert 0.4 < float((lse < 0).double().mean()) < 0.6


def test_the_attention_sink_takes_most_of_the_weight_of_every_row():
    case = AttentionCase(batch_size=2, seqlen_q=32, seqlen_k=500, num_heads=4, num_heads_kv=2, head_dim=64, seed=3,
                         qkv_format="thd", seqlens_q=(32, 7), seqlens_k=(500, 40), attention_sink=True)
    inputs = make_inputs(case)
    k, q = inputs.k.double(), inputs.q.double()
    first_keys = [0, 500]
    assert bool((k[first_keys, :, SINK_CHANNEL] > 0).all())
    assert int((k[:, :, SINK_CHANNEL] != 0).sum()) == 2 * case.num_heads_kv
    for b, (start_q, start_k, n_q, n_k) in enumerate([(0, 0, 32, 500), (32, 500, 7, 40)]):
        scores = torch.einsum("qhd,khd->hqk", q[start_q:start_q + n_q],
                              k[start_k:start_k + n_k].repeat_interleave(2, dim=1)) * case.softmax_scale
        weight = scores.softmax(-1)[..., 0]
        assert float(weight.mean()) > 0.9 and float(weight.min()) > 0.5, b


def test_peaked_rows_are_one_hot_on_a_key_they_may_see_under_a_causal_mask():
    case = AttentionCase(batch_size=2, seqlen_q=64, seqlen_k=48, num_heads=4, num_heads_kv=2, head_dim=64, seed=5,
                         dtype="float32", peaked_rows=0.5)
    inputs, normal = make_inputs(case), make_inputs(case.replace(peaked_rows=0.0))
    changed = (inputs.q != normal.q).any(-1)  # [b, sq, h]
    assert 0.4 < float(changed.double().mean()) < 0.6
    probs = _scores(case, inputs).softmax(-1)  # [b, h, sq, sk]
    peak, where = probs.max(-1)
    changed = changed.permute(0, 2, 1)
    assert float(peak[changed].min()) > 0.995
    rows = torch.arange(case.seqlen_q).view(1, 1, -1).expand_as(where)
    assert bool((where[changed] <= rows[changed]).all())  # the key is visible to a causal row


def test_low_rank_q_and_k_have_the_drawn_rank_per_head():
    case = AttentionCase(seqlen_q=100, seqlen_k=90, num_heads=4, num_heads_kv=2, head_dim=32, dtype="float32", seed=6,
                         qk_rank=3)
    inputs = make_inputs(case)
    for h in range(4):
        assert int(torch.linalg.matrix_rank(inputs.q[0, :, h].double(), rtol=1e-4)) == 3
    for h in range(2):
        assert int(torch.linalg.matrix_rank(inputs.k[0, :, h].double(), rtol=1e-4)) == 3
    assert abs(float(inputs.q.double().std()) - 1) < 0.25


def test_massive_channels_amplify_the_same_few_channels_of_q_and_k():
    case = AttentionCase(seqlen_q=20, seqlen_k=30, num_heads=2, head_dim=64, dtype="float32", seed=7, massive_channels=3)
    inputs, normal = make_inputs(case), make_inputs(case.replace(massive_channels=0))
    channels = massive_channel_indices(case)
    assert len(set(channels)) == 3 and channels == massive_channel_indices(case)
    others = [c for c in range(64) if c not in channels]
    assert torch.equal(inputs.q[..., others], normal.q[..., others])
    assert torch.equal(inputs.q[..., channels], normal.q[..., channels] * MASSIVE_Q_GAIN)
    assert torch.equal(inputs.k[..., channels], normal.k[..., channels] * MASSIVE_K_GAIN)


def test_sequence_scales_multiply_q_and_v_of_each_sequence_by_its_power_of_two():
    case = AttentionCase(batch_size=4, seqlen_q=6, seqlen_k=9, num_heads=2, head_dim=8, dtype="float32", seed=2,
                         seq_scale_log2=3)
    assert seq_scale_exponents(case) == [3, 1, -1, -3]
    assert seq_scale_exponents(case.replace(batch_size=1)) == [3]
    inputs, normal = make_inputs(case), make_inputs(case.replace(seq_scale_log2=0))
    for b, e in enumerate(seq_scale_exponents(case)):
        assert torch.equal(inputs.q[b], normal.q[b] * 2.0**e) and torch.equal(inputs.v[b], normal.v[b] * 2.0**e)
    assert torch.equal(inputs.k, normal.k)


def test_dout_families_scale_or_sparsify_the_normal_dout():
    case = AttentionCase(batch_size=2, seqlen_q=128, seqlen_k=8, num_heads=4, head_dim=16, dtype="float32", seed=1)
    normal = make_inputs(case).dout
    assert torch.equal(make_inputs(case.replace(dout_distribution="tiny")).dout, normal * DOUT_TINY)
    assert torch.equal(make_inputs(case.replace(dout_distribution="large")).dout, normal * DOUT_LARGE)
    sparse = make_inputs(case.replace(dout_distribution="sparse")).dout
    kept = (sparse != 0).any(-1)
    assert abs(float(kept.double().mean()) - DOUT_SPARSE_ROWS) < 0.05
    assert torch.equal(sparse[kept], normal[kept])
    other = make_inputs(case.replace(dout_distribution="sparse"))
    assert torch.equal(other.q, make_inputs(case).q)  # dout families leave q, k, v alone


# ------------------------------------------------------------------ the draw
def test_the_draw_shrinks_to_normal_inputs_without_a_family():
    from fuzzer.strategies import input_specs

    simplest = find(input_specs(head_dim=64), lambda spec: True, settings=settings(database=None))
    assert simplest == {"input_distribution": "normal", "dout_distribution": "normal"}
    offset = find(input_specs(head_dim=64), lambda spec: spec.get("score_offset", 0) < -100, settings=settings(database=None))
    assert offset["input_distribution"] == "normal" and offset.get("dout_distribution") == "normal"


@settings(max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_drawn_family_is_a_valid_case_with_finite_inputs(data):
    from fuzzer.strategies import input_specs

    head_dim = data.draw(st.sampled_from([1, 2, 8, 64]))
    spec = data.draw(input_specs(head_dim=head_dim, backward=True))
    case = AttentionCase(batch_size=2, seqlen_q=5, seqlen_k=9, num_heads=2, head_dim=head_dim, dtype="float16", **spec)
    if case.input_families.keys() - {"dout_distribution", "score_offset", "score_offset_mode"}:
        assert case.input_distribution == "normal"  # LLM-like features only on normal inputs
    inputs = make_inputs(case)
    assert all(bool(torch.isfinite(t).all()) for t in (inputs.q, inputs.k, inputs.v, inputs.dout))


def test_the_default_draw_reaches_every_family():
    from fuzzer.strategies import input_specs

    seen: set[str] = set()

    @settings(max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(input_specs(head_dim=64, backward=True))
    def collect(spec):
        seen.update(name if name != "dout_distribution" else f"dout_{spec[name]}" for name in spec)

    collect()
    wanted = {"score_offset", "qk_rank", "massive_channels", "attention_sink", "seq_scale_log2", "peaked_rows",
              "dout_tiny", "dout_large", "dout_sparse"}
    assert wanted <= seen, wanted - seen


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_family_inputs_are_bit_identical_on_cpu_and_cuda(dtype):
    for fields in FAMILY_CASES:
        for fmt in ("bshd", "thd"):
            extra = dict(seqlens_q=(300, 17), seqlens_k=(200, 260)) if fmt == "thd" else {}
            case = AttentionCase(batch_size=2, seqlen_q=300, seqlen_k=260 if fmt == "thd" else 200, num_heads=4,
                                 num_heads_kv=2, head_dim=64, dtype=dtype, qkv_format=fmt, seed=12345, **extra, **fields)
            cpu, cuda = make_inputs(case), make_inputs(case, "cuda").to("cpu")
            for name in ("q", "k", "v", "dout"):
                assert _bits_equal(getattr(cpu, name), getattr(cuda, name)), (fields, fmt, name)


# ------------------------------------------------------------------ error model at the dtype's edge
def test_an_infinity_is_accepted_only_where_the_reference_overflows_the_dtype():
    from oracle.compare import compare_tensor

    reference_values = torch.tensor([[[70000.0, 1.0], [60000.0, -2.0]]], dtype=torch.float64)  # [1, 2 rows, 2]
    overflowing = torch.tensor([[[math.inf, 1.0], [60000.0, -2.0]]]).to(torch.float16)
    assert compare_tensor("dq", overflowing, reference_values, "float16").passed
    wrong_sign = torch.tensor([[[-math.inf, 1.0], [60000.0, -2.0]]]).to(torch.float16)
    assert "dq:neginf" in compare_tensor("dq", wrong_sign, reference_values, "float16").signatures
    spurious = torch.tensor([[[math.inf, 1.0], [math.inf, -2.0]]]).to(torch.float16)
    assert "dq:posinf" in compare_tensor("dq", spurious, reference_values, "float16").signatures
