"""End-to-end tests of the worker on CPU: planted bugs are found and shrunk, crashes and hangs are
contained, and every result is stored."""

import sys
import textwrap

import pytest

from fuzzer import registry
from fuzzer.sinks import MemorySink
from fuzzer.loop.compile_budget import CompileBudget
from fuzzer.worker import Worker, WorkerConfig, WorkerError
from oracle.config import AttentionCase


@pytest.fixture
def planted_plugin(tmp_path, monkeypatch):
    """Register the planted backend through the entry-point group, as a third-party package would."""
    dist = tmp_path / "attnfuzz_planted-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: attnfuzz-planted\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        textwrap.dedent(
            """\
            [attnfuzz.backends]
            planted = tests.fuzzer.standins:PlantedWindowBackend
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    importlib.invalidate_caches()
    return "planted-fa4"


def test_the_worker_finds_and_shrinks_the_planted_window_bug_without_being_told_where(planted_plugin):
    assert planted_plugin in registry.discover()
    sink = MemorySink()
    config = WorkerConfig(
        backends=registry.select([planted_plugin]),
        max_cases=60,
        time_budget_s=None,
        seed=1,
        shrink_deadline_s=60,
        max_batch_size=3,
        max_heads_kv=3,
        isolation="process",
    )
    stats = Worker(config, sink).run()
    key = ("planted-fa4", "te_window", "out:all_zero")
    assert key in sink.buckets, f"buckets found: {sorted(sink.buckets)}"
    bucket = sink.buckets[key]
    assert bucket.minimised_case is not None, bucket.note
    minimal = AttentionCase.from_json(bucket.minimised_case)
    assert minimal.causal
    assert (minimal.batch_size, minimal.num_heads) == (1, 1), minimal.describe()
    assert minimal.seqlen_q <= 2 and minimal.seqlen_k <= 2, minimal.describe()
    # the correct encoding of the same backend never fails
    assert not [k for k in sink.buckets if k[1] == "native"]
    assert stats.cases >= 1

    # a second worker on the same store replays the known failure before fuzzing
    second = Worker(
        WorkerConfig(backends=registry.select([planted_plugin]), max_cases=0, time_budget_s=None, isolation="none"),
        sink,
    ).run()
    assert (key, "out:all_zero") in second.replayed
    replays = [r for r in sink.results.values() if r.phase == "replay"]
    assert any(r.case_id == minimal.case_id and r.signature == "out:all_zero" for r in replays)


def test_crashes_and_hangs_become_results_and_the_worker_carries_on():
    backends = registry.select(
        [],
        [
            "tests.fuzzer.standins:CorrectBackend",
            "tests.fuzzer.standins:CrashingBackend",
            "tests.fuzzer.standins:HangingBackend",
        ],
    )
    sink = MemorySink()
    config = WorkerConfig(backends=backends, case_timeout_s=5.0, isolation="process", shrink=False)
    cases = [AttentionCase(seqlen_q=n, seqlen_k=n, head_dim=16, dtype="float32", num_heads=2) for n in (2, 3, 5, 4)]
    with Worker(config, sink) as worker:
        statuses = [{r.backend: r.status for r in worker.evaluate(case)} for case in cases]
        restarts = worker._executor.restarts
    assert statuses[0] == {"standin-ok": "pass", "standin-crash": "pass", "standin-hang": "pass"}
    assert statuses[1] == {"standin-ok": "pass", "standin-crash": "crash", "standin-hang": "pass"}
    assert statuses[2] == {"standin-ok": "pass", "standin-crash": "pass", "standin-hang": "timeout"}
    assert statuses[3] == {"standin-ok": "pass", "standin-crash": "pass", "standin-hang": "pass"}
    assert restarts == 2
    assert len(sink.results) == 12  # every (case, backend) stored, before and after the faults
    crash = next(r for r in sink.results.values() if r.status == "crash")
    assert "SIGSEGV" in crash.detail and crash.signature == "crash"
    assert ("standin-crash", "native", "crash") in sink.buckets
    assert ("standin-hang", "native", "timeout") in sink.buckets


def test_a_worker_without_any_usable_backend_says_why():
    backends = registry.select(["torch-sdpa-flash"]) if "torch-sdpa-flash" in registry.discover() else []
    if not backends or not backends[0][0].availability():
        pytest.skip("a CUDA device is present")
    with pytest.raises(WorkerError, match="torch-sdpa-flash: no CUDA device"):
        Worker(WorkerConfig(backends=backends, isolation="none"), MemorySink()).run()


def test_unsupported_variants_are_recorded_as_unsupported_never_as_failures():
    backends = registry.select(["torch-cpu-math"])
    sink = MemorySink()
    case = AttentionCase(seqlen_q=4, seqlen_k=6, causal=True, causal_alignment="bottom_right", dtype="float32")
    with Worker(WorkerConfig(backends=backends, isolation="none", shrink=False), sink) as worker:
        results = {r.variant: r for r in worker.evaluate(case)}
        asked = {r.variant: r for r in worker.evaluate(case, tasks=[("torch-cpu-math", "is_causal")])}
    # is_causal cannot encode a bottom-right mask: no distinct call, so no result in a fuzz
    # evaluation (bool_mask covers the case) and counted as left out ...
    assert "is_causal" not in results and worker.stats.not_applicable["torch-cpu-math"] >= 1
    assert results["bool_mask"].status == "pass", results["bool_mask"].metrics
    # ... while a task asked for by name is still answered: unsupported, with the reason
    assert asked["is_causal"].status == "unsupported"
    assert "top-left" in asked["is_causal"].detail
    assert not sink.buckets


def test_a_bucket_left_unminimised_is_claimed_and_minimised_by_the_next_worker():
    """A worker that died (or ran with --no-shrink) left a bucket without a minimised case: the
    next worker claims it at start, even with no case budget, and minimises it once."""
    from fuzzer.results import BuildFingerprint, CaseResult

    backends = registry.select([], ["tests.fuzzer.standins:GateBackend"])
    sink = MemorySink()
    build_id = sink.register_build(BuildFingerprint())
    case = AttentionCase(batch_size=2, seqlen_q=5, seqlen_k=6, num_heads=2, head_dim=16, dtype="float32", causal=True)
    sink.record_case(case.to_json(), "fuzz")
    sink.record_result(CaseResult(case.case_id, "standin-gate", "buggy", "fail", signature="out:all_zero"), build_id, None)
    dead = sink.register_worker(build_id, "h", 1, "cpu")
    assert sink.claim_minimisation(dead, ["standin-gate"], lease_s=3600.0).attempt == 1
    sink.mark_worker_lost(dead)  # what taking over its spool slot does

    config = WorkerConfig(backends=backends, max_cases=0, time_budget_s=None, isolation="none", shrink_deadline_s=30)
    stats = Worker(config, sink).run()
    bucket = sink.buckets[("standin-gate", "buggy", "out:all_zero")]
    assert bucket.minimised_case is not None and bucket.note.startswith("minimised"), bucket.note
    minimal = AttentionCase.from_json(bucket.minimised_case)
    assert minimal.causal and (minimal.batch_size, minimal.num_heads) == (1, 1), minimal.describe()
    assert (bucket.attempts, bucket.owner) == (2, None)
    assert [key for key, _ in stats.minimised] == [("standin-gate", "buggy", "out:all_zero")]
    assert stats.cases == 0
    assert sink.workers[dead]["status"] == "lost"


def test_a_worker_that_loses_its_lease_mid_shrink_stops_and_records_nothing():
    """Another worker took the bucket (the lease expired): the shrinking worker stops at its next
    renewal, inside Hypothesis's search, and stores no minimised case."""
    from fuzzer.results import BuildFingerprint, CaseResult

    class StolenAfter(MemorySink):
        renewals = 0

        def renew_minimisation(self, bucket_id, worker_id, lease_s):
            self.renewals += 1
            return self.renewals < 4  # the first confirmations renew; then the lease is gone

    backends = registry.select([], ["tests.fuzzer.standins:GateBackend"])
    sink = StolenAfter()
    build_id = sink.register_build(BuildFingerprint())
    case = AttentionCase(batch_size=2, seqlen_q=5, seqlen_k=6, num_heads=2, head_dim=16, dtype="float32", causal=True)
    sink.record_case(case.to_json(), "fuzz")
    sink.record_result(CaseResult(case.case_id, "standin-gate", "buggy", "fail", signature="out:all_zero"), build_id, None)
    config = WorkerConfig(backends=backends, max_cases=0, time_budget_s=None, isolation="none", heartbeat_s=0.0,
                          minimise_max_attempts=1, replay_known=False)
    stats = Worker(config, sink).run()
    bucket = sink.buckets[("standin-gate", "buggy", "out:all_zero")]
    assert sink.renewals == 4 and stats.leases_lost == 1
    assert bucket.minimised_case is None and stats.minimised == []
    assert len(sink.results) == 1, "no confirm result stored"


# --------------------------------------------------------------------------- compile budget
def _jit_run(jit_share, max_cases=60, draw="targeted"):
    """A planted JIT backend (500 ms reported per new kernel key) under a frozen clock: the
    fuzzing wall time stays 0, so once one kernel is built the budget is spent for good."""
    from tests.fuzzer.planted_jit import FakeClock, PlantedJitBackend

    backend = PlantedJitBackend()
    config = WorkerConfig(
        backends=[(backend, "tests.fuzzer.planted_jit:PlantedJitBackend")], isolation="none", seed=7,
        max_cases=max_cases, time_budget_s=None, shrink=False, replay_known=False, jit_share=jit_share, draw=draw,
    )
    stats = Worker(config, MemorySink(), clock=FakeClock()).run()
    return stats, backend


def test_the_compile_budget_reuses_built_kernels_and_counts_the_keys():
    budgeted, backend = _jit_run(0.2)
    free, free_backend = _jit_run(1.0)
    keys, free_keys = len(budgeted.kernel_keys["planted-jit"]), len(free.kernel_keys["planted-jit"])
    assert budgeted.cases == free.cases == 60
    assert keys == len(backend.built) and free_keys == len(free_backend.built)  # a key counts once
    assert keys * 2 <= free_keys, (keys, free_keys)
    assert budgeted.compile_s == keys * 0.5 and budgeted.compile_by_backend["planted-jit"] == keys * 0.5
    assert budgeted.template_chunks["over"] >= 2 and free.template_chunks == {"none": 3}
    # union draws take no templates (and still run)
    union, _ = _jit_run(0.2, max_cases=20, draw="union")
    assert union.cases == 20 and union.kernel_keys["planted-jit"]


def test_jit_share_must_be_in_0_1():
    backends = registry.select(["torch-cpu-math"])
    for bad in (0.0, -0.1, 1.5, "half"):
        with pytest.raises(WorkerError, match="jit_share"):
            WorkerConfig(backends=backends, jit_share=bad)
    assert WorkerConfig(backends=backends, jit_share=None).jit_share is None
    assert WorkerConfig(backends=backends).jit_share == 0.2


def test_over_the_compile_budget_a_case_drawn_for_another_backend_builds_no_new_kernel():
    """A non-JIT target's draws are free; over the budget (frozen clock: spent after the first
    compile) the JIT backend runs only the kernels already built and the first kernel of each
    mask class it has not run yet (`kernel_class`, counted in ``compile_novel``), and says how
    many tasks it left out; the other backend runs every case."""
    from tests.fuzzer.planted_jit import FakeClock, PlantedJitBackend
    from tests.fuzzer.standins import CorrectBackend

    def run(jit_share):
        backend = PlantedJitBackend()
        config = WorkerConfig(
            backends=[(backend, "tests.fuzzer.planted_jit:PlantedJitBackend"),
                      (CorrectBackend(), "tests.fuzzer.standins:CorrectBackend")],
            isolation="none", seed=11, max_cases=40, time_budget_s=None, shrink=False, replay_known=False,
            jit_share=jit_share,
        )
        return Worker(config, MemorySink(), clock=FakeClock()).run(), backend

    gated, backend = run(0.2)
    free, free_backend = run(1.0)
    assert gated.cases == free.cases == 40
    assert gated.compile_gated["planted-jit"] > 0 and not free.compile_gated
    assert "standin-ok" not in gated.compile_gated
    assert len(backend.built) == len(gated.kernel_keys["planted-jit"])  # what ran is what was built
    # the kernels of the first case it ran (one per variant, then the budget is spent for good),
    # then only the first kernel of each mask class (causal, windows, softcap, backward) not run yet
    classes = {(k[5], k[6], k[7], k[8], k[10]) for k in backend.built}
    assert len(PlantedJitBackend.variants) == 1 and len(backend.built) == len(classes) < len(free_backend.built)
    assert gated.compile_novel["planted-jit"] == len(backend.built) - 1 and not free.compile_novel
    ran_ok = sum(n for (b, status), n in gated.per_backend.items() if b == "standin-ok" and status != "unsupported")
    free_ok = sum(n for (b, status), n in free.per_backend.items() if b == "standin-ok" and status != "unsupported")
    assert ran_ok > 0 and free_ok > 0


def test_the_compile_gate_holds_back_only_the_backend_over_its_own_budget():
    """Two JIT backends compiling side by side: the one whose own compile seconds pass the share
    is gated, the cheap one keeps opening new kernels."""
    from tests.fuzzer.planted_jit import CheapJitBackend, FakeClock, PlantedJitBackend

    clock = FakeClock()
    costly, cheap = PlantedJitBackend(), CheapJitBackend()
    costly.clock = clock  # each call moves the clock by a case's time plus its compile time
    config = WorkerConfig(
        backends=[(costly, "tests.fuzzer.planted_jit:PlantedJitBackend"),
                  (cheap, "tests.fuzzer.planted_jit:CheapJitBackend")],
        isolation="none", seed=5, max_cases=40, time_budget_s=None, shrink=False, replay_known=False, jit_share=0.2,
    )
    stats = Worker(config, MemorySink(), clock=clock).run()
    assert stats.compile_gated["planted-jit"] > 0
    assert "planted-jit-cheap" not in stats.compile_gated
    assert len(stats.kernel_keys["planted-jit-cheap"]) > len(stats.kernel_keys["planted-jit"])


def test_the_compile_gate_counts_every_jit_backend_together():
    """Two equally costly JIT backends, each within the whole allowance but together past it,
    are both held back (the budget is a share of the wall time, and a case waits for its slowest
    child); a cheap third one, under its fair part, is not (`CompileBudget.over_budget`)."""
    from tests.fuzzer.planted_jit import CheapJitBackend, PlantedJitBackend

    class OtherCostly(PlantedJitBackend):
        name = "planted-jit-other"

    backends = [(PlantedJitBackend(), "tests.fuzzer.planted_jit:PlantedJitBackend"),
                (OtherCostly(), "x:OtherCostly"), (CheapJitBackend(), "tests.fuzzer.planted_jit:CheapJitBackend")]
    config = WorkerConfig(backends=backends, isolation="none", shrink=False, jit_share=0.2)
    worker = Worker(config, MemorySink())
    worker.usable = [b for b, _ in backends]
    worker.stats.compile_by_backend.update({"planted-jit": 7.0, "planted-jit-other": 7.0, "planted-jit-cheap": 0.5})
    budget = worker.compile_budget
    assert budget.over_budget(10.0) == {"planted-jit", "planted-jit-other"}  # 14.5 > 10; fair part 3.3
    assert budget.over_budget(20.0) == set()  # together within the allowance
    assert budget.over_budget(None) == set()  # no budget


def test_with_lanes_the_compile_budget_is_each_lane_s_own(monkeypatch):
    """With lanes a compile holds up only its own environment: each lane's compile seconds are
    held against the whole allowance (two backends of one environment together), and a lane
    over it binds only its own backends' draws to templates (`CompileBudget.states`)."""
    from tests.fuzzer.planted_jit import CheapJitBackend, PlantedJitBackend

    class SameLane(PlantedJitBackend):  # the environment of planted-jit: one child, one lane
        name = "planted-jit-same-lane"

    class OwnLane(PlantedJitBackend):
        name = "planted-jit-own-lane"
        environment = "planted-jit-own-lane"

    backends = [(PlantedJitBackend(), "tests.fuzzer.planted_jit:PlantedJitBackend"), (SameLane(), "x:SameLane"),
                (OwnLane(), "x:OwnLane"), (CheapJitBackend(), "tests.fuzzer.planted_jit:CheapJitBackend")]
    config = WorkerConfig(backends=backends, isolation="none", shrink=False, jit_share=0.2)
    worker = Worker(config, MemorySink())
    worker.usable = [b for b, _ in backends]
    worker.stats.compile_by_backend.update(
        {"planted-jit": 6.0, "planted-jit-same-lane": 6.0, "planted-jit-own-lane": 9.0, "planted-jit-cheap": 0.5}
    )
    # without lanes: 21.5 s together past 10, each but the cheap one past its fair part (2.5)
    budget = worker.compile_budget
    assert budget.over_budget(10.0) == {"planted-jit", "planted-jit-same-lane", "planted-jit-own-lane"}
    monkeypatch.setattr(Worker, "lanes_on", property(lambda self: True))
    # with lanes: planted-jit's lane 12 s > 10; the own lane's 9 s and the cheap lane's 0.5 s are within
    assert budget.over_budget(10.0) == {"planted-jit", "planted-jit-same-lane"}
    assert budget.over_budget(None) == set()
    monkeypatch.setattr(CompileBudget, "allowance_s", lambda self: 10.0)
    assert budget.states() == {
        "planted-jit": "over", "planted-jit-same-lane": "over", "planted-jit-own-lane": "under", "planted-jit-cheap": "under",
    }
    monkeypatch.setattr(Worker, "lanes_on", property(lambda self: False))
    worker.stats.compile_s = 21.5
    assert set(budget.states().values()) == {"over"}  # without lanes: all JIT draws together
    monkeypatch.setattr(CompileBudget, "allowance_s", lambda self: None)
    assert budget.states() is None


@pytest.fixture
def blocked_gate(tmp_path, monkeypatch):
    """A gate directory for `tests.fuzzer.standins.GateBackend` with ``block-all`` in it: every
    call of the gate backend waits until the file is removed (a stuck kernel, a long compile)."""
    from tests.fuzzer.standins import GATE_DIR_ENV

    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv(GATE_DIR_ENV, str(gate))
    (gate / "block-all").write_text("")
    return gate


class UnblockWhen:
    """Reporter: removes the gate's ``block-all`` once ``when(stats)`` is true at a case."""

    def __init__(self, gate, when):
        self.gate, self.when = gate, when

    def __getattr__(self, name):
        return lambda *args, **kwargs: None

    def on_case(self, case, results, stats):
        if self.when(stats) and (self.gate / "block-all").exists():
            (self.gate / "block-all").unlink()


def test_lanes_let_fast_backends_go_on_while_a_slow_one_finishes_its_case_in_the_background(blocked_gate):
    """Lanes (``lanes="on"``): while the gate backend's child is stuck on the first case (a JIT
    compile, say), the worker goes on with new cases on the fast backend, leaves the busy one out
    of them (``stats.busy``: no result), and stores the stuck case's results once they come
    (``stats.late``), in the same run, each exactly once."""
    gate = blocked_gate
    backends = registry.select([], ["tests.fuzzer.standins:GateBackend", "tests.fuzzer.standins:CorrectBackend"])
    sink = MemorySink()
    handed = []  # every result the worker hands to the sink, a repeat included
    record_result = sink.record_result
    sink.record_result = lambda result, build_id, worker_id: handed.append(result) or record_result(result, build_id, worker_id)
    config = WorkerConfig(
        backends=backends, max_cases=8, time_budget_s=None, seed=3, isolation="process", shrink=False,
        replay_known=False, lanes="on", lane_grace_s=1.0, case_timeout_s=120.0,
    )
    stats = Worker(config, sink, reporter=UnblockWhen(gate, lambda stats: stats.cases >= 3)).run()
    first_case = (gate / "calls.log").read_text().split()[0]
    assert stats.cases == 8
    assert stats.busy["standin-gate"] >= 2 * 2, stats.busy  # cases 2 and 3, both variants, at least
    # the stuck case's two tasks finished late; on a loaded machine a later task may too (each
    # had a second of grace), so at least two, and none dropped
    assert stats.late["standin-gate"] >= 2 and not stats.late_dropped, (stats.late, stats.late_dropped)
    stored = [r for r in sink.results.values() if r.case_id == first_case]
    assert sorted((r.backend, r.variant) for r in stored if r.backend == "standin-gate") == [
        ("standin-gate", "buggy"), ("standin-gate", "native"),
    ]
    assert all(r.phase == "fuzz" and r.status in ("pass", "fail") for r in stored)
    gate_stored = [r for r in sink.results.values() if r.backend == "standin-gate"]
    gate_handed = [r for r in handed if r.backend == "standin-gate"]
    # every gate result counted reached the sink, and the sink holds each distinct one once; with
    # lanes a case Hypothesis draws again runs again (counted again, stored once), which a CI run
    # met: 6 counted, 4 stored
    assert len(gate_handed) == stats.per_backend[("standin-gate", "pass")] + stats.per_backend[("standin-gate", "fail")]
    assert {(r.case_id, r.variant) for r in gate_handed} == {(r.case_id, r.variant) for r in gate_stored}
    assert len(gate_stored) == len({(r.case_id, r.variant) for r in gate_stored})
    assert stats.runnable["standin-gate"] <= stats.cases - 2  # it sat out at least cases 2 and 3
    stored_ids = set(sink.cases)
    with_results = {r.case_id for r in sink.results.values()}
    assert stored_ids <= with_results, sorted(stored_ids - with_results)  # no case stored without a result


def test_with_lanes_a_busy_backend_is_left_out_of_the_chunk_s_targets(monkeypatch):
    """A backend whose environment is busy with an earlier case when a chunk starts would sit
    out every case drawn meanwhile: the chunk's plan draws for the free backends only (counted in
    ``stats.untargeted_busy``), for all of them when every one is busy, and lanes off changes
    nothing."""
    import fuzzer.loop.draws as draws_module

    backends = registry.select([], ["tests.fuzzer.standins:GateBackend", "tests.fuzzer.standins:CorrectBackend"])
    worker = Worker(WorkerConfig(backends=backends, isolation="none", shrink=False), MemorySink())
    worker.usable = [b for b, _ in backends]
    planned = []
    real_plan = draws_module.target_plan
    monkeypatch.setattr(draws_module, "target_plan", lambda names, *a: planned.append(list(names)) or real_plan(names, *a))
    busy = ["standin-gate"]

    class Executor:
        def busy_environments(self):
            return list(busy)

    monkeypatch.setattr(Worker, "_executor", property(lambda self: Executor()))
    worker.strategy(0)  # lanes off (CPU, in process): every backend is a target
    assert planned[-1] == ["standin-gate", "standin-ok"] and not worker.stats.untargeted_busy
    monkeypatch.setattr(Worker, "lanes_on", property(lambda self: True))
    worker.strategy(1)
    assert planned[-1] == ["standin-ok"] and worker.stats.untargeted_busy == {"standin-gate": 1}
    busy.append(worker.backends["standin-ok"].environment)  # every backend busy: draw for all, as without lanes
    worker.strategy(2)
    assert planned[-1] == ["standin-gate", "standin-ok"] and worker.stats.untargeted_busy == {"standin-gate": 1}


def test_lanes_are_off_by_default_on_the_cpu_and_on_for_cuda_children():
    backends = registry.select([], ["tests.fuzzer.standins:CorrectBackend"])
    assert not Worker(WorkerConfig(backends=backends), MemorySink()).lanes_on
    assert Worker(WorkerConfig(backends=backends, device="cuda"), MemorySink()).lanes_on
    assert not Worker(WorkerConfig(backends=backends, device="cuda", isolation="none"), MemorySink()).lanes_on
    with pytest.raises(WorkerError, match="lanes: unknown value 'sometimes'"):
        WorkerConfig(backends=backends, lanes="sometimes")
    with pytest.raises(WorkerError, match="lane_grace_s"):
        WorkerConfig(backends=backends, lane_grace_s=-1)
    with pytest.raises(WorkerError, match="lane_grace_s: must be a finite number"):
        WorkerConfig(backends=backends, lane_grace_s=float("inf"))
    assert not Worker(WorkerConfig(backends=backends, lanes="on", isolation="none"), MemorySink()).lanes_on


def test_lanes_stop_a_background_part_still_running_at_the_end_and_store_nothing_of_it(blocked_gate):
    """A backend stuck past the run's end (``late_drain_s``): its background part is counted in
    ``late_dropped``, nothing of it is stored, the worker stops (its child killed) instead of
    waiting for it, and the fast backend's results of every case are stored. The seconds waited
    for it count as waiting for the children, not as attnfuzz's own work."""
    # block-all is never lifted: the gate's first call outlives the run
    backends = registry.select([], ["tests.fuzzer.standins:GateBackend", "tests.fuzzer.standins:CorrectBackend"])
    sink = MemorySink()
    config = WorkerConfig(
        backends=backends, max_cases=3, time_budget_s=None, seed=3, isolation="process", shrink=False,
        replay_known=False, lanes="on", lane_grace_s=0.5, late_drain_s=0.5, case_timeout_s=120.0,
    )
    stats = Worker(config, sink).run()
    assert stats.cases == 3
    assert stats.late_dropped["standin-gate"] == 2, stats.late_dropped  # the first case's two variants
    # the end's wait for the stuck part (late_drain_s) is waiting for a backend, not own work
    assert stats.wait_s >= 2 * 0.5 - 0.05, stats.wait_s  # the first case's grace and the drain, each at least 0.5 s
    assert not [r for r in sink.results.values() if r.backend == "standin-gate"]
    ok_stored = len([r for r in sink.results.values() if r.backend == "standin-ok"])
    assert 0 < ok_stored <= stats.per_backend[("standin-ok", "pass")] + stats.per_backend[("standin-ok", "fail")]  # a case drawn twice is stored once


def test_lanes_store_no_case_that_ran_nowhere(blocked_gate):
    """Lanes with one backend, stuck on its first case: the cases drawn meanwhile run nowhere; they
    are counted in ``stats.all_busy``, not in ``stats.cases``, and not stored (a new-user trial found
    such cases stored without a single result)."""
    backends = registry.select([], ["tests.fuzzer.standins:GateBackend"])
    sink = MemorySink()
    config = WorkerConfig(
        backends=backends, max_cases=3, time_budget_s=None, seed=5, isolation="process", shrink=False,
        replay_known=False, lanes="on", lane_grace_s=0.2, case_timeout_s=120.0,
    )
    stats = Worker(config, sink, reporter=UnblockWhen(blocked_gate, lambda stats: stats.all_busy >= 3)).run()
    assert stats.cases == 3 and stats.all_busy >= 3, (stats.cases, stats.all_busy)
    with_results = {r.case_id for r in sink.results.values()}
    assert set(sink.cases) == with_results, sorted(set(sink.cases) - with_results)


def test_a_fuzz_case_drawn_again_reuses_its_first_run_and_stores_nothing_more(monkeypatch):
    """The repeat memo (`fuzzer.loop.repeats.RepeatMemo`): the second evaluation of the same fuzz case
    runs no kernel, returns the same verdicts and figures, counts as a case and writes nothing."""
    from fuzzer.backends.sdpa import SDPABackend

    calls = []
    real_run = SDPABackend.run
    monkeypatch.setattr(SDPABackend, "run", lambda self, case, inputs, variant: calls.append(variant) or real_run(self, case, inputs, variant))
    sink = MemorySink()
    writes = []
    real_record = sink.record_case_results
    monkeypatch.setattr(sink, "record_case_results", lambda *a, **k: writes.append(a[0]) or real_record(*a, **k))
    case = AttentionCase(seqlen_q=5, seqlen_k=7, causal=True, dtype="bfloat16", backward=True)
    with Worker(WorkerConfig(backends=registry.select(["torch-cpu-math"]), isolation="none", shrink=False), sink) as worker:
        first = worker.evaluate(case)
        ran = len(calls)
        again = worker.evaluate(AttentionCase.from_json(case.to_json()))  # an equal case, another object
        other = worker.evaluate(case, phase="shrink", record=False)  # other phases always run
    assert ran > 0 and len(calls) == 2 * ran, calls
    assert [(r.backend, r.variant, r.status, r.metrics, r.error_ratio) for r in again] == [
        (r.backend, r.variant, r.status, r.metrics, r.error_ratio) for r in first
    ]
    assert [r.metrics for r in other] == [r.metrics for r in first]
    assert len(writes) == 1 and worker.stats.cases == 1 and worker.stats.repeated == 1  # a repeat is no case run
    assert sum(worker.stats.results.values()) == 2 * len(first)  # the two evaluations made count their statuses


def test_a_fuzz_case_with_an_error_result_is_run_again(monkeypatch):
    from fuzzer.backends.sdpa import SDPABackend

    calls = []

    def failing(self, case, inputs, variant):
        calls.append(variant)
        raise RuntimeError("planted")

    monkeypatch.setattr(SDPABackend, "run", failing)
    case = AttentionCase(seqlen_q=3, seqlen_k=3, dtype="float32")
    with Worker(WorkerConfig(backends=registry.select(["torch-cpu-math"]), isolation="none", shrink=False), MemorySink()) as worker:
        first = worker.evaluate(case)
        worker.evaluate(case)
    assert first and all(r.status == "error" for r in first)
    assert len(calls) == 2 * len(first) and worker.stats.repeated == 0


def test_a_worker_stops_at_ends_at_before_its_time_budget_is_spent(planted_plugin) -> None:
    """``ends_at_s`` (what ``attnfuzz fuzz`` sets to its start plus ``--time-budget``, so the
    start-up counts) stops the fuzzing at that instant even with most of ``time_budget_s`` left;
    an instant already past runs no case; a bad value names the field."""
    import math
    import time

    from fuzzer.worker import WorkerError

    def run(ends_at_s: float) -> tuple:
        config = WorkerConfig(backends=registry.select([planted_plugin]), time_budget_s=600.0, ends_at_s=ends_at_s,
                              shrink=False, replay_known=False, isolation="none", seed=3)
        t0 = time.monotonic()
        stats = Worker(config, MemorySink()).run()
        return stats, time.monotonic() - t0

    stats, took = run(time.monotonic() + 2.0)
    assert stats.cases >= 1 and took < 60, (stats.cases, took)  # 600 s of budget: only the instant stopped it
    past, _ = run(time.monotonic() - 1.0)
    assert past.cases == 0
    for bad in (math.nan, math.inf, "soon", True):
        with pytest.raises(WorkerError, match="ends_at_s"):
            WorkerConfig(backends=registry.select([planted_plugin]), ends_at_s=bad)


# ---------------------------------------------------------------- background judging
def test_background_judging_finds_and_shrinks_the_planted_bug_and_stores_every_result_once(planted_plugin, monkeypatch):
    """``judge="background"``: the planted window bug is found on the judge thread's verdicts and
    shrunk as inline; every case is stored with each of its results once (no result lost or
    written twice), and the worker waits for every judgement before it stops; at most
    `MAX_PENDING_JUDGEMENTS` judgements wait at a time."""
    from fuzzer.loop import background

    monkeypatch.setattr(background, "MAX_PENDING_JUDGEMENTS", 1)
    waiting = []
    real_add = background.Background.add_pending

    def add_pending(self, pending, counted):
        real_add(self, pending, counted)
        waiting.append(sum(1 for p in self.pending if not p.done()))

    monkeypatch.setattr(background.Background, "add_pending", add_pending)
    written = []

    class WritingSink(MemorySink):
        def record_result(self, result, build_id, worker_id):
            written.append((result.case_id, result.backend, result.variant, result.phase, result.status))
            return super().record_result(result, build_id, worker_id)

    sink = WritingSink()
    config = WorkerConfig(
        backends=registry.select([planted_plugin]), max_cases=40, time_budget_s=None, seed=1,
        shrink_deadline_s=60, max_batch_size=3, max_heads_kv=3, isolation="none", judge="background",
    )
    worker = Worker(config, sink)
    assert worker.judge_in_background
    stats = worker.run()
    key = ("planted-fa4", "te_window", "out:all_zero")
    assert key in sink.buckets, f"buckets found: {sorted(sink.buckets)}"
    assert sink.buckets[key].minimised_case is not None
    assert waiting and max(waiting) <= 1
    assert stats.judged_background > 0 and stats.judge_background_s > 0
    assert worker.background.pending == [] and not stats.late_dropped
    fuzz = [w for w in written if w[3] == "fuzz"]
    assert len({w[:3] for w in fuzz}) == len(fuzz)  # no result written twice
    # every verdict of a fuzz case came from the judge thread, and each one judged there was written
    assert sum(1 for w in fuzz if w[4] in ("pass", "fail")) == stats.judged_background
    fuzz_cases = {c for c, row in sink.cases.items() if row.get("origin") == "fuzz"}
    assert fuzz_cases and {w[0] for w in fuzz} == fuzz_cases  # every fuzz case stored has its results


def test_the_judge_mode_is_background_with_lanes_by_default_and_bad_values_are_refused():
    backends = registry.select([], ["tests.fuzzer.standins:CorrectBackend"])
    assert not Worker(WorkerConfig(backends=backends), MemorySink()).judge_in_background  # CPU: inline
    assert Worker(WorkerConfig(backends=backends, device="cuda"), MemorySink()).judge_in_background  # lanes on
    assert not Worker(WorkerConfig(backends=backends, device="cuda", judge="inline"), MemorySink()).judge_in_background
    assert Worker(WorkerConfig(backends=backends, judge="background"), MemorySink()).judge_in_background
    with pytest.raises(WorkerError, match="judge: unknown value 'later' \\(allowed: auto, background, inline\\)"):
        WorkerConfig(backends=backends, judge="later")


class _SlowStoreSink(MemorySink):
    """A `MemorySink` whose case writes each take ``delay_s`` more (a slow database)."""

    delay_s = 0.03

    def record_case_results(self, *args, **kwargs):
        import time

        time.sleep(self.delay_s)
        return super().record_case_results(*args, **kwargs)


def test_the_own_work_is_split_into_measured_parts_and_a_slow_store_shows_as_storing():
    """`WorkerStats.own_parts`: a sink that takes 30 ms a case write shows as ``storing`` (at
    least 30 ms per case stored), not as ``other``; every part is at least 0, the parts with
    inputs and comparison stay within the own work, and the summary's JSON lists each part of
    `OWN_PARTS` and ``other``."""
    from fuzzer.worker import OWN_PARTS
    from service.cli.fuzz_display import summary_data

    backends = registry.select([], ["tests.fuzzer.standins:CorrectBackend"])
    config = WorkerConfig(backends=backends, max_cases=12, time_budget_s=None, seed=3, isolation="none", shrink=False)
    sink = _SlowStoreSink()
    stats = Worker(config, sink).run()

    assert stats.cases == 12
    assert set(stats.own_parts) <= set(OWN_PARTS)
    assert stats.own_parts["storing"] >= 12 * _SlowStoreSink.delay_s
    assert stats.own_parts["drawing"] > 0 and stats.own_parts["running"] >= 0
    assert stats.own_other_s < stats.own_parts["storing"], stats.own_split
    measured = stats.inputs_s + stats.judge_s + sum(stats.own_parts.values())
    assert measured <= stats.own_s + 0.05, (measured, stats.own_s)
    split = summary_data(stats, "memory://")["time_s"]["own_parts"]
    assert list(split) == [*OWN_PARTS, "other"]
    assert split["storing"] == stats.own_parts["storing"] and split["other"] == stats.own_other_s


class _CtrlCSink(MemorySink):
    """A `MemorySink` whose third case write meets a Ctrl-C (after storing it)."""

    def record_case_results(self, *args, **kwargs):
        updates = super().record_case_results(*args, **kwargs)
        if len(self.cases) == 3:
            raise KeyboardInterrupt
        return updates


def test_a_worker_stopped_by_ctrl_c_ends_stopped_not_failed_and_one_that_raises_ends_failed():
    """Ctrl-C is a stop the user asked for: the worker's last heartbeat says ``stopped`` (a new
    user's trial found every interrupted worker row ``failed``) and the interrupt goes on to the
    caller; any other error still ends ``failed``."""
    backends = registry.select([], ["tests.fuzzer.standins:CorrectBackend"])
    config = WorkerConfig(backends=backends, max_cases=12, time_budget_s=None, seed=3, isolation="none", shrink=False)
    sink = _CtrlCSink()
    with pytest.raises(KeyboardInterrupt):
        Worker(config, sink).run()
    assert [w["status"] for w in sink.workers.values()] == ["stopped"]

    class _BrokenSink(MemorySink):
        def record_case_results(self, *args, **kwargs):
            raise RuntimeError("the store broke")

    broken = _BrokenSink()
    with pytest.raises(RuntimeError, match="the store broke"):
        Worker(config, broken).run()
    assert [w["status"] for w in broken.workers.values()] == ["failed"]


class _SwallowedCtrlCSink(MemorySink):
    """A `MemorySink` in whose third case write a Ctrl-C (or ``signum``) arrives and its
    `KeyboardInterrupt` is swallowed, as Python does to one raised in a garbage-collector callback
    (Hypothesis's)."""

    def __init__(self, signum: int | None = None):
        import signal

        super().__init__()
        self.signum = signal.SIGINT if signum is None else signum

    def record_case_results(self, *args, **kwargs):
        import signal

        updates = super().record_case_results(*args, **kwargs)
        if len(self.cases) == 3:
            try:  # in this thread: its handler runs before raise_signal returns (os.kill's may run later)
                signal.raise_signal(self.signum)
            except KeyboardInterrupt:
                pass  # lost here, as in a gc callback
        return updates


def test_a_ctrl_c_whose_interrupt_was_swallowed_still_stops_the_worker_at_the_next_case():
    """CI (2026-12-03): a Ctrl-C's `KeyboardInterrupt` raised inside Hypothesis's gc callback was
    printed as "Exception ignored" and lost, and the run went on to its budget. The worker remembers
    the Ctrl-C and raises it again at its next case; its row ends ``stopped``; the SIGINT handler
    it put in place is taken away again."""
    import signal

    backends = registry.select([], ["tests.fuzzer.standins:CorrectBackend"])
    config = WorkerConfig(backends=backends, max_cases=12, time_budget_s=None, seed=3, isolation="none", shrink=False)
    sink = _SwallowedCtrlCSink()
    started_with = signal.signal(signal.SIGINT, signal.default_int_handler)  # a background run starts with it ignored
    try:
        with pytest.raises(KeyboardInterrupt):
            Worker(config, sink).run()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, started_with)
    assert len(sink.cases) == 3  # no case after the swallowed Ctrl-C
    assert [w["status"] for w in sink.workers.values()] == ["stopped"]


def test_a_sigterm_made_a_stop_stops_the_worker_as_ctrl_c_does_and_a_repeat_is_held():
    """Where the command made SIGTERM a stop (`fuzzer.results.stop_on_signals`, as a worker
    process does: ``once``), a SIGTERM stops the worker as Ctrl-C does, also when its
    `KeyboardInterrupt` was swallowed: no case after it, its row ``stopped``, exit code 143; a
    second SIGTERM while it stops raises nothing; the handlers are given back. Before, SIGTERM
    ended the process at once (Python's default), its row left ``running``."""
    import signal

    from fuzzer.results import raise_stop, stop_exit_code, stop_on_signals

    backends = registry.select([], ["tests.fuzzer.standins:CorrectBackend"])
    config = WorkerConfig(backends=backends, max_cases=12, time_budget_s=None, seed=3, isolation="none", shrink=False)
    sink = _SwallowedCtrlCSink(signal.SIGTERM)
    restore = stop_on_signals(once=True)
    try:
        with pytest.raises(KeyboardInterrupt):
            Worker(config, sink).run()
        assert signal.getsignal(signal.SIGTERM) is raise_stop  # the worker's own handler is taken away
        signal.raise_signal(signal.SIGTERM)  # a repeat (the command forwarding the same stop): held
        assert stop_exit_code() == 128 + signal.SIGTERM
    finally:
        restore()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert len(sink.cases) == 3  # no case after the swallowed stop
    assert [w["status"] for w in sink.workers.values()] == ["stopped"]


def test_a_derandomising_hypothesis_profile_does_not_make_every_chunk_draw_the_same_cases():
    """With ``$CI`` set, Hypothesis loads its "ci" profile (``derandomize=True``); a worker took it
    up and every chunk of every worker drew the same cases (a 300 s two-worker run stored 40
    results, all from its first chunk; CI, 2026-12-03). Two chunks of one worker and two workers
    without ``--seed`` must draw different cases under such a profile."""
    from hypothesis import settings
    from hypothesis._settings import local_settings

    def cases_drawn(chunks: int) -> list[str]:
        sink = MemorySink()
        config = WorkerConfig(
            backends=registry.select(["torch-cpu-math"]), max_cases=10 * chunks, chunk_size=10, time_budget_s=30,
            isolation="none", shrink=False, replay_known=False, max_seqlen=8,
        )
        Worker(config, sink).run()
        return list(sink.cases)

    with local_settings(settings(derandomize=True, database=None)):
        assert settings.default.derandomize  # the profile a CI machine loads is in force
        first, second = cases_drawn(2), cases_drawn(1)
    assert len(first) >= 15, f"two chunks stored {len(first)} distinct cases: the second drew the first's"
    assert len(set(first[:10]) & set(second)) < 5, "a second worker drew the first worker's cases"


class _RefusingSink(MemorySink):
    """A sink that refuses the build, as the service does a wrong writer token (401)."""

    def register_build(self, fingerprint):  # noqa: ANN001
        from fuzzer.results import SinkFatalError

        raise SinkFatalError("POST /api/builds: the service answered 401 (missing or wrong bearer token)")


def test_a_refused_build_stops_the_children_the_worker_started():
    """A new-user trial: ``fuzz --server`` with a wrong writer token printed the 401 and never
    exited: the children started before the build was registered were left running, and the
    interpreter's exit waited on them forever."""
    import multiprocessing

    from fuzzer.results import SinkFatalError

    backends = registry.select(["torch-cpu-math"])
    worker = Worker(WorkerConfig(backends=backends, isolation="process", shrink=False, max_cases=1), _RefusingSink())
    with pytest.raises(SinkFatalError, match="401"):
        worker.run()
    assert worker.evaluator is None
    assert [p for p in multiprocessing.active_children() if p.is_alive()] == []
