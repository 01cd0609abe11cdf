"""Shrinking once per root cause (issue 14 item 4): one minimisation for one failure seen through
several variants and signatures, the others re-checked on the minimised case and attached; the
error-ratio margin; the share of wall time spent shrinking, counted with a fake clock."""

from __future__ import annotations

import pytest

from fuzzer import registry
from fuzzer.results import BuildFingerprint, CaseResult
from fuzzer.sinks import MemorySink
from fuzzer.loop.compile_budget import is_compile_failure
from fuzzer.worker import Worker, WorkerConfig, WorkerError
from oracle.config import AttentionCase
from tests.fuzzer.standins import WIDE_CAPS, _Base

ME = "tests.fuzzer.test_root_causes"


class RootCauseBackend(_Base):
    """One planted defect seen three ways: on causal cases with ``seqlen_k >= 2`` variants ``a``
    and ``b`` return all zeros (``out:all_zero``) and variant ``c`` three times the right output
    (``out:mismatch``, far past the tolerance). Correct elsewhere."""

    name = "planted-rootcause"
    environment = "planted-rootcause"
    capabilities = WIDE_CAPS
    variants = ("a", "b", "c")

    def run(self, case, inputs, variant):
        output = self._call(case, inputs, *self._bounds(case))
        if case.causal and case.seqlen_k >= 2:
            if variant == "c":
                output.out.mul_(3.0)
            else:
                output.out.zero_()
        return output


class EdgeBackend(_Base):
    """Wrong by a factor that shrinks with the case: ``out`` scaled by ``1 + 0.002 * seqlen_k`` on
    causal cases (in bfloat16 an error ratio of about ``0.15 * seqlen_k``), so large cases fail
    clearly and the smallest failing ones sit just past the tolerance: the shape of Hypothesis's
    threshold problem."""

    name = "planted-edge"
    environment = "planted-edge"
    capabilities = WIDE_CAPS
    variants = ("native",)

    def run(self, case, inputs, variant):
        output = self._call(case, inputs, *self._bounds(case))
        if case.causal:
            output.out.mul_(1.0 + 0.002 * case.seqlen_k)
        return output


class FakeClock:
    """Seconds that pass only when a backend runs: one per call (`TickingBackend`)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


CLOCK = FakeClock()


class TickingBackend(_Base):
    """Each call costs one second of `CLOCK`. Wrong in several unrelated ways, each a bucket of
    its own that wants shrinking: all zeros on causal cases, NaN with a left window, three times
    the output when ``seqlen_q`` is odd."""

    name = "planted-ticking"
    environment = "planted-ticking"
    capabilities = WIDE_CAPS
    variants = ("native",)

    def run(self, case, inputs, variant):
        CLOCK.t += 1.0
        output = self._call(case, inputs, *self._bounds(case))
        if case.causal:
            output.out.zero_()
        elif case.window_size_left is not None:
            output.out.fill_(float("nan"))
        elif case.seqlen_q % 2:
            output.out.mul_(3.0)
        return output


CASE = AttentionCase(
    batch_size=2, seqlen_q=7, seqlen_k=9, num_heads=2, num_heads_kv=1, head_dim=16, dtype="float32", causal=True
)


def _shrink_only(backend: str, **kw) -> WorkerConfig:
    settings = dict(max_cases=0, time_budget_s=None, isolation="none", shrink_deadline_s=60, replay_known=False)
    settings.update(kw)
    return WorkerConfig(backends=registry.select([], [f"{ME}:{backend}"]), **settings)


def test_one_failure_through_three_variants_and_two_signatures_is_shrunk_once_and_grouped():
    sink = MemorySink()
    config = _shrink_only("RootCauseBackend")
    with Worker(config, sink) as worker:
        results = {r.variant: r.signature for r in worker.evaluate(CASE)}
    assert results == {"a": "out:all_zero", "b": "out:all_zero", "c": "out:mismatch"}

    stats = Worker(config, sink).run()

    assert [key for key, _ in stats.minimised] == [("planted-rootcause", "a", "out:all_zero")], "one shrink"
    buckets = {key[1:]: b for key, b in sink.buckets.items()}
    assert set(buckets) == {("a", "out:all_zero"), ("b", "out:all_zero"), ("c", "out:mismatch")}
    minimal = AttentionCase.from_json(buckets["a", "out:all_zero"].minimised_case)
    assert minimal.causal and (minimal.batch_size, minimal.num_heads, minimal.seqlen_k) == (1, 1, 2), minimal.describe()
    for key in (("b", "out:all_zero"), ("c", "out:mismatch")):
        bucket = buckets[key]
        assert bucket.minimised_case == buckets["a", "out:all_zero"].minimised_case, key
        assert bucket.note.startswith("attached"), bucket.note
        assert bucket.owner is None
    # one root cause, two symptoms
    assert len({b.defect_id for b in buckets.values()}) == 1 and buckets["a", "out:all_zero"].defect_id is not None
    assert sink.defects == {("planted-rootcause", minimal.case_id): buckets["a", "out:all_zero"].defect_id}
    assert sorted(bucket_id for _, bucket_id in stats.attached) == sorted(
        buckets[k].bucket_id for k in (("b", "out:all_zero"), ("c", "out:mismatch"))
    )
    # the re-check on the minimised case is stored (phase confirm), one result per variant
    confirm = {r.variant: r.signature for r in sink.results.values() if r.phase == "confirm"}
    assert confirm == {"a": "out:all_zero", "b": "out:all_zero", "c": "out:mismatch"}
    assert all(b.severity == "wrong" for b in buckets.values())


def test_siblings_that_do_not_fail_on_the_minimised_case_go_back_to_the_queue():
    """A sibling (same backend, signature and first case) whose variant passes on the minimised
    case is not attached: its lease ends and it is shrunk on its own."""
    sink = MemorySink()
    build_id = sink.register_build(BuildFingerprint())
    case_json = CASE.to_json()
    sink.record_case(case_json, "fuzz")
    # "a" really fails there; "native" is correct there, so on the minimised case it passes
    for variant in ("a", "native"):
        sink.record_result(CaseResult(CASE.case_id, "planted-rootcause", variant, "fail", signature="out:all_zero"), build_id, None)
    worker_id = sink.register_worker(build_id, "h", 1, "cpu")
    claim = sink.claim_minimisation(worker_id, ["planted-rootcause"], 60.0)
    assert [key for _, key in claim.siblings] == [("planted-rootcause", "native", "out:all_zero")]
    native = sink.buckets["planted-rootcause", "native", "out:all_zero"]
    assert native.owner == worker_id
    attached = sink.record_minimised(claim.bucket_id, case_json, CASE.case_id, "minimised: test", worker_id=worker_id, attach=[])
    assert attached == [] and native.owner is None and native.minimised_case is None
    assert sink.claim_minimisation(worker_id + 1, ["planted-rootcause"], 60.0).bucket_id == native.bucket_id


def test_the_error_ratio_margin_keeps_the_minimised_case_off_the_edge_of_the_tolerance():
    big = AttentionCase(batch_size=2, seqlen_q=40, seqlen_k=60, num_heads=2, head_dim=16, dtype="bfloat16", causal=True)
    found = {}
    for margin in (1.0, 2.0):
        sink = MemorySink()
        config = _shrink_only("EdgeBackend", shrink_error_margin=margin)
        with Worker(config, sink) as worker:
            (first,) = worker.evaluate(big)
        assert first.signature == "out:mismatch" and first.error_ratio > 4.0, first.error_ratio
        Worker(config, sink).run()
        minimal = AttentionCase.from_json(sink.buckets["planted-edge", "native", "out:mismatch"].minimised_case)
        with Worker(config, MemorySink()) as worker:
            (again,) = worker.evaluate(minimal, record=False)
        found[margin] = (minimal, again.error_ratio)
    edge_ratio, kept_ratio = found[1.0][1], found[2.0][1]
    assert 1.0 < edge_ratio < 2.0, found  # without a margin the shrinker stops at the edge
    assert kept_ratio >= 2.0, found  # with it the minimised case fails at least 2x the tolerance
    assert found[2.0][0].seqlen_k > found[1.0][0].seqlen_k


def test_shrinking_takes_at_most_its_share_of_wall_time_counted_in_backend_calls():
    """Every backend call is one second of a fake clock; fuzzing and shrinking are both calls.
    With the default share (25%) shrinking stays within a quarter of the wall time of a run that
    ends on its time budget, up to one minimisation's overrun (its confirmations and re-checks: at
    most 6 calls); without a bound it takes most of it."""
    backends = registry.select([], [f"{ME}:TickingBackend"])
    shares = {}
    for share in (0.25, 1.0):
        CLOCK.t = 0.0
        config = WorkerConfig(
            backends=backends, max_cases=None, time_budget_s=40.0, seed=3, isolation="none", chunk_size=5,
            shrink_share=share, shrink_deadline_s=40.0, shrink_min_s=5.0, replay_known=False, allow_backward=False,
        )
        stats = Worker(config, MemorySink(), clock=CLOCK).run()
        assert stats.wall_s == CLOCK.t > 0
        assert stats.minimised, "something was shrunk"
        shares[share] = stats
    bounded, unbounded = shares[0.25], shares[1.0]
    assert bounded.shrink_s <= 0.25 * bounded.wall_s + 6.0, (bounded.shrink_s, bounded.wall_s)
    assert unbounded.shrink_s > 0.4 * unbounded.wall_s, (unbounded.shrink_s, unbounded.wall_s)
    # the bound held something back: a bucket waits for the next worker (or more fuzzing)
    assert len(bounded.minimised) < len(unbounded.minimised), (bounded.minimised, unbounded.minimised)
    assert len(unbounded.new_buckets) >= 2, unbounded.new_buckets


def test_shrink_settings_are_checked():
    backends = registry.select([], [f"{ME}:RootCauseBackend"])
    with pytest.raises(WorkerError, match="shrink_share"):
        WorkerConfig(backends=backends, shrink_share=0.0)
    with pytest.raises(WorkerError, match="shrink_error_margin"):
        WorkerConfig(backends=backends, shrink_error_margin=0.5)


def test_an_attach_spooled_while_the_database_is_away_is_applied_when_it_is_back(tmp_path):
    """`SpoolingSink.record_minimised` keeps ``worker_id`` and ``attach`` in the spooled entry."""
    from fuzzer.results import SinkUnavailableError
    from fuzzer.spool import Spool, SpoolingSink

    class Away(MemorySink):
        down = False

        def record_minimised(self, *args, **kwargs):
            if self.down:
                raise SinkUnavailableError("database unavailable: connection refused")
            return super().record_minimised(*args, **kwargs)

    inner = Away()
    build_id = inner.register_build(BuildFingerprint())
    inner.record_case(CASE.to_json(), "fuzz")
    for variant in ("a", "b"):
        inner.record_result(CaseResult(CASE.case_id, "planted-rootcause", variant, "fail", signature="out:all_zero"), build_id, None)
    worker_id = inner.register_worker(build_id, "h", 1, "cpu")
    claim = inner.claim_minimisation(worker_id, ["planted-rootcause"], 60.0)
    sink = SpoolingSink(inner, Spool(tmp_path / "slot-0"), sleep=lambda s: None, log=lambda line: None)
    inner.down = True
    spooled = sink.record_minimised(
        claim.bucket_id, CASE.to_json(), CASE.case_id, "minimised: t", worker_id=worker_id, attach=[("b", "out:all_zero")]
    )
    assert spooled is None and sink.pending == 1
    inner.down = False
    assert sink.flush()
    b = inner.buckets["planted-rootcause", "b", "out:all_zero"]
    assert b.minimised_case == CASE.to_json() and b.note.startswith("attached") and b.owner is None


@pytest.mark.parametrize("store", ["memory", "sql"])
def test_a_sibling_claim_does_not_count_as_an_attempt_of_its_own_shrink(store, tmp_path):
    """Claimed with its group three times and never reproduced by their minimised cases, a
    sibling is still claimable on its own: only its own shrinks count toward max_attempts (it was
    left "abandoned ... its worker died" after a new user's three short runs, no worker dying)."""
    if store == "memory":
        sink = MemorySink()
    else:
        from service.db import migrations
        from service.db.engine import make_engine
        from service.db.store import SqlStore

        url = f"sqlite:///{tmp_path / 'siblings.db'}"
        migrations.upgrade(url)
        sink = SqlStore(make_engine(url))
    build_id = sink.register_build(BuildFingerprint())
    cases = [CASE.replace(seed=s) for s in (1, 2, 3)]
    for case in cases:  # three buckets of one backend; "native" fails the same way on each first case
        sink.record_case(case.to_json(), "fuzz")
    signatures = ("out:all_zero", "out:mismatch", "lse:neginf")
    for case, signature in zip(cases, signatures):
        for variant in ("a", "native"):
            sink.record_result(CaseResult(case.case_id, "planted-rootcause", variant, "fail", signature=signature), build_id, None)
    worker_id = sink.register_worker(build_id, "h", 1, "cpu")
    for _ in range(3):
        claim = sink.claim_minimisation(worker_id, ["planted-rootcause"], 60.0, 3)
        assert claim is not None
        sink.release_minimisation(claim.bucket_id, worker_id, "unchanged: test")
    # the first bucket used its three attempts; its sibling, claimed with it each time, is next
    claim = sink.claim_minimisation(worker_id, ["planted-rootcause"], 60.0, 3)
    assert claim is not None and claim.key == ("planted-rootcause", "native", "out:all_zero"), claim
    assert claim.attempt == 1


def test_a_minimisation_that_ran_past_its_slice_shortens_the_next_slices():
    """`Shrinker.slice_s` leaves room for the last overrun (a predicate call past the
    deadline, the re-checks): with 100 s of wall, 15 s shrunk and a 25% share (aimed at 25% less
    the margin, f = 20%) the room is (20 - 15) / 0.8 = 6.25 s; after a 3 s overrun it
    is 3.25 s, after a 9 s one below 0, under ``shrink_min_s``: none starts."""
    from fuzzer.loop.shrinker import SHRINK_SHARE_MARGIN

    assert SHRINK_SHARE_MARGIN == 0.20
    f = 0.25 * 0.80
    backends = registry.select([], [f"{ME}:TickingBackend"])
    config = WorkerConfig(backends=backends, max_cases=None, time_budget_s=1000.0, isolation="none",
                          shrink_share=0.25, shrink_deadline_s=40.0, shrink_min_s=1.0)
    CLOCK.t = 100.0
    worker = Worker(config, MemorySink(), clock=CLOCK)
    worker._started = 0.0
    shrinker = worker.shrinker
    worker.stats.shrink_s = 15.0
    assert shrinker.slice_s() == pytest.approx((100 * f - 15) / (1 - f))
    shrinker.overrun_s = 3.0
    assert shrinker.slice_s() == pytest.approx((100 * f - 15) / (1 - f) - 3.0)
    shrinker.overrun_s = 9.0
    assert shrinker.slice_s() is None
    worker.stats.shrink_s = 20.6  # within 25% but past the aim: none starts
    shrinker.overrun_s = 0.0
    assert shrinker.slice_s() is None


class InductorError(RuntimeError):
    """Named like torch's compile failure (`fuzzer.executor.COMPILE_ERROR_TYPES`)."""


class FailingBuildBackend(_Base):
    """A JIT backend whose kernel for causal cases never builds: each such call raises
    ``InductorError`` (counted in ``calls``); correct elsewhere."""

    name = "planted-failing-build"
    environment = "planted-failing-build"
    capabilities = WIDE_CAPS
    variants = ("native",)
    jit_compiled = True
    calls = 0

    def kernel_key(self, case, variant):
        return (case.dtype, case.head_dim, case.causal)

    def run(self, case, inputs, variant):
        if case.causal:
            type(self).calls += 1
            raise InductorError("No valid triton configs (planted)")
        return self._call(case, inputs, *self._bounds(case))


def test_a_jit_backend_s_compile_failure_is_kept_unshrunk():
    """An ``error:InductorError`` of a JIT backend is stored with its first case as the minimised
    case (status ``unchanged``, the note saying why) without one more call of the backend: every
    shrink step would build the failing kernel again. A failure of another kind is shrunk."""
    sink = MemorySink()
    config = _shrink_only("FailingBuildBackend")
    with Worker(config, sink) as worker:
        (result,) = worker.evaluate(CASE)
    assert result.signature == "error:InductorError", result
    calls = FailingBuildBackend.calls

    stats = Worker(config, sink).run()

    (key, outcome), = stats.minimised
    assert key == ("planted-failing-build", "native", "error:InductorError")
    assert outcome.status == "unchanged" and outcome.attempts == 0 and outcome.case == CASE
    assert FailingBuildBackend.calls == calls, "no shrink step ran the backend"
    (bucket,) = sink.buckets.values()
    assert bucket.minimised_case == CASE.to_json()
    assert bucket.note.startswith("unchanged: not shrunk: a JIT backend's compile failure"), bucket.note
    # the same error from a backend that compiles nothing is shrunk as usual
    worker = Worker(_shrink_only("RootCauseBackend"), MemorySink())
    assert not is_compile_failure(worker.backends.get("planted-rootcause"), "error:InductorError")
    assert not is_compile_failure(worker.backends.get("planted-failing-build"), "error:ValueError")


def test_the_seconds_of_a_failed_kernel_build_count_as_compile_time():
    """`fuzzer.executor.run_task`: a JIT backend's call that raises a compile error
    (`COMPILE_ERROR_TYPES`) reports its seconds as ``compile_ms`` (the compile budget's measure),
    not ``run_ms``; any other error, and a compile error of a backend that compiles nothing, as
    ``run_ms``."""
    import time

    from fuzzer.executor import run_task
    from oracle.inputs import make_inputs

    class SlowFailingBuild(FailingBuildBackend):
        def run(self, case, inputs, variant):
            time.sleep(0.05)
            return super().run(case, inputs, variant)

    class NotJit(SlowFailingBuild):
        jit_compiled = False

    class OtherError(FailingBuildBackend):
        def run(self, case, inputs, variant):
            time.sleep(0.05)
            raise ValueError("planted")

    inputs = make_inputs(CASE)
    failed = run_task(SlowFailingBuild(), CASE, inputs, "native")
    assert failed.status == "error" and failed.exception_type == "InductorError"
    assert failed.compile_ms >= 50 and failed.run_ms == 0
    for backend in (NotJit(), OtherError()):
        outcome = run_task(backend, CASE, inputs, "native")
        assert outcome.status == "error" and outcome.run_ms >= 50 and outcome.compile_ms == 0, type(backend).__name__

    class Wrapper:  # a duck-typed backend without jit_compiled (the CP executor's ranks pass one): no crash
        name, device = "wrapper", "cpu"

        def run(self, case, inputs, variant):
            raise InductorError("planted")

    outcome = run_task(Wrapper(), CASE, inputs, "native")
    assert outcome.status == "error" and outcome.exception_type == "InductorError" and outcome.compile_ms == 0
