"""Tests of `oracle.compare`: planted errors fail with the right signature, rounding noise and real
kernels pass. Every tolerance comes from `oracle.compare`; none is written here."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.calibration import emulated_flash_attention, sdpa_attention
from oracle.compare import (
    SEVERITY,
    TOLERANCE_FACTORS,
    CompareInputError,
    compare_outputs,
    compare_tensor,
    rounding_dtype,
)
from oracle.config import AttentionCase, torch_dtype
from oracle.inputs import make_inputs
from oracle.reference import ReferenceResult, reference


def rounded_outputs(case: AttentionCase, expected: ReferenceResult) -> dict[str, torch.Tensor]:
    """What a perfect kernel returns: the exact result rounded to its output dtypes."""
    outputs = {}
    for name in ("out", "lse", "dq", "dk", "dv"):
        value = getattr(expected, name)
        if value is not None:
            outputs[name] = value.to(torch_dtype(rounding_dtype(name, case.dtype)))
    return outputs


@pytest.fixture(scope="module")
def long_case() -> tuple[AttentionCase, ReferenceResult]:
    """16384 query rows: one wrong row must still be found."""
    case = AttentionCase(seqlen_q=16384, seqlen_k=96, num_heads=1, head_dim=32, dtype="bfloat16", backward=False)
    return case, reference(case, make_inputs(case))


@pytest.fixture(scope="module")
def small_case() -> tuple[AttentionCase, ReferenceResult]:
    case = AttentionCase(batch_size=2, seqlen_q=150, seqlen_k=100, num_heads=4, num_heads_kv=2, head_dim=32,
                         dtype="bfloat16", causal=True, causal_alignment="bottom_right")
    return case, reference(case, make_inputs(case))


def test_one_wrong_row_among_16k_rows_fails_as_a_tile_mismatch(long_case):
    case, expected = long_case
    outputs = rounded_outputs(case, expected)
    outputs["out"][0, 10000] = outputs["out"][0, 10001]  # an off-by-one row
    verdict = compare_outputs(case, expected, **outputs)
    assert not verdict.passed
    assert verdict.signatures == ("out:tile_mismatch",)
    assert verdict.tensors["out"].worst_index[1] == 10000
    assert verdict.tensors["out"].worst_tile_ratio == verdict.error_ratio > 1


def test_a_zeroed_tile_fails_as_a_mismatch_and_points_into_the_tile(long_case):
    # 64 zero rows among 16384 are a global error of 1/16 of the norm: far beyond any bf16 tolerance,
    # so the global check fires (tile_mismatch is for errors too local to move the global norm).
    case, expected = long_case
    outputs = rounded_outputs(case, expected)
    outputs["out"][0, 64 * 70 : 64 * 71] = 0
    verdict = compare_outputs(case, expected, **outputs)
    assert verdict.signatures == ("out:mismatch",)
    assert 64 * 70 <= verdict.tensors["out"].worst_index[1] < 64 * 71
    assert verdict.tensors["out"].worst_tile_ratio == verdict.error_ratio > 1


def test_an_lse_in_log2_instead_of_natural_log_fails(small_case):
    case, expected = small_case
    outputs = rounded_outputs(case, expected)
    outputs["lse"] = (expected.lse / math.log(2)).float()
    verdict = compare_outputs(case, expected, **outputs)
    assert verdict.signatures == ("lse:mismatch",)


def test_a_nan_fails_first_and_is_located(small_case):
    case, expected = small_case
    outputs = rounded_outputs(case, expected)
    outputs["out"][1, 7, 2, 5] = math.nan
    verdict = compare_outputs(case, expected, **outputs)
    assert verdict.primary_signature == "out:nan"
    assert verdict.tensors["out"].worst_index == (1, 7, 2, 5)
    assert verdict.tensors["out"].nan_count == 1
    assert verdict.error_ratio == math.inf


def test_the_seed_bug_all_zero_output_with_minus_inf_lse_fails_as_all_zero(small_case):
    case, expected = small_case
    outputs = rounded_outputs(case, expected)
    outputs["out"] = torch.zeros_like(outputs["out"])
    outputs["lse"] = torch.full_like(outputs["lse"], -math.inf)
    verdict = compare_outputs(case, expected, out=outputs["out"], lse=outputs["lse"])
    assert verdict.primary_signature == "out:all_zero"
    assert verdict.signatures == ("out:all_zero", "out:mismatch", "lse:neginf")
    assert verdict.tensors["out"].is_all_zero
    assert verdict.tensors["lse"].neginf_count == int(torch.isfinite(expected.lse).sum())


@pytest.mark.parametrize("masked_value", [-math.inf, math.inf])
def test_infinite_lse_on_rows_without_keys_is_accepted(small_case, masked_value):
    case, expected = small_case
    outputs = rounded_outputs(case, expected)
    empty = torch.isinf(expected.lse)
    assert bool(empty.any())
    outputs["lse"][empty] = masked_value
    assert compare_outputs(case, expected, **outputs).passed


@pytest.mark.parametrize("masked_value, signature", [(0.0, "lse:finite_on_masked"), (math.nan, "lse:nan")])
def test_finite_or_nan_lse_on_rows_without_keys_fails(small_case, masked_value, signature):
    case, expected = small_case
    outputs = rounded_outputs(case, expected)
    outputs["lse"][torch.isinf(expected.lse)] = masked_value
    verdict = compare_outputs(case, expected, **outputs)
    assert verdict.signatures == (signature,)


def test_nonzero_output_on_rows_without_keys_fails(small_case):
    case, expected = small_case
    outputs = rounded_outputs(case, expected)
    outputs["out"][0, 0] = outputs["out"][0, -1]  # row 0 sees no key (bottom-right, 150 > 100)
    verdict = compare_outputs(case, expected, **outputs)
    assert not verdict.passed and verdict.tensors["out"].worst_index[1] == 0


def test_infinite_gradients_fail_with_their_sign(small_case):
    case, expected = small_case
    outputs = rounded_outputs(case, expected)
    outputs["dq"][0, 140, 1, 0] = math.inf
    outputs["dk"][1, 3, 0, 0] = -math.inf
    verdict = compare_outputs(case, expected, **outputs)
    assert verdict.signatures == ("dq:posinf", "dk:neginf")


def test_a_wrong_shape_fails_before_any_other_check(small_case):
    case, expected = small_case
    outputs = rounded_outputs(case, expected)
    outputs["out"] = outputs["out"].transpose(1, 2)
    verdict = compare_outputs(case, expected, **outputs)
    assert verdict.signatures == ("out:shape",)
    assert verdict.tensors["out"].error_ratio == math.inf


def test_signatures_follow_tensor_order_then_severity(small_case):
    case, expected = small_case
    outputs = rounded_outputs(case, expected)
    outputs["dv"] = outputs["dv"] * 2
    outputs["dv"][0, 0, 0, 0] = math.nan
    outputs["lse"] = outputs["lse"] + 1
    verdict = compare_outputs(case, expected, **outputs)
    assert verdict.signatures == ("lse:mismatch", "dv:nan", "dv:mismatch")
    assert verdict.primary_signature == "lse:mismatch"
    kinds = [sig.split(":")[1] for sig in verdict.tensors["dv"].signatures]
    assert kinds == sorted(kinds, key=SEVERITY.index)


def test_verdicts_serialise_to_strict_json(small_case):
    case, expected = small_case
    outputs = rounded_outputs(case, expected)
    outputs["out"][0, 3, 0, 0] = math.nan
    verdict = compare_outputs(case, expected, **outputs)
    text = json.dumps(verdict.to_json(), allow_nan=False)
    data = json.loads(text)
    assert data["primary_signature"] == "out:nan"
    assert data["error_ratio"] == "inf"
    assert data["tensors"]["out"]["worst_index"] == [0, 3, 0, 0]
    assert set(data["tensors"]) == {"out", "lse", "dq", "dk", "dv"}


def test_a_failing_tensor_records_its_worst_element_and_the_scales_a_passing_one_records_nothing(small_case):
    """A failing verdict stores what the worst element should be and is, the tensor's largest
    magnitude and norm and the largest magnitude of the worst element's tile (`WORST_FIGURES`: the
    service words the verdict from them); a passing verdict's JSON holds none of them, and the
    one-by-one and batched judges give the same figures."""
    from oracle.compare import WORST_FIGURES, PreparedReference, judge_tensors

    case, expected = small_case
    outputs = rounded_outputs(case, expected)
    outputs["dq"][1, 70, 3, 5] = math.inf
    outputs["dv"][0, 10:20] = 0  # a few rows zeroed: a wrong tile
    verdict = compare_outputs(case, expected, **outputs)
    dq, dv, out = verdict.tensors["dq"], verdict.tensors["dv"], verdict.tensors["out"]
    assert dq.signatures == ("dq:posinf",) and dq.worst_index == (1, 70, 3, 5)
    assert dq.worst_actual == math.inf and dq.worst_expected == float(expected.dq[1, 70, 3, 5])
    assert dq.ref_max_abs == float(expected.dq.abs().max()) and dq.ref_norm == pytest.approx(float(expected.dq.norm()))
    tile = expected.dq[1, 64:128, 3]  # the tile (64 rows of batch 1, head 3) holding the worst element
    assert dq.worst_tile_ref_max_abs == float(tile.abs().max())
    assert not dv.passed and dv.worst_actual == 0.0 and dv.worst_index[1] in range(10, 20), dv
    assert dv.worst_expected == float(expected.dv[dv.worst_index])
    data = json.loads(json.dumps(verdict.to_json(), allow_nan=False))["tensors"]
    assert data["dq"]["worst_actual"] == "inf" and data["dq"]["worst_expected"] == dq.worst_expected
    assert out.passed and all(getattr(out, k) is None for k in WORST_FIGURES)
    assert not set(WORST_FIGURES) & set(data["out"]), data["out"]
    # an entry whose float64 value rounds to an infinity is no judged entry, and still the tensor's scale
    from oracle.compare import compare_tensor

    big = expected.dq * (1e5 / float(expected.dq.abs().max()))
    kernel = big.to(torch.float16)
    kernel[0, 1, 0, 0] = math.nan
    over = compare_tensor("dq", kernel, big, "float16")
    assert not over.passed and over.ref_max_abs == pytest.approx(1e5), over
    prepared = PreparedReference(case, expected).tensor("dq")
    alone, batched = judge_tensors(prepared, [outputs["dq"]], batched=False)[0], judge_tensors(prepared, [outputs["dq"]], batched=True)[0]
    assert [getattr(alone, k) for k in WORST_FIGURES] == [getattr(batched, k) for k in WORST_FIGURES]


def test_gradients_without_a_reference_gradient_are_rejected(small_case):
    case, expected = small_case
    forward_only = ReferenceResult(out=expected.out, lse=expected.lse)
    with pytest.raises(CompareInputError):
        compare_outputs(case, forward_only, out=expected.out, dq=expected.dq)


@st.composite
def cases(draw) -> AttentionCase:
    head_dim = draw(st.sampled_from((8, 32, 64)))
    return AttentionCase(
        batch_size=draw(st.integers(1, 2)),
        seqlen_q=draw(st.sampled_from((1, 17, 64, 65, 130))),
        seqlen_k=draw(st.sampled_from((1, 17, 64, 65, 130))),
        num_heads=2,
        num_heads_kv=draw(st.sampled_from((1, 2))),
        head_dim=head_dim,
        head_dim_v=draw(st.sampled_from((head_dim, 16))),
        dtype=draw(st.sampled_from(("bfloat16", "float16", "float32"))),
        causal=draw(st.booleans()),
        causal_alignment=draw(st.sampled_from(("top_left", "bottom_right"))),
        window_size_left=draw(st.one_of(st.none(), st.integers(0, 40))),
        softcap=draw(st.one_of(st.none(), st.just(10.0))),
        input_distribution=draw(st.sampled_from(("normal", "large_logits", "outliers", "near_constant"))),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


@settings(max_examples=30, deadline=None)
@given(cases())
def test_the_exact_result_rounded_to_the_kernel_dtype_passes(case):
    expected = reference(case, make_inputs(case), backward=True)
    verdict = compare_outputs(case, expected, **rounded_outputs(case, expected))
    assert verdict.passed, verdict.signatures
    for name, tensor_verdict in verdict.tensors.items():
        assert tensor_verdict.error_ratio <= 1 / TOLERANCE_FACTORS[case.dtype][name] * 1.001, name


@settings(max_examples=25, deadline=None)
@given(cases())
def test_flash_attention_rounding_emulated_in_torch_passes(case):
    inputs = make_inputs(case)
    expected = reference(case, inputs, backward=True)
    verdict = compare_outputs(case, expected, **emulated_flash_attention(case, inputs))
    assert verdict.passed, (verdict.signatures, verdict.error_ratio)


@pytest.mark.parametrize("backend", ["math", "flash"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("distribution", ["normal", "large_logits", "outliers", "near_constant"])
def test_pytorch_sdpa_kernels_pass(backend, dtype, distribution):
    case = AttentionCase(batch_size=1, seqlen_q=257, seqlen_k=255, num_heads=4, num_heads_kv=2, head_dim=64,
                         dtype=dtype, causal=True, input_distribution=distribution, seed=7)
    inputs = make_inputs(case)
    expected = reference(case, inputs, backward=True)
    outputs = sdpa_attention(case, inputs, backend=backend)
    verdict = compare_outputs(case, expected, **outputs)
    assert verdict.passed, (verdict.signatures, {n: v.error_ratio for n, v in verdict.tensors.items()})


def test_a_kernel_with_a_one_percent_wrong_softmax_scale_fails_through_its_lse():
    case = AttentionCase(seqlen_q=256, seqlen_k=256, num_heads=2, head_dim=64, dtype="bfloat16", causal=True)
    inputs = make_inputs(case)
    expected = reference(case, inputs)
    wrong = emulated_flash_attention(case.replace(softmax_scale=case.softmax_scale * 1.01), inputs)
    verdict = compare_outputs(case, expected, **wrong)
    assert "lse:mismatch" in verdict.signatures


def test_worst_index_is_reported_in_the_tensors_own_layout():
    torch.manual_seed(0)
    exact = torch.randn(300, 2, 3, 16, dtype=torch.float64)  # rows first, as in thd or sbhd
    actual = exact.to(torch.bfloat16)
    actual[237, 1, 2, 5] += 1.0
    verdict = compare_tensor("dq", actual, exact, "bfloat16", row_dim=0)
    assert not verdict.passed
    assert verdict.worst_index == (237, 1, 2, 5)


def test_thd_outputs_are_judged_per_packed_row():
    case = AttentionCase(batch_size=3, seqlen_q=70, seqlen_k=80, qkv_format="thd", seqlens_q=(70, 5, 33),
                         seqlens_k=(80, 9, 20), num_heads=2, head_dim=16, dtype="float16", causal=True,
                         causal_alignment="bottom_right")
    expected = reference(case, make_inputs(case))
    outputs = rounded_outputs(case, expected)
    assert compare_outputs(case, expected, **outputs).passed
    outputs["lse"][1, 95] += 1  # second head, third sequence, local row 20 (rows 0-12 see no key)
    outputs["dk"][85, 0, 3] = math.nan
    verdict = compare_outputs(case, expected, **outputs)
    assert verdict.signatures == ("lse:mismatch", "dk:nan")
    assert verdict.tensors["lse"].worst_index == (1, 95)
    assert verdict.tensors["dk"].worst_index == (85, 0, 3)


def test_an_entry_that_overflows_the_dtype_does_not_switch_off_the_check_of_the_rest():
    """One reference entry beyond float16's range (its correctly rounded value is +inf) is left out,
    and the other entries are still judged: a wrong finite entry elsewhere fails, the correct
    result (inf there, the rounded values elsewhere) passes. Found by a new-user trial: the overflowed
    entry made the whole tensor's allowance infinite (dk of fp16 cases with a large dout)."""
    torch.manual_seed(0)
    exact = torch.randn(64, 16, dtype=torch.float64) * 100.0
    exact[3, 5] = 333_175.0  # beyond float16's largest finite value, 65504
    correct = exact.to(torch.float16)
    assert torch.isinf(correct[3, 5])
    verdict = compare_tensor("dk", correct, exact, "float16", row_dim=0)
    assert verdict.passed, verdict
    assert math.isfinite(verdict.err_baseline) and verdict.err_baseline < 1e3, verdict
    wrong = correct.clone()
    wrong[40, 2] = wrong[40, 2] + 50.0  # a finite entry far off
    verdict = compare_tensor("dk", wrong, exact, "float16", row_dim=0)
    assert not verdict.passed and verdict.error_ratio > 10, verdict


def test_an_infinity_within_the_tiles_allowed_error_of_the_overflow_threshold_passes_and_one_far_from_it_fails():
    """float16 rounds past 65504 to inf. A float64 entry just below the threshold, closer to it than
    its tile's allowed error, may come out infinite from a kernel within the tolerance (a large dout
    on the H200: dk of about 6e4 infinite in every float16 backend); an infinity where the value is
    far below the threshold is still a ``posinf`` (the planted bug)."""
    torch.manual_seed(0)
    exact = torch.randn(64, 16, dtype=torch.float64) * 4000.0
    exact[3, 5] = 65_460.0  # finite in float16, 44 below the largest value (its tile allows about 2e2)
    rounded = exact.to(torch.float16)
    assert torch.isfinite(rounded[3, 5])
    edge = rounded.clone()
    edge[3, 5] = math.inf
    verdict = compare_tensor("dk", edge, exact, "float16", row_dim=0)
    assert verdict.passed, verdict
    assert compare_tensor("dk", rounded, exact, "float16", row_dim=0).passed  # finite there is judged and right
    wrong_sign = rounded.clone()
    wrong_sign[3, 5] = -math.inf
    assert compare_tensor("dk", wrong_sign, exact, "float16", row_dim=0).signatures[0] == "dk:neginf"
    planted = rounded.clone()
    planted[10, 1] = math.inf  # |value| about 4e3: far from the threshold
    verdict = compare_tensor("dk", planted, exact, "float16", row_dim=0)
    assert not verdict.passed and verdict.signatures[0] == "dk:posinf", verdict
    assert verdict.posinf_count == 1


def _slow_path(prepared):
    """``prepared`` with the judging shortcuts of `prepare_tensor` switched off (the general path)."""
    import dataclasses

    return dataclasses.replace(prepared, masked_count=None, all_judged=False, tiles_positive=False)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_the_judging_shortcuts_give_the_verdict_of_the_general_path(dtype: str) -> None:
    """`judge_tensor`'s shortcuts (every entry judged, positive tile allowances, the masked count
    kept, the finite test by a sum, one cast-and-permute copy) change no figure: the verdicts equal
    those of the general path, field for field, on outputs that pass, fail, are all zero or hold
    NaN, infinities or values whose sum overflows, in every layout and for a masked lse."""
    from oracle.compare import judge_tensor, prepare_tensor

    gen = torch.Generator().manual_seed(5)
    checked = 0
    for name, shape, row_dim in [("out", (2, 70, 3, 16), 1), ("dq", (1, 5, 1, 8), 1), ("dk", (150, 2, 8), 0),
                                 ("lse", (2, 3, 70), 2)]:
        ref = torch.randn(shape, generator=gen, dtype=torch.float64)
        visible = None
        if name == "lse":
            visible = torch.rand(shape, generator=gen) > 0.2
            ref = torch.where(visible, ref, -math.inf)
        for tile_rows in (16, 64):
            fast = prepare_tensor(name, ref, dtype, tile_rows=tile_rows, row_dim=row_dim, visible_rows=visible)
            slow = _slow_path(fast)
            rounded = ref.to(torch.float32 if name == "lse" else torch_dtype(dtype))
            noisy = (ref + 1e-2 * torch.randn(shape, generator=gen, dtype=torch.float64)).to(rounded.dtype)
            holes = rounded.clone()
            holes.view(-1)[3] = math.nan
            holes.view(-1)[-1] = math.inf
            huge = torch.full(shape, 1e308, dtype=torch.float64)
            for actual in (rounded, noisy, torch.zeros_like(rounded), holes, huge, rounded.double(),
                           rounded.double().transpose(0, -1).contiguous().transpose(0, -1)):
                _same_verdict(judge_tensor(fast, actual), judge_tensor(slow, actual))
                checked += 1
    assert checked == 4 * 2 * 7


def test_a_prepared_reference_prepares_every_tensor_at_once_and_defers_a_failure() -> None:
    """`PreparedReference` prepares each tensor of the reference when built (the evaluator builds
    it while the kernels run); a tensor whose preparation fails raises where it is judged, as
    before."""
    from oracle.compare import CompareInputError, PreparedReference

    case = AttentionCase(batch_size=1, seqlen_q=8, seqlen_k=8, num_heads=1, head_dim=8, dtype="bfloat16", backward=True)
    ref = reference(case, make_inputs(case), backward=True)
    prepared = PreparedReference(case, ref)
    assert set(prepared._prepared) == {"out", "lse", "dq", "dk", "dv"}
    forward_only = reference(case, make_inputs(case), backward=False)
    lazy = PreparedReference(case, forward_only, eager=False)
    assert lazy._prepared == {}
    bad = AttentionCase(batch_size=1, seqlen_q=8, seqlen_k=8, num_heads=1, head_dim=8, dtype="bfloat16")
    broken = PreparedReference(bad, ReferenceResult(out=forward_only.out, lse=forward_only.lse, error_scales={"out": "not a tensor"}))
    assert "out" not in broken._prepared and "lse" in broken._prepared
    with pytest.raises(AttributeError):
        compare_outputs(bad, broken, out=forward_only.out.to(torch.bfloat16))
    with pytest.raises(CompareInputError):
        compare_outputs(case, PreparedReference(case, forward_only), out=forward_only.out, dq=forward_only.out)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_subnormal_flushed_to_zero_in_a_tile_of_tiny_values_is_no_tile_mismatch(dtype):
    """Kernels accumulate in float32 and may flush subnormals to zero: a tile whose float64
    reference is ~1e-38 (keys a peaked row never attends) and whose kernel values are 0 there is
    within `FLUSH_TO_ZERO_FLOOR` per entry (PyTorch's CPU flash dv, relative L2 1.9e-11, was a
    ``dv:tile_mismatch`` at 4.5x). The same zeros where the reference is 1e-30 still fail."""
    import torch

    from oracle.compare import compare_tensor

    FLUSH_TO_ZERO_FLOOR = torch.finfo(torch.float32).tiny  # oracle.compare.FLUSH_TO_ZERO_FLOOR
    torch.manual_seed(0)
    reference = torch.randn(1, 128, 2, 16, dtype=torch.float64)
    reference[:, 64:] *= 0.5 * FLUSH_TO_ZERO_FLOOR  # the second tile of rows: float32 subnormals
    actual = reference.to(getattr(torch, dtype)).clone()
    actual[:, 64:] = 0  # flushed
    verdict = compare_tensor("dv", actual, reference, dtype)
    assert verdict.passed, verdict
    tiny_but_normal = reference.clone()
    tiny_but_normal[:, 64:] = reference[:, 64:] / (0.5 * FLUSH_TO_ZERO_FLOOR) * 1e-30
    wrong = tiny_but_normal.to(getattr(torch, dtype)).clone()
    wrong[:, 64:] = 0
    verdict = compare_tensor("dv", wrong, tiny_but_normal, dtype)
    assert not verdict.passed and "dv:tile_mismatch" in verdict.signatures, verdict


def _same_verdict(a, b) -> None:
    from dataclasses import fields

    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y), f.name
        elif isinstance(x, float) and math.isnan(x):
            assert math.isnan(y), f.name
        else:
            assert x == y, (f.name, x, y)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_judging_a_batch_gives_each_tensor_the_verdict_of_judging_it_alone(dtype: str) -> None:
    """`judge_tensors` (the evaluator judges a case's outputs together) gives every tensor the
    verdict `judge_tensor` gives it alone, field for field, in a batch mixing right, noisy, planted
    (one wrong row), all-zero, NaN, infinite and wrong-shaped tensors; the planted one fails and its
    right neighbours pass, so no figure leaks between the entries of a batch."""
    from oracle.compare import judge_tensor, judge_tensors, prepare_tensor
    from oracle.judge_batch import JUDGE_BATCH_ELEMENTS

    gen = torch.Generator().manual_seed(11)
    for name, shape, row_dim in [("out", (2, 70, 3, 16), 1), ("dk", (150, 2, 8), 0), ("lse", (2, 3, 70), 2)]:
        ref = torch.randn(shape, generator=gen, dtype=torch.float64)
        visible = None
        if name == "lse":
            visible = torch.rand(shape, generator=gen) > 0.2
            ref = torch.where(visible, ref, -math.inf)
        prepared = prepare_tensor(name, ref, dtype, tile_rows=16, row_dim=row_dim, visible_rows=visible)
        rounded = ref.to(torch.float32 if name == "lse" else torch_dtype(dtype))
        planted = rounded.clone()
        planted.select(row_dim, 5).copy_(planted.select(row_dim, 6))  # an off-by-one row
        holes = rounded.clone()
        holes.view(-1)[7] = math.nan
        batch = [rounded, (ref * (1 + 1e-3 * torch.randn(shape, generator=gen, dtype=torch.float64))).to(rounded.dtype),
                 planted, rounded.double(), torch.zeros_like(rounded), holes, rounded.flatten()[:-1], rounded]
        together = judge_tensors(prepared, batch, batched=True)
        for actual, verdict, alone in zip(batch, together, judge_tensors(prepared, batch)):  # the CPU's default: one by one
            _same_verdict(verdict, judge_tensor(prepared, actual))
            _same_verdict(alone, verdict)
        assert together[0].passed and together[3].passed and together[7].passed
        assert not together[2].passed and together[2].worst_index[row_dim] in (5, 6)
        assert together[5].signatures[0] == f"{name}:nan" and together[6].signatures == (f"{name}:shape",)
    # a batch larger than one buffer is judged in parts, with the same verdicts
    import oracle.judge_batch as judge_batch

    small = max(1, math.prod(prepared.shape) * 2)
    try:
        judge_batch.JUDGE_BATCH_ELEMENTS = small
        parts = judge_tensors(prepared, batch, batched=True)
    finally:
        judge_batch.JUDGE_BATCH_ELEMENTS = JUDGE_BATCH_ELEMENTS
    for a, b in zip(parts, together):
        _same_verdict(a, b)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_the_host_fast_paths_give_every_figure_of_torch_alone(dtype: str, monkeypatch) -> None:
    """The numpy fast paths on the host (`oracle.tolerance.HOST_FAST_PATHS`: the finite tests, the
    any/all tests, the argmax) change no bit: the prepared tensors and the verdicts equal those
    made with torch alone, field for field, on outputs that pass, fail in one tile, are all zero,
    hold NaN or infinities, overflow the dtype, and for a masked lse and a reference that itself
    overflows float16. A fast path answering wrong (an ``any`` that is always False) fails it."""
    import dataclasses

    import oracle.tolerance as tolerance
    import oracle.verdict as verdict_module
    from oracle.compare import judge_tensor, prepare_tensor

    gen = torch.Generator().manual_seed(23)
    cases = [("out", (2, 70, 3, 16), 1, 1.0), ("dk", (150, 2, 8), 0, 1.0), ("lse", (2, 3, 70), 2, 1.0),
             ("dv", (1, 40, 2, 8), 1, 7e4)]  # the last: a reference beyond float16's largest value
    checked = 0
    for name, shape, row_dim, scale in cases:
        ref = scale * torch.randn(shape, generator=gen, dtype=torch.float64)
        visible = None
        if name == "lse":
            visible = torch.rand(shape, generator=gen) > 0.2
            ref = torch.where(visible, ref, -math.inf)
        kinds = {}
        for fast in (True, False):
            monkeypatch.setattr(tolerance, "HOST_FAST_PATHS", fast)
            kinds[fast] = prepare_tensor(name, ref, dtype, tile_rows=16, row_dim=row_dim, visible_rows=visible)
        for f in dataclasses.fields(kinds[True]):
            x, y = getattr(kinds[True], f.name), getattr(kinds[False], f.name)
            assert (torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y or x != x and y != y), f.name
        rounded = ref.to(torch.float32 if name == "lse" else torch_dtype(dtype))
        planted = rounded.clone()
        planted.select(row_dim, 5).mul_(1.5)
        holes = rounded.clone()
        holes.view(-1)[7] = math.nan
        holes.view(-1)[-2] = -math.inf
        for actual in (rounded, planted, torch.zeros_like(rounded), holes, rounded.double() * 1e300, rounded.double()):
            verdicts = {}
            for fast in (True, False):
                monkeypatch.setattr(tolerance, "HOST_FAST_PATHS", fast)
                verdicts[fast] = judge_tensor(kinds[False], actual)
            _same_verdict(verdicts[True], verdicts[False])
            checked += 1
        monkeypatch.setattr(tolerance, "HOST_FAST_PATHS", True)
        assert not judge_tensor(kinds[True], planted).passed
        assert judge_tensor(kinds[True], torch.zeros_like(rounded)).is_all_zero
        if name == "out":  # every entry judged: the all-zero test is the fast `any`
            # twice the reference: its error norm is the reference's own (2R - R = R exactly), as
            # an all-zero output's is, so the entries themselves are tested
            first = kinds[True], 2 * ref
            assert not judge_tensor(*first).is_all_zero
    assert checked == 4 * 6
    # the planted fast path: an `any` that never sees a non-zero entry calls every output all zero
    # whose error norm does not rule it out
    monkeypatch.setattr(verdict_module, "_any", lambda mask: False)
    assert judge_tensor(*first).is_all_zero


@pytest.mark.parametrize("batched", [False, True])
def test_a_tensor_bit_identical_to_an_earlier_one_takes_its_verdict_and_one_bit_apart_does_not(batched: bool) -> None:
    """`judge_tensors` judges a tensor holding the same bits as an earlier one of its list once
    (the variants of a backend often compute the same values): the copy gets that verdict, equal
    to judging it alone; tensors one ulp, one signed zero, one NaN payload or one dtype apart are
    judged on their own, and a planted wrong row among copies still fails."""
    import oracle.judge_batch as compare  # where judge_tensors finds judge_tensor
    from oracle.compare import judge_tensor, judge_tensors, prepare_tensor

    gen = torch.Generator().manual_seed(21)
    ref = torch.randn(2, 40, 3, 8, generator=gen, dtype=torch.float64)
    ref[0, 0, 0, 0] = 0.0
    prepared = prepare_tensor("out", ref, "bfloat16", tile_rows=16, row_dim=1)
    right = ref.to(torch.bfloat16)
    ulp = right.clone()
    ulp.view(torch.int16)[1, 3, 2, 5] += 1  # one unit in the last place
    negzero = right.clone()
    negzero[0, 0, 0, 0] = -0.0
    planted = right.clone()
    planted[:, 5] = planted[:, 6]
    nan_a, nan_b = right.clone(), right.clone()
    nan_a.view(-1)[3] = math.nan
    nan_b.view(torch.int16).view(-1)[3] = nan_a.view(torch.int16).view(-1)[3] ^ 1  # another NaN payload
    assert math.isnan(float(nan_b.view(-1)[3]))
    batch = [right, right.clone(), ulp, negzero, planted, planted.clone(), right.to(torch.float16), nan_a, nan_a.clone(),
             nan_b, right.clone()]
    calls = []
    real = compare.judge_tensor
    try:
        compare.judge_tensor = lambda p, a: calls.append(a) or real(p, a)
        verdicts = judge_tensors(prepared, batch, batched=batched)
    finally:
        compare.judge_tensor = real
    for actual, verdict in zip(batch, verdicts):
        _same_verdict(verdict, judge_tensor(prepared, actual))
    assert verdicts[1] is verdicts[0] and verdicts[10] is verdicts[0]
    assert verdicts[5] is verdicts[4] and not verdicts[4].passed
    assert verdicts[8] is verdicts[7] and verdicts[7].signatures[0] == "out:nan"
    for apart in (2, 3, 6, 9):  # judged on their own
        assert verdicts[apart] is not verdicts[0] and verdicts[apart] is not verdicts[7]
    if not batched:
        assert len(calls) == 7  # 11 tensors, 4 copies


def test_the_batch_judges_a_reference_stored_in_another_order_with_unjudged_entries() -> None:
    """A reference whose storage is not in the judging order (sbhd: ``[b, s, h, d]`` viewed over
    ``[s, b, h, d]``) with entries it leaves unjudged: the batch engine gives the one-tensor
    verdicts (on the H200 it raised there: a mask in the reference's order made a later
    ``view`` impossible; 4 ``attnfuzz_error`` results of the H200 campaign of 2026-12-02 at 1ef6565,
    fixed in 418316d: docs/gpu-campaigns.md "Findings")."""
    from oracle.compare import judge_tensor, judge_tensors, prepare_tensor

    gen = torch.Generator().manual_seed(3)
    ref = torch.randn(5, 2, 3, 8, generator=gen, dtype=torch.float64).transpose(0, 1)
    ref[0, 1] = -math.inf  # one row unjudged
    prepared = prepare_tensor("out", ref, "bfloat16", tile_rows=2, row_dim=1)
    assert not prepared.all_judged and not prepared.ref_finite.is_contiguous()
    finite = torch.where(torch.isfinite(ref), ref, 0.0)
    wrong = finite.clone()
    wrong[1, 2] += 1.0
    actuals = [finite.to(torch.bfloat16), wrong.to(torch.bfloat16), finite.to(torch.bfloat16).transpose(0, 1).contiguous().transpose(0, 1)]
    for actual, verdict in zip(actuals, judge_tensors(prepared, actuals, batched=True)):
        _same_verdict(verdict, judge_tensor(prepared, actual))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_host_outputs_staged_in_one_transfer_get_the_verdicts_of_outputs_on_the_device() -> None:
    """Small outputs that came back as bytes (on the host) are moved to the GPU in one pinned
    transfer per dtype (`oracle.judge_batch._stage_host_tensors`): every verdict equals the one of the
    same tensors on the device, for a run of rows, a dtype group with a gap, one tensor above
    `STAGE_MAX_BYTES`, a lone dtype and a wrong shape."""
    import oracle.judge_batch as compare
    from oracle.compare import judge_tensors, prepare_tensor

    gen = torch.Generator().manual_seed(5)
    ref = torch.randn(2, 70, 3, 16, generator=gen, dtype=torch.float64)
    prepared = prepare_tensor("out", ref.cuda(), "bfloat16", tile_rows=16, row_dim=1)
    planted = ref.clone()
    planted[:, 5] = planted[:, 6]
    host = [ref.to(torch.bfloat16), planted.to(torch.bfloat16), ref.to(torch.float32), ref.to(torch.bfloat16),
            (ref * 1.01).to(torch.float32), ref.to(torch.float16), ref.to(torch.bfloat16).flatten()[:-1],
            torch.zeros_like(ref, dtype=torch.bfloat16)]
    from oracle import judge_batch

    groups = judge_batch._stage_host_tensors(prepared, host)
    assert sorted(rows for rows, _ in groups) == [[0, 1, 3, 7], [2, 4]]  # float16 alone, the wrong shape is no group
    on_device = judge_tensors(prepared, [x.cuda() for x in host], batched=True)
    from_host = judge_tensors(prepared, host, batched=True)
    for a, b in zip(from_host, on_device):
        _same_verdict(a, b)
    assert from_host[0].passed and not from_host[1].passed and from_host[6].signatures == ("out:shape",)
    saved = judge_batch.STAGE_MAX_BYTES
    try:
        judge_batch.STAGE_MAX_BYTES = 1  # nothing staged: each tensor moved on its own, the same verdicts
        assert judge_batch._stage_host_tensors(prepared, host) == []
        for a, b in zip(judge_tensors(prepared, host, batched=True), on_device):
            _same_verdict(a, b)
    finally:
        judge_batch.STAGE_MAX_BYTES = saved


@pytest.mark.parametrize("threads", [1, 2])
def test_an_all_zero_output_is_told_however_its_error_norm_is_summed(threads: int) -> None:
    """`judge_tensor` rules an all-zero output out by its error norm alone when that norm is not
    the reference's (`oracle.verdict._norm_allows_all_zero`), so an all-zero output must keep
    passing that test: on a large tensor summed by several threads, with unjudged rows and with
    a reference that overflows the dtype, every all-zero output is ``all_zero``, and the same
    output with one entry set is not. A test that compared the norms bit for bit, or one that
    always ruled out, fails here."""
    from oracle.compare import judge_tensor, prepare_tensor

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(41)
        for name, shape, scale, masked in (("out", (2, 4096, 4, 64), 1.0, False), ("dv", (1, 300, 2, 16), 7e4, False),
                                           ("lse", (2, 3, 500), 30.0, True)):
            ref = scale * torch.randn(shape, generator=gen, dtype=torch.float64)
            row_dim = 2 if name == "lse" else 1
            visible = None
            if masked:
                visible = torch.rand(shape, generator=gen) > 0.3
                ref = torch.where(visible, ref, -math.inf)
            prepared = prepare_tensor(name, ref, "float16", row_dim=row_dim, visible_rows=visible)
            zeros = torch.zeros(shape, dtype=torch.float32 if name == "lse" else torch.float16)
            if masked:
                zeros = torch.where(visible, zeros, -math.inf)
            verdict = judge_tensor(prepared, zeros)
            assert verdict.is_all_zero and "all_zero" in "".join(verdict.signatures), name
            one = zeros.clone()
            one.view(-1)[int(torch.nonzero(torch.isfinite(ref).view(-1))[-1])] = 1.0
            assert not judge_tensor(prepared, one).is_all_zero, name
    finally:
        torch.set_num_threads(previous)
