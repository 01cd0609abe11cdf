"""The CP plumbing for real: `fuzzer.cp.executor.CPExecutor` starts 2, 4 and 8 gloo ranks on the CPU,
`fuzzer.backends.cp_cpu` runs p2p / all_gather / a2a / a2a+p2p attention across them, and every
gathered out, lse and gradient is judged against the float64 oracle of the full sequence.

Also: the planted bugs (one equal with and without CP, one CP-only), a rank that hangs in a
collective, a rank that segfaults, a rank that raises, group reuse, routing by ``cp_size``, and the
worker reporting an equal-but-wrong CP case as failing.

The stand-in backends below are loaded by the rank processes from this module.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from fuzzer.backends.cp_cpu import PlantedMergeCPUBackend, PlantedWindowCPUBackend, RingAttentionCPUBackend
from fuzzer.backends.cp_layout import cp_twin
from fuzzer.cp.executor import CPExecutor, CPTaskOutcome, RoutingExecutor
from fuzzer.cp.judge import CP_METRICS_KEY, judge_cp
from fuzzer.executor import ExecutorError, InProcessExecutor
from fuzzer.sinks import MemorySink
from fuzzer.worker import Worker, WorkerConfig
from oracle.compare import compare_outputs
from oracle.config import AttentionCase
from oracle.inputs import make_inputs
from oracle.reference import reference

HANG_SEQLEN, CRASH_SEQLEN, RAISE_SEQLEN = 20, 24, 28
TIMEOUT_S = 20.0  # per task; only the hang test waits for it


class HangingCPBackend(RingAttentionCPUBackend):
    """Correct, except that for seqlen_q == 20 the last rank, after its part, enters an all_reduce
    that no other rank joins: every other rank answers, that one never does."""

    name = "cp-standin-hang"
    environment = "cp-standin"

    def run_cp(self, case, inputs, groups, variant):
        result = super().run_cp(case, inputs, groups, variant)
        if case.seqlen_q == HANG_SEQLEN and groups.rank == groups.cp_size - 1:
            import torch.distributed as dist

            dist.all_reduce(torch.zeros(1), group=groups.group)
        return result


class CrashingCPBackend(RingAttentionCPUBackend):
    """Rank 1 segfaults (a real SIGSEGV) for seqlen_q == 24."""

    name = "cp-standin-crash"
    environment = "cp-standin"

    def run_cp(self, case, inputs, groups, variant):
        if case.seqlen_q == CRASH_SEQLEN and groups.rank == 1:
            ctypes.string_at(0)
        return super().run_cp(case, inputs, groups, variant)


class RaisingCPBackend(RingAttentionCPUBackend):
    """Rank 1 raises before its first collective for seqlen_q == 28; the others wait for it."""

    name = "cp-standin-raise"
    environment = "cp-standin"

    def run_cp(self, case, inputs, groups, variant):
        if case.seqlen_q == RAISE_SEQLEN and groups.rank == 1:
            raise RuntimeError("planted error on rank 1")
        return super().run_cp(case, inputs, groups, variant)


MODULE = "tests.fuzzer.test_cp_distributed"
BACKENDS = [
    (RingAttentionCPUBackend(), "fuzzer.backends.cp_cpu:RingAttentionCPUBackend"),
    (PlantedWindowCPUBackend(), "fuzzer.backends.cp_cpu:PlantedWindowCPUBackend"),
    (PlantedMergeCPUBackend(), "fuzzer.backends.cp_cpu:PlantedMergeCPUBackend"),
    (HangingCPBackend(), f"{MODULE}:HangingCPBackend"),
    (CrashingCPBackend(), f"{MODULE}:CrashingCPBackend"),
    (RaisingCPBackend(), f"{MODULE}:RaisingCPBackend"),
]
RING, WINDOW, MERGE = ("cp-cpu-ring", "default"), ("cp-cpu-planted-window", "default"), ("cp-cpu-planted-merge", "default")


@pytest.fixture(scope="module")
def cp2():
    executor = CPExecutor(BACKENDS, max_cp_size=2, error_grace_s=2.0)
    yield executor
    executor.close()


def cp_case(cp_size: int, cp_comm_type: str, **kw) -> AttentionCase:
    base = dict(seqlen_q=4 * cp_size, seqlen_k=4 * cp_size, num_heads=2 * cp_size, num_heads_kv=cp_size, head_dim=8,
                dtype="float32", causal=True, backward=True, seed=7)
    base.update(kw)
    return AttentionCase(cp_size=cp_size, cp_comm_type=cp_comm_type, **base)


def thd(cp_size: int, cp_comm_type: str, **kw) -> AttentionCase:
    """Two sequences of different lengths, neither a multiple of 2 * cp_size (padded)."""
    lengths = dict(qkv_format="thd", batch_size=2, seqlens_q=(2 * cp_size + 1, 3), seqlens_k=(2 * cp_size + 1, 3),
                   seqlen_q=2 * cp_size + 1, seqlen_k=2 * cp_size + 1)
    return cp_case(cp_size, cp_comm_type, **{**lengths, **kw})


def verdicts(case: AttentionCase, outcome):
    """(CP verdict, non-CP verdict) against the oracle of the full inputs."""
    ref = reference(case, make_inputs(case))

    def judge(output):
        return compare_outputs(case, ref, out=output.out, lse=output.lse, dq=output.dq, dk=output.dk, dv=output.dv)

    return judge(outcome.output), judge(outcome.non_cp.output)


def run(executor, case, tasks, timeout_s=TIMEOUT_S):
    return executor.run(case, make_inputs(case), tasks, timeout_s)


# ------------------------------------------------------------------------------------ cp_size 2
@pytest.mark.parametrize("cp_comm_type", ["p2p", "all_gather", "a2a"])
@pytest.mark.parametrize(
    "variant",
    ["causal_bshd", "window_sbhd_cross", "thd_bottom_right_padded", "thd_no_mask_bf16_mla"],
)
def test_cp2_gathered_outputs_and_gradients_pass_the_float64_oracle(cp2, cp_comm_type, variant):
    case = {
        "causal_bshd": lambda: cp_case(2, cp_comm_type),
        "window_sbhd_cross": lambda: cp_case(2, cp_comm_type, qkv_format="sbhd", causal=False, seqlen_k=16,
                                             window_size_left=3, window_size_right=1, causal_alignment="bottom_right"),
        "thd_bottom_right_padded": lambda: thd(2, cp_comm_type, seqlens_k=(4, 7), seqlen_k=7,
                                               causal_alignment="bottom_right"),
        "thd_no_mask_bf16_mla": lambda: thd(2, cp_comm_type, causal=False, dtype="bfloat16", head_dim_v=4),
    }[variant]()
    [outcome] = run(cp2, case, [RING])
    assert outcome.status == "ok", outcome.detail
    assert isinstance(outcome, CPTaskOutcome) and outcome.rank_status == ["ok", "ok"]
    cp_verdict, non_cp_verdict = verdicts(case, outcome)
    assert cp_verdict.passed, (case.describe(), cp_verdict.signatures, cp_verdict.error_ratio)
    assert non_cp_verdict.passed, non_cp_verdict.signatures
    assert set(cp_verdict.tensors) == {"out", "lse", "dq", "dk", "dv"}
    assert outcome.output.extra["cp_comm_type"] == cp_comm_type and outcome.output.extra["cp_layout"] == "dual_chunk_swap"


@pytest.mark.parametrize("cp_comm_type", ["p2p", "all_gather", "a2a"])
def test_equal_but_wrong_cp_and_non_cp_fail_the_oracle_while_agreeing(cp2, cp_comm_type):
    """Acceptance 3 across processes: the planted (-1, 0) misread is identical with and without CP
    (a CP-vs-non-CP comparison passes) and the oracle fails both."""
    case = cp_case(2, cp_comm_type)
    [outcome] = run(cp2, case, [WINDOW])
    assert outcome.status == "ok", outcome.detail
    assert torch.equal(outcome.output.out, outcome.non_cp.output.out), "CP and non-CP should be equal"
    cp_verdict, non_cp_verdict = verdicts(case, outcome)
    assert cp_verdict.primary_signature == non_cp_verdict.primary_signature == "out:all_zero"
    worker = Worker(WorkerConfig(backends=BACKENDS[:3], isolation="none"), MemorySink())
    ref = reference(case, make_inputs(case))
    result, twin_result = judge_cp(case, ref, outcome, lambda c, o: worker._judge(c, ref, o, 0.0, "fuzz"))
    assert (result.status, twin_result.status) == ("fail", "fail")
    assert result.metrics[CP_METRICS_KEY]["agrees_with_non_cp"] is True
    assert result.metrics[CP_METRICS_KEY]["agree_but_both_wrong"] is True


@pytest.mark.parametrize("cp_comm_type", ["p2p", "all_gather", "a2a"])
def test_a_cp_only_merge_bug_fails_the_oracle_and_disagrees_with_non_cp(cp2, cp_comm_type):
    case = cp_case(2, cp_comm_type, causal=False)
    [outcome] = run(cp2, case, [MERGE])
    cp_verdict, non_cp_verdict = verdicts(case, outcome)
    assert not cp_verdict.passed and non_cp_verdict.passed, (cp_verdict.signatures, non_cp_verdict.signatures)
    worker = Worker(WorkerConfig(backends=BACKENDS[:3], isolation="none"), MemorySink())
    ref = reference(case, make_inputs(case))
    result, _ = judge_cp(case, ref, outcome, lambda c, o: worker._judge(c, ref, o, 0.0, "fuzz"))
    assert result.metrics[CP_METRICS_KEY]["agrees_with_non_cp"] is False
    assert result.metrics[CP_METRICS_KEY]["agree_but_both_wrong"] is False


def test_a_group_is_reused_across_cases_and_tasks(cp2):
    run(cp2, cp_case(2, "p2p"), [RING])
    pids = cp2.group_pids("cp-cpu", 2)
    outcomes = run(cp2, cp_case(2, "a2a", seed=8), [RING, WINDOW, MERGE])
    assert [o.status for o in outcomes] == ["ok", "ok", "ok"]
    assert cp2.group_pids("cp-cpu", 2) == pids and len(pids) == 2


def test_a_rank_that_hangs_in_a_collective_is_a_timeout_naming_it_and_the_group_restarts(cp2):
    case = cp_case(2, "p2p", seqlen_q=HANG_SEQLEN, seqlen_k=HANG_SEQLEN)
    run(cp2, cp_case(2, "p2p"), [("cp-standin-hang", "default")])
    before, restarts = cp2.group_pids("cp-standin", 2), cp2.restarts
    [outcome] = run(cp2, case, [("cp-standin-hang", "default")], timeout_s=5.0)
    assert outcome.status == "timeout", outcome.detail
    assert outcome.detail.startswith("no result from rank 1 of cp_size=2 after 5 s"), outcome.detail
    assert outcome.rank_status == ["ok", "missing"]
    assert outcome.non_cp is not None and outcome.non_cp.status == "ok"
    assert cp2.restarts == restarts + 1 and cp2.group_pids("cp-standin", 2) == []
    [after] = run(cp2, cp_case(2, "p2p"), [("cp-standin-hang", "default")])
    assert after.status == "ok", after.detail
    assert set(cp2.group_pids("cp-standin", 2)).isdisjoint(before)


def test_a_rank_that_segfaults_is_a_crash_with_its_stderr_and_the_next_case_runs(cp2):
    case = cp_case(2, "all_gather", seqlen_q=CRASH_SEQLEN, seqlen_k=CRASH_SEQLEN)
    [outcome] = run(cp2, case, [("cp-standin-crash", "default")])
    assert outcome.status == "crash", outcome.detail
    assert outcome.detail.startswith("rank 1 died with signal SIGSEGV"), outcome.detail
    assert "Segmentation fault" in outcome.detail and "--- rank 1 stderr (tail) ---" in outcome.detail
    [after] = run(cp2, cp_case(2, "all_gather"), [("cp-standin-crash", "default")])
    assert after.status == "ok", after.detail


def test_a_rank_that_raises_while_the_others_wait_is_its_error_and_the_rest_rerun(cp2):
    case = cp_case(2, "p2p", seqlen_q=RAISE_SEQLEN, seqlen_k=RAISE_SEQLEN)
    outcomes = run(cp2, case, [("cp-standin-raise", "default"), ("cp-standin-hang", "default")])
    assert outcomes[0].status == "error" and outcomes[0].exception_type == "RuntimeError", outcomes[0].detail
    assert "rank 1: error: RuntimeError: planted error on rank 1" in outcomes[0].detail
    assert outcomes[1].status == "ok", outcomes[1].detail  # run again in a fresh group


def test_routing_sends_cp_cases_to_the_cp_executor_and_others_to_the_default(cp2):
    router = RoutingExecutor(InProcessExecutor(BACKENDS[:3]), cp2)
    plain = cp_twin(cp_case(2, "p2p"))
    [direct] = router.run(plain, make_inputs(plain), [RING], TIMEOUT_S)
    [distributed] = router.run(cp_case(2, "p2p"), make_inputs(plain), [RING], TIMEOUT_S)
    assert not isinstance(direct, CPTaskOutcome) and isinstance(distributed, CPTaskOutcome)
    assert router.max_cp_size == 2
    with pytest.raises(ExecutorError, match="cp_size"):
        cp2.run(plain, make_inputs(plain), [RING], TIMEOUT_S)


def test_cases_beyond_the_hosts_ranks_or_backends_without_cp_are_unsupported(cp2):
    [too_big] = run(cp2, cp_case(4, "p2p"), [RING])
    assert too_big.status == "unsupported" and "cp_size=4 needs 4 cpu ranks" in too_big.detail
    [no_cp] = run(cp2, cp_case(2, "p2p"), [("torch-cpu-math", "default")])
    assert no_cp.status == "unsupported"


def test_the_worker_reports_an_equal_but_wrong_cp_case_as_failing(cp2):
    """The worker as it is, with its executor routed: the CP result is judged by the oracle."""
    sink = MemorySink()
    worker = Worker(WorkerConfig(backends=BACKENDS[:2], isolation="none", shrink=False), sink)
    worker.open()
    try:
        worker._executor = RoutingExecutor(worker._executor, cp2)
        results = worker.evaluate(cp_case(2, "all_gather"), phase="fuzz", tasks=[RING, WINDOW])
    finally:
        worker._executor = None  # the module's executor is closed by its fixture
    by_backend = {r.backend: r for r in results}
    assert by_backend["cp-cpu-ring"].status == "pass"
    assert by_backend["cp-cpu-planted-window"].status == "fail"
    assert ("cp-cpu-planted-window", "default", "out:all_zero") in sink.buckets


# ------------------------------------------------------------------------------- cp_size 4 and 8
def test_cp4_every_comm_type_including_hierarchical_passes_the_oracle():
    with CPExecutor(BACKENDS[:3], max_cp_size=4) as executor:
        cases = [
            cp_case(4, "p2p"),
            thd(4, "all_gather", causal=False, window_size_left=2, window_size_right=2),
            cp_case(4, "a2a", qkv_format="sbhd", seqlen_k=32, causal=False),
            cp_case(4, "a2a+p2p"),
            thd(4, "a2a+p2p", seqlens_k=(2, 11), seqlen_k=11, causal_alignment="bottom_right"),
        ]
        for case in cases:
            [outcome] = run(executor, case, [RING])
            assert outcome.status == "ok", (case.describe(), outcome.detail)
            cp_verdict, _ = verdicts(case, outcome)
            assert cp_verdict.passed, (case.describe(), cp_verdict.signatures)
        [planted] = run(executor, cp_case(4, "a2a+p2p"), [WINDOW])
        assert torch.equal(planted.output.out, planted.non_cp.output.out)
        assert verdicts(cp_case(4, "a2a+p2p"), planted)[0].primary_signature == "out:all_zero"


@pytest.mark.slow
def test_cp8_every_comm_type_passes_the_oracle_and_the_merge_bug_is_caught():
    with CPExecutor(BACKENDS[:3], max_cp_size=8) as executor:
        cases = [cp_case(8, "p2p", head_dim=4), thd(8, "all_gather", head_dim=4, causal=False),
                 cp_case(8, "a2a", head_dim=4, causal=False), cp_case(8, "a2a+p2p", head_dim=4, num_heads=4, num_heads_kv=2)]
        for case in cases:
            [outcome] = run(executor, case, [RING])
            assert outcome.status == "ok", outcome.detail
            assert verdicts(case, outcome)[0].passed, case.describe()
        [merge] = run(executor, cases[0], [MERGE])
        cp_verdict, non_cp_verdict = verdicts(cases[0], merge)
        assert not cp_verdict.passed and non_cp_verdict.passed
        assert len(executor.group_pids("cp-cpu", 8)) == 8


def test_at_most_max_live_groups_stay_alive_least_recently_used_first():
    with CPExecutor(BACKENDS, max_cp_size=2, max_live_groups=1) as executor:
        assert run(executor, cp_case(2, "p2p"), [RING])[0].status == "ok"
        assert len(executor.group_pids("cp-cpu", 2)) == 2
        assert run(executor, cp_case(2, "p2p"), [("cp-standin-hang", "default")])[0].status == "ok"
        assert executor.group_pids("cp-cpu", 2) == [] and len(executor.group_pids("cp-standin", 2)) == 2
