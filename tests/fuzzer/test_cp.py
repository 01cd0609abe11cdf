"""fuzzer/backends/cp_layout.py, fuzzer/cp/sharding.py and fuzzer/cp/judge.py on one process: the
dual-chunk-swap layout, its exact inverse, the thd padding, the errors, and the CP-vs-non-CP agreement
(acceptance 3 without processes: equal but wrong fails)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fuzzer.backends.base import BackendOutput
from fuzzer.backends.cp_cpu import PlantedWindowCPUBackend, RingAttentionCPUBackend
from fuzzer.backends.cp_layout import (
    CPShardError,
    chunk_ids,
    cp_seqlens,
    cp_twin,
    cp_unsupported_reasons,
    hierarchical_ranks,
    shard_indices,
    shard_layout,
)
from fuzzer.cp.executor import CPTaskOutcome
from fuzzer.cp.judge import AGREEMENT_RATIO, CP_METRICS_KEY, cp_agreement, judge_cp
from fuzzer.cp.sharding import gather, gather_outputs, shard, shard_inputs
from fuzzer.executor import TaskOutcome
from fuzzer.sinks import MemorySink
from fuzzer.worker import Worker, WorkerConfig
from oracle.config import AttentionCase
from oracle.inputs import make_inputs
from oracle.reference import reference

Q_NAMES = ("q", "dout", "out", "dq")
K_NAMES = ("k", "v", "dk", "dv")


def full_tensor(case: AttentionCase, name: str) -> torch.Tensor:
    """A tensor of ``name``'s canonical shape whose every entry is distinct."""
    heads = case.num_heads if name in Q_NAMES + ("lse",) else case.num_heads_kv
    if name == "lse":
        shape = (heads, case.total_q) if case.is_varlen else (case.batch_size, heads, case.seqlen_q)
    else:
        length = (case.total_q if name in Q_NAMES else case.total_k) if case.is_varlen else None
        seq = case.seqlen_q if name in Q_NAMES else case.seqlen_k
        rows = (length,) if case.is_varlen else (case.batch_size, seq)
        shape = (*rows, heads, 3)
    return torch.arange(math.prod(shape), dtype=torch.float64).view(shape) + 1.0


@st.composite
def cp_cases(draw) -> tuple[AttentionCase, int]:
    """A case and a cp_size in 1..8 that can be laid out (bshd/sbhd lengths multiples of 2 cp_size)."""
    cp_size = draw(st.integers(1, 8))
    qkv_format = draw(st.sampled_from(("bshd", "sbhd", "thd")))
    batch_size = draw(st.integers(1, 3))
    heads_kv = draw(st.integers(1, 2))
    common = dict(batch_size=batch_size, num_heads=heads_kv * draw(st.sampled_from((1, 2))), num_heads_kv=heads_kv, head_dim=3)
    if qkv_format == "thd":
        lengths = st.lists(st.integers(1, 40), min_size=batch_size, max_size=batch_size)
        seqlens_q, seqlens_k = tuple(draw(lengths)), tuple(draw(lengths))
        case = AttentionCase(qkv_format="thd", seqlens_q=seqlens_q, seqlens_k=seqlens_k,
                             seqlen_q=max(seqlens_q), seqlen_k=max(seqlens_k), **common)
    else:
        unit = 2 * cp_size
        case = AttentionCase(qkv_format=qkv_format, seqlen_q=unit * draw(st.integers(1, 4)),
                             seqlen_k=unit * draw(st.integers(1, 4)), **common)
    return case, cp_size


@given(cp_cases(), st.sampled_from(Q_NAMES + K_NAMES + ("lse",)))
def test_gather_inverts_shard_for_every_layout_and_cp_size(drawn, name):
    case, cp_size = drawn
    full = full_tensor(case, name)
    shards = [shard(full, case, cp_size, rank, name=name) for rank in range(cp_size)]
    assert torch.equal(gather(shards, case, cp_size, name=name), full), (case.describe(), cp_size, name)


@given(cp_cases(), st.sampled_from(("q", "k")))
def test_the_ranks_hold_every_real_token_exactly_once_in_equal_shares(drawn, side):
    case, cp_size = drawn
    layouts = [shard_layout(case, cp_size, rank, side) for rank in range(cp_size)]
    real = torch.cat([layout.index[layout.is_real] for layout in layouts])
    total = (case.total_q if side == "q" else case.total_k) if case.is_varlen else (case.seqlen_q if side == "q" else case.seqlen_k)
    assert sorted(real.tolist()) == list(range(total))
    assert len({layout.local_len for layout in layouts}) == 1, [layout.local_len for layout in layouts]


def test_rank_r_holds_chunks_r_and_2n_minus_1_minus_r_as_in_te_docstring():
    # TE attn_forward_func_with_cp: s = 12, cp_size = 2 -> GPU0 holds 0 1 2 9 10 11, GPU1 3 .. 8
    case = AttentionCase(seqlen_q=12, seqlen_k=12, causal=True)
    assert shard_indices(case, 2, 0).tolist() == [0, 1, 2, 9, 10, 11]
    assert shard_indices(case, 2, 1).tolist() == [3, 4, 5, 6, 7, 8]
    assert [chunk_ids(4, r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]


def test_non_causal_cases_use_the_same_dual_chunk_layout_as_te():
    assert shard_indices(AttentionCase(seqlen_q=8, seqlen_k=8), 2, 0).tolist() == [0, 1, 6, 7]


def test_thd_layout_matches_the_te_docstring_example_sequence_by_sequence():
    # TE: seq_lens = [8, 4], cp_size = 2 -> GPU0 seq0 0 1 6 7, seq1 0 3; GPU1 seq0 2 3 4 5, seq1 1 2
    case = AttentionCase(qkv_format="thd", batch_size=2, seqlens_q=(8, 4), seqlens_k=(8, 4), seqlen_q=8, seqlen_k=8)
    rank0, rank1 = shard_layout(case, 2, 0), shard_layout(case, 2, 1)
    assert rank0.sequence.tolist() == [0, 0, 0, 0, 1, 1] and rank0.position.tolist() == [0, 1, 6, 7, 0, 3]
    assert rank1.position.tolist() == [2, 3, 4, 5, 1, 2]
    assert rank0.index.tolist() == [0, 1, 6, 7, 8, 11] and rank1.index.tolist() == [2, 3, 4, 5, 9, 10]


def test_thd_pads_each_sequence_to_2_cp_size_with_zeros_and_gather_drops_them():
    case = AttentionCase(qkv_format="thd", batch_size=2, seqlens_q=(5, 3), seqlens_k=(5, 3), seqlen_q=5, seqlen_k=5)
    seqlens = cp_seqlens(case, 2)
    assert seqlens.cu_seqlens_q.tolist() == [0, 5, 8]
    assert seqlens.cu_seqlens_q_padded.tolist() == [0, 8, 12]
    assert (seqlens.max_seqlen_q, seqlens.cu_seqlens_q.dtype) == (8, torch.int32)
    layout = shard_layout(case, 2, 1)  # seq 0: chunks 1, 2 = positions 2 3 4 5 (5 is padding); seq 1: 1, 2
    assert layout.index.tolist() == [2, 3, 4, -1, 6, 7]
    full = full_tensor(case, "q")
    local = shard(full, case, 2, 1, name="q")
    assert torch.equal(local[3], torch.zeros_like(local[3]))
    assert torch.equal(local[0], full[2])
    mangled = [shard(full, case, 2, r, name="q") for r in range(2)]
    mangled[1][3] = 99.0  # whatever a backend writes at a padding position is never gathered
    assert torch.equal(gather(mangled, case, 2, name="q"), full)


def test_cp_size_1_is_the_identity_without_padding():
    case = AttentionCase(qkv_format="thd", batch_size=2, seqlens_q=(5, 3), seqlens_k=(1, 2), seqlen_q=5, seqlen_k=2)
    assert shard_indices(case, 1, 0, "q").tolist() == list(range(8))
    assert shard_indices(AttentionCase(seqlen_q=7, seqlen_k=7), 1, 0).tolist() == list(range(7))


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: shard_layout(AttentionCase(seqlen_q=6, seqlen_k=8), 2, 0, "q"), "seqlen_q"),
        (lambda: shard_layout(AttentionCase(seqlen_q=8, seqlen_k=6), 2, 0, "k"), "seqlen_k"),
        (lambda: shard_layout(AttentionCase(seqlen_q=8, seqlen_k=8), 2, 2), "rank"),
        (lambda: shard_layout(AttentionCase(seqlen_q=8, seqlen_k=8), 0, 0), "cp_size"),
        (lambda: shard_layout(AttentionCase(seqlen_q=8, seqlen_k=8), 2, 0, "v"), "side"),
        (lambda: shard(torch.zeros(1, 8, 1, 64), AttentionCase(seqlen_q=8, seqlen_k=8), 2, 0, name="x"), "name"),
        (lambda: shard(torch.zeros(1, 4, 1, 64), AttentionCase(seqlen_q=8, seqlen_k=8), 2, 0, name="q"), "q"),
        (lambda: gather([torch.zeros(1, 4, 1, 64)], AttentionCase(seqlen_q=8, seqlen_k=8), 2, name="out"), "out"),
        (lambda: hierarchical_ranks(2, 0), "cp_size"),
    ],
)
def test_bad_input_raises_an_error_naming_the_field(call, field):
    with pytest.raises(CPShardError) as raised:
        call()
    assert raised.value.field == field, str(raised.value)


def test_gather_names_the_rank_whose_shard_has_the_wrong_length():
    case = AttentionCase(seqlen_q=8, seqlen_k=8)
    with pytest.raises(CPShardError, match="rank 1 returned shape"):
        gather([torch.zeros(1, 4, 1, 64), torch.zeros(1, 3, 1, 64)], case, 2, name="out")


def test_layout_limits_name_the_offending_fields():
    assert cp_unsupported_reasons(AttentionCase(seqlen_q=8, seqlen_k=8)) == []
    reasons = cp_unsupported_reasons(AttentionCase(seqlen_q=6, seqlen_k=8, cp_size=2, cp_comm_type="p2p"))
    assert reasons == ["seqlen_q=6 is not a multiple of 2 * cp_size = 4"]
    a2a = cp_unsupported_reasons(AttentionCase(seqlen_q=8, seqlen_k=8, num_heads=6, num_heads_kv=3, cp_size=2, cp_comm_type="a2a"))
    assert any("num_heads_kv=3" in r for r in a2a) and not any("num_heads=6" in r for r in a2a), a2a
    thd = AttentionCase(qkv_format="thd", seqlen_q=5, seqlen_k=5, cp_size=4, cp_comm_type="a2a+p2p", num_heads=3, num_heads_kv=3)
    assert [r for r in cp_unsupported_reasons(thd) if "seqlen" in r] == []  # thd is padded
    assert any("num_heads=3" in r for r in cp_unsupported_reasons(thd))


def test_hierarchical_groups_are_pairs_for_a2a_and_parity_rings_for_p2p():
    assert hierarchical_ranks(8, 5) == ([4, 5], [1, 3, 5, 7])
    assert hierarchical_ranks(4, 0) == ([0, 1], [0, 2])


def test_shard_inputs_and_gather_outputs_round_trip_a_backend_output():
    case = AttentionCase(qkv_format="thd", batch_size=2, seqlens_q=(5, 3), seqlens_k=(2, 7), seqlen_q=5, seqlen_k=7,
                         dtype="float32", cp_size=2, cp_comm_type="p2p")
    inputs = make_inputs(case)
    shards = [shard_inputs(case, inputs, 2, r) for r in range(2)]
    assert shards[1].seqlens.cu_seqlens_k_padded.tolist() == [0, 4, 12]
    outputs = [BackendOutput(out=s.q, lse=None, dq=s.q, dk=s.k, dv=s.v, compile_ms=float(r)) for r, s in enumerate(shards)]
    gathered = gather_outputs(case, 2, outputs)
    assert torch.equal(gathered.out, inputs.q) and torch.equal(gathered.dk, inputs.k) and torch.equal(gathered.dv, inputs.v)
    assert gathered.lse is None and gathered.compile_ms == 1.0
    assert gathered.extra["cp_layout"] == "dual_chunk_swap"
    with pytest.raises(CPShardError, match="rank 1 returned no out"):
        gather_outputs(case, 2, [outputs[0], BackendOutput(out=None)])


# ----------------------------------------------------------------------------------- agreement
CASE = AttentionCase(seqlen_q=8, seqlen_k=8, num_heads=2, head_dim=16, dtype="bfloat16", causal=True, backward=True,
                     cp_size=2, cp_comm_type="all_gather")


@pytest.fixture(scope="module")
def oracle_and_run():
    inputs = make_inputs(CASE)
    return reference(CASE, inputs), RingAttentionCPUBackend().run(cp_twin(CASE), inputs, "default")


def test_identical_outputs_agree_and_say_so(oracle_and_run):
    ref, run = oracle_and_run
    agreement = cp_agreement(CASE, ref, run, run)
    assert agreement.agrees_with_non_cp and agreement.identical
    assert agreement.diff_ratio_vs_non_cp == 0.0 and set(agreement.tensors) == {"out", "lse", "dq", "dk", "dv"}


def test_a_difference_beyond_twice_the_oracles_allowed_error_disagrees(oracle_and_run):
    ref, run = oracle_and_run
    shifted = BackendOutput(out=run.out.clone(), lse=run.lse, dq=run.dq, dk=run.dk, dv=run.dv)
    shifted.out[0, 3, 1, 5] += 0.5
    agreement = cp_agreement(CASE, ref, shifted, run)
    assert not agreement.agrees_with_non_cp
    assert agreement.tensors["out"]["ratio"] > AGREEMENT_RATIO
    assert agreement.max_abs_diff_vs_non_cp == pytest.approx(0.5, rel=0.02)


def test_nan_on_one_side_disagrees_and_nan_on_both_sides_agrees(oracle_and_run):
    ref, run = oracle_and_run
    with_nan = BackendOutput(out=run.out.clone(), lse=None)
    with_nan.out[0, 0, 0, 0] = math.nan
    one_sided = cp_agreement(CASE, ref, with_nan, BackendOutput(out=run.out, lse=None))
    assert not one_sided.agrees_with_non_cp and one_sided.to_json()["diff_ratio_vs_non_cp"] == "inf"
    assert cp_agreement(CASE, ref, with_nan, with_nan).agrees_with_non_cp


def _worker_judge():
    backends = [(PlantedWindowCPUBackend(), "fuzzer.backends.cp_cpu:PlantedWindowCPUBackend"),
                (RingAttentionCPUBackend(), "fuzzer.backends.cp_cpu:RingAttentionCPUBackend")]
    return Worker(WorkerConfig(backends=backends, isolation="none"), MemorySink())


def test_equal_but_wrong_cp_and_non_cp_outputs_fail_and_are_flagged_as_the_blind_spot():
    worker = _worker_judge()
    inputs = make_inputs(CASE)
    ref = reference(CASE, inputs)
    planted = PlantedWindowCPUBackend().run(cp_twin(CASE), inputs, "default")
    twin = TaskOutcome("cp-cpu-planted-window", "default", "ok", output=planted)
    outcome = CPTaskOutcome("cp-cpu-planted-window", "default", "ok", output=planted, non_cp=twin)
    result, twin_result = judge_cp(CASE, ref, outcome, lambda c, o: worker._judge(c, ref, o, 0.0, "fuzz"))
    block = result.metrics[CP_METRICS_KEY]
    assert result.status == "fail" and result.signature == "out:all_zero", result.signatures
    assert twin_result.case_id == cp_twin(CASE).case_id and twin_result.status == "fail"
    assert block["agrees_with_non_cp"] is True and block["identical"] is True
    assert block["agree_but_both_wrong"] is True
    assert block["non_cp_case_id"] == cp_twin(CASE).case_id and block["cp_size"] == 2


def test_a_correct_backend_passes_and_is_not_flagged():
    worker = _worker_judge()
    inputs = make_inputs(CASE)
    ref = reference(CASE, inputs)
    run = RingAttentionCPUBackend().run(cp_twin(CASE), inputs, "default")
    outcome = CPTaskOutcome("cp-cpu-ring", "default", "ok", output=run,
                            non_cp=TaskOutcome("cp-cpu-ring", "default", "ok", output=run))
    result, _ = judge_cp(CASE, ref, outcome, lambda c, o: worker._judge(c, ref, o, 0.0, "fuzz"))
    assert result.status == "pass"
    assert result.metrics[CP_METRICS_KEY]["agree_but_both_wrong"] is False


def test_a_failed_cp_run_keeps_its_twin_but_measures_no_agreement():
    worker = _worker_judge()
    inputs = make_inputs(CASE)
    ref = reference(CASE, inputs)
    run = RingAttentionCPUBackend().run(cp_twin(CASE), inputs, "default")
    outcome = CPTaskOutcome("cp-cpu-ring", "default", "timeout", detail="rank 1 did not answer",
                            non_cp=TaskOutcome("cp-cpu-ring", "default", "ok", output=run))
    result, twin_result = judge_cp(CASE, ref, outcome, lambda c, o: worker._judge(c, ref, o, 0.0, "fuzz"))
    assert (result.status, twin_result.status) == ("timeout", "pass")
    assert result.metrics[CP_METRICS_KEY]["agrees_with_non_cp"] is None


def test_outcomes_without_a_twin_are_judged_unchanged():
    worker = _worker_judge()
    case = cp_twin(CASE)
    inputs = make_inputs(case)
    ref = reference(case, inputs)
    outcome = TaskOutcome("cp-cpu-ring", "default", "ok", output=RingAttentionCPUBackend().run(case, inputs, "default"))
    result, twin_result = judge_cp(case, ref, outcome, lambda c, o: worker._judge(c, ref, o, 0.0, "fuzz"))
    assert twin_result is None and CP_METRICS_KEY not in result.metrics and result.status == "pass"


def test_executor_settings_are_checked_and_max_cp_size_follows_the_backends():
    from fuzzer.cp.executor import CPExecutor
    from fuzzer.executor import ExecutorError

    ring = [(RingAttentionCPUBackend(), "fuzzer.backends.cp_cpu:RingAttentionCPUBackend")]
    with pytest.raises(ExecutorError, match="max_live_groups"):
        CPExecutor(ring, max_live_groups=0)
    with pytest.raises(ExecutorError, match="max_cp_size"):
        CPExecutor(ring, max_cp_size=0)
    assert CPExecutor(ring).max_cp_size == 2 and CPExecutor(ring, max_cp_size=6).max_cp_size == 4
    from fuzzer.backends.sdpa import builtin_backends

    no_cp = [(b, "fuzzer.backends.sdpa:builtin_backends") for b in builtin_backends()[:1]]
    assert CPExecutor(no_cp).max_cp_size == 1
    assert CPExecutor(ring).availability() == {"cp-cpu-ring": None}
