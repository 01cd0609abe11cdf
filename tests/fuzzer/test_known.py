"""Known buckets (`fuzzer.known`, issue 34 item 4): a bucket minimised and confirmed gets a budget of
further hits, then the draws move away from it (targets, input-family weights) and the share of
evaluations spent on known buckets is reported; a design's limit is never shrunk; the confirm step
runs the minimised case on every other backend (consensus)."""

from __future__ import annotations

import pytest

from fuzzer import registry
from fuzzer.coverage import target_plan
from fuzzer.known import FAMILIES, FAMILY_WINDOW, FULL_WEIGHT, MIN_FAMILY_CASES, MIN_WEIGHT, KnownBuckets, family_weights
from fuzzer.results import BuildFingerprint, CaseResult
from fuzzer.severity import severity
from fuzzer.sinks import MemorySink
from fuzzer.strategies import StrategyArgumentError, check_family_weights
from fuzzer.worker import Worker, WorkerConfig, WorkerError
from oracle.config import AttentionCase
from oracle.design import FLASH_NUMERICS, Claim, Design
from tests.fuzzer.standins import WIDE_CAPS, _Base

ME = "tests.fuzzer.test_known"


class OffsetBackend(_Base):
    """Always wrong the same way under one input family: NaN output on every case with a score
    offset (``out:nan``), correct elsewhere."""

    name = "planted-offset"
    environment = "planted-offset"
    capabilities = WIDE_CAPS

    def run(self, case, inputs, variant):
        output = self._call(case, inputs, *self._bounds(case))
        if case.score_offset != 0:
            output.out.fill_(float("nan"))
        return output


OFFSET_KEY = ("planted-offset", "native", "out:nan")
BUDGET, CASES, CHUNK = 5, 300, 20


def _offset_campaign(budget: int | None, sink=None) -> tuple[Worker, MemorySink]:
    sink = MemorySink() if sink is None else sink
    config = WorkerConfig(
        backends=registry.select([], [f"{ME}:OffsetBackend"]), max_cases=CASES, time_budget_s=None, seed=1,
        isolation="none", replay_known=False, allow_backward=False, shrink_share=1.0, shrink_deadline_s=20,
        chunk_size=CHUNK, known_hit_budget=budget,
    )
    worker = Worker(config, sink)
    worker.run()
    return worker, sink


@pytest.fixture(scope="module")
def campaigns():
    """The same seeded campaign with a budget of 5 further hits and without a budget."""
    return {"budget": _offset_campaign(BUDGET), "none": _offset_campaign(None)}


def _fuzz_cases(sink: MemorySink) -> list[AttentionCase]:
    """The fuzz cases in the order their results were stored."""
    ids = [r.case_id for r in sink.results.values() if r.phase == "fuzz"]
    return [AttentionCase.from_json(sink.cases[case_id]["config"]) for case_id in dict.fromkeys(ids)]


def test_a_known_bucket_gets_its_budget_of_hits_then_the_draws_move_away_and_the_share_is_reported(campaigns):
    """Every score-offset case fails the same way. Once the bucket is minimised, the worker spends
    at most its budget plus a margin of its evaluations on it (one chunk drawn before the
    weights change, and one evaluation in 20 of the run for the weights' floor and Hypothesis's
    own exploration); without a budget it keeps finding it in about half of them."""
    worker, sink = campaigns["budget"]
    stats = worker.stats
    assert sink.buckets[OFFSET_KEY].minimised_case is not None
    assert stats.cases == CASES and stats.spent == [OFFSET_KEY]
    margin = CHUNK + CASES // 20
    after = worker.known.hits(OFFSET_KEY)  # fuzz hits since it was minimised
    assert 0 < after <= BUDGET + margin, (after, BUDGET + margin)
    unbounded, _ = campaigns["none"]
    assert unbounded.known.hits(OFFSET_KEY) > 3 * (BUDGET + margin), unbounded.known.hits(OFFSET_KEY)
    assert not unbounded.stats.spent
    # the share: fuzz results that ran (one backend, one variant: one per case), those in a known bucket
    fuzz_failures = sum(1 for r in sink.results.values() if r.phase == "fuzz" and r.status == "fail")
    assert stats.evaluations == CASES and stats.known_hits == fuzz_failures - 1, "all but the first hit were known"
    assert stats.known_share == pytest.approx(stats.known_hits / stats.evaluations)
    assert stats.known_share < 0.5 * unbounded.stats.known_share, (stats.known_share, unbounded.stats.known_share)
    assert stats.known_load["planted-offset"] > 0  # its target was charged too
    from service.cli.fuzz_display import summary_data

    data = summary_data(stats, "sqlite://")
    assert (data["evaluations"], data["known_hits"], data["known_share"]) == (CASES, stats.known_hits, stats.known_share)
    assert data["known_buckets"]["spent_buckets"] == [" / ".join(OFFSET_KEY)]
    # and stored with the worker (its last heartbeat)
    (row,) = sink.workers.values()
    assert (row["evaluations"], row["known_hits"]) == (CASES, stats.known_hits)


def test_the_family_weights_move_away_from_a_family_that_keeps_hitting_a_known_bucket_yet_it_is_still_drawn(campaigns):
    """The score-offset family ends at the lowest weight, the others at full weight; it is still
    drawn after its bucket is spent, less often than without a budget."""
    worker, sink = campaigns["budget"]
    assert worker.stats.family_weights == {"score_offset": MIN_WEIGHT}, worker.stats.family_weights
    late = _fuzz_cases(sink)[CASES // 2:]
    with_offset = sum(1 for c in late if c.score_offset != 0)
    assert with_offset >= 1, "the family is still reachable"
    _, unbounded_sink = campaigns["none"]
    unbounded_late = _fuzz_cases(unbounded_sink)[CASES // 2:]
    assert with_offset * 4 < sum(1 for c in unbounded_late if c.score_offset != 0)
    others = sum(1 for c in late if c.input_families and c.score_offset == 0)
    assert others >= len(late) // 5, "the other families are drawn as before"


def test_family_weights_scale_with_the_share_of_recent_cases_that_hit_a_spent_bucket_and_never_reach_zero():
    assert family_weights({}) == {name: FULL_WEIGHT for name in FAMILIES}
    few = {"qk_rank": [True] * (MIN_FAMILY_CASES - 1)}
    assert family_weights(few)["qk_rank"] == FULL_WEIGHT, "too few cases to judge"
    weights = family_weights({"qk_rank": [True] * FAMILY_WINDOW, "peaked_rows": [False, True] * 8, "attention_sink": [False] * 40})
    assert weights["qk_rank"] == MIN_WEIGHT and weights["peaked_rows"] == FULL_WEIGHT // 2
    assert weights["attention_sink"] == FULL_WEIGHT
    # only the recent window counts: hits long ago do not hold a family down
    assert family_weights({"qk_rank": [True] * 50 + [False] * FAMILY_WINDOW})["qk_rank"] == FULL_WEIGHT
    assert check_family_weights([("peaked_rows", 3), ("qk_rank", FULL_WEIGHT)]) == (("peaked_rows", 3),)
    for bad in ([("logits", 3)], [("qk_rank", 0)], [("qk_rank", 2), ("qk_rank", 3)], [("qk_rank", 1.5)]):
        with pytest.raises(StrategyArgumentError, match="family_weights"):
            check_family_weights(bad)


def test_a_target_whose_cases_hit_spent_buckets_is_drawn_for_less_but_still_drawn_for():
    even = target_plan(["a", "b"], {"a": 10, "b": 10}, {}, 20)
    assert even.count("a") == even.count("b") == 10
    loaded = target_plan(["a", "b"], {"a": 10, "b": 10}, {}, 20, known_load={"a": 12.0})
    assert loaded.count("a") == 4 and loaded.count("b") == 16
    assert "a" in target_plan(["a", "b"], {"a": 10, "b": 40}, {}, 4, known_load={"a": 24.0}), "reachable once the others grow"


def test_the_budget_counts_further_hits_of_budgeted_buckets_only():
    known = KnownBuckets(2, stored=[("b", "v", "out:nan")])
    key = ("b", "v", "out:nan")
    assert known.is_known(key) and not known.is_budgeted(key)
    assert not known.hit(key) and known.hits(key) == 0, "not minimised yet: no budget"
    known.start_budget(key)
    assert [known.hit(key) for _ in range(3)] == [False, False, True] and known.spent == [key]
    assert not KnownBuckets(None).is_spent(key)
    with pytest.raises(WorkerError, match="known_hit_budget"):
        WorkerConfig(backends=registry.select([], [f"{ME}:OffsetBackend"]), known_hit_budget=-1)


SCORES_IN_BF16 = Design(
    "planted-scores-in-dtype",
    (Claim("scores", "tests/fuzzer/test_known.py: scores written in the dtype before the softmax"), *FLASH_NUMERICS.claims),
)


class DesignLimitBackend(_Base):
    """A correct kernel of a design that writes the scores in the dtype: it returns that design's
    own emulation (`oracle.emulate.emulate`), so each of its failures is the design's limit.
    ``calls`` counts its runs."""

    name = "planted-design-limit"
    environment = "planted-design-limit"
    capabilities = WIDE_CAPS
    design = SCORES_IN_BF16
    calls = 0

    def run(self, case, inputs, variant):
        from fuzzer.backends.base import BackendOutput
        from oracle.emulate import emulate

        type(self).calls += 1
        return BackendOutput(**emulate(case, inputs, self.design).tensors())


LIMIT_CASE = AttentionCase(
    seqlen_q=64, seqlen_k=64, num_heads=2, head_dim=32, dtype="bfloat16", score_offset=-256.0, backward=False, seed=5
)


def test_a_limit_bucket_is_never_shrunk_and_counts_as_known_from_its_first_hit():
    """bfloat16 scores at -256 nats are beyond any first-order bound of the design: the bucket's
    severity is ``limit``. It is budgeted from its first hit (the next one counts), and a worker
    that claims it stores its first case unshrunk without running the backend again."""
    sink = MemorySink()
    config = WorkerConfig(
        backends=registry.select([], [f"{ME}:DesignLimitBackend"]), max_cases=0, time_budget_s=None,
        isolation="none", replay_known=False,
    )
    with Worker(config, sink) as worker:
        (first,) = worker.evaluate(LIMIT_CASE)
        key = first.bucket_key
        assert key is not None and severity(key[2]) == "limit", first.signatures
        assert worker.known.is_budgeted(key) and worker.known.hits(key) == 0
        (again,) = worker.evaluate(LIMIT_CASE.replace(seed=6))
        assert again.bucket_key == key, again.signatures
        assert (worker.known.hits(key), worker.stats.known_hits, worker.stats.evaluations) == (1, 1, 2)
    calls = DesignLimitBackend.calls

    stats = Worker(config, sink).run()

    (shrunk, outcome), = stats.minimised
    assert shrunk == key and outcome.status == "unchanged" and outcome.attempts == 0
    assert DesignLimitBackend.calls == calls, "no shrink step and no confirmation ran the backend"
    bucket = sink.buckets[key]
    assert bucket.minimised_case == LIMIT_CASE.to_json() and bucket.owner is None
    assert bucket.note.startswith("unchanged: not shrunk: a limit of the backend's design"), bucket.note
    assert not [r for r in sink.results.values() if r.phase in ("shrink", "confirm")]


class CausalNanBackend(_Base):
    """Another backend, wrong another way on the same cases: NaN output on causal ones."""

    name = "planted-causal-nan"
    environment = "planted-causal-nan"
    capabilities = WIDE_CAPS

    def run(self, case, inputs, variant):
        output = self._call(case, inputs, *self._bounds(case))
        if case.causal:
            output.out.fill_(float("nan"))
        return output


def test_the_confirm_step_runs_the_minimised_case_on_every_other_backend_and_records_how_each_does():
    """A bucket of the gate backend (all zeros on causal cases) is shrunk; its confirm step runs the
    minimised case on both gate variants and on the two other backends: the correct one passes
    it, the other fails it its own way, a new bucket whose first case is the minimised case,
    neither attached nor part of the gate's defect."""
    backends = registry.select([], ["tests.fuzzer.standins:GateBackend", "tests.fuzzer.standins:CorrectBackend", f"{ME}:CausalNanBackend"])
    sink = MemorySink()
    build_id = sink.register_build(BuildFingerprint())
    case = AttentionCase(batch_size=2, seqlen_q=5, seqlen_k=6, num_heads=2, head_dim=16, dtype="float32", causal=True)
    sink.record_case(case.to_json(), "fuzz")
    gate_key = ("standin-gate", "buggy", "out:all_zero")
    sink.record_result(CaseResult(case.case_id, *gate_key[:2], "fail", signature=gate_key[2]), build_id, None)
    config = WorkerConfig(backends=backends, max_cases=0, time_budget_s=None, isolation="none", replay_known=False,
                          shrink_deadline_s=30, minimise_max_attempts=1)

    stats = Worker(config, sink).run()

    assert stats.minimised[0][0] == gate_key and stats.minimised[0][1].status == "minimised"
    minimal = AttentionCase.from_json(sink.buckets[gate_key].minimised_case)
    confirm = {(r.backend, r.variant): (r.status, r.signature) for r in sink.results.values()
               if r.phase == "confirm" and r.case_id == minimal.case_id}
    assert confirm == {
        ("standin-gate", "native"): ("pass", None),
        ("standin-gate", "buggy"): ("fail", "out:all_zero"),
        ("standin-ok", "native"): ("pass", None),
        ("planted-causal-nan", "native"): ("fail", "out:nan"),
    }, confirm
    nan_key = ("planted-causal-nan", "native", "out:nan")
    found = sink.buckets[nan_key]
    assert found.first_case_id == minimal.case_id and nan_key in stats.new_buckets
    assert not found.note.startswith("attached") and found.defect_id != sink.buckets[gate_key].defect_id
    assert (gate_key, sink.buckets[nan_key].bucket_id) not in stats.attached


def test_the_known_share_is_stored_with_the_worker_and_summed_by_report(tmp_path):
    """On the SQL store: each heartbeat stores the worker's evaluations and known hits (migration
    0007), ``attnfuzz report`` sums them, and a hit on a minimised bucket says so
    (`BucketUpdate.minimised`, which budgets it in a worker that did not shrink it)."""
    import json

    from typer.testing import CliRunner

    from service.cli.main import app
    from service.db import migrations
    from service.db.engine import make_engine
    from service.db.store import SqlStore

    url = f"sqlite:///{tmp_path / 'known.db'}"
    migrations.upgrade(url)
    engine = make_engine(url)
    store = SqlStore(engine)
    config = WorkerConfig(
        backends=registry.select([], [f"{ME}:OffsetBackend"]), max_cases=40, time_budget_s=None, seed=1,
        isolation="none", replay_known=False, allow_backward=False, shrink_share=1.0, shrink_deadline_s=20,
        known_hit_budget=2,
    )
    stats = Worker(config, store).run()
    assert stats.known_hits > 0 and stats.evaluations == 40
    minimal = AttentionCase.from_json(store.known_failures(["planted-offset"])[0][1])
    build_id = store.register_build(BuildFingerprint())
    again = minimal.replace(seed=minimal.seed + 1)
    store.record_case(again.to_json(), "fuzz")
    update = store.record_result(CaseResult(again.case_id, *OFFSET_KEY[:2], "fail", signature=OFFSET_KEY[2]), build_id, None)
    assert update.minimised and not update.is_new
    with Worker(config, store) as second:  # another worker: the bucket is budgeted at its first hit there
        (result,) = second.evaluate(again.replace(seed=again.seed + 1))
        assert result.bucket_key == OFFSET_KEY
        assert second.known.is_budgeted(OFFSET_KEY) and second.known.hits(OFFSET_KEY) == 1
        assert (second.stats.evaluations, second.stats.known_hits) == (1, 1)  # stored by its heartbeat after the case
    engine.dispose()

    result = CliRunner().invoke(app, ["report", "--json", "--db", url], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    known = json.loads(result.output)["known_buckets"]
    hits = stats.known_hits + 1  # both workers' last heartbeats
    assert known == {"evaluations": 41, "known_hits": hits, "known_share": pytest.approx(hits / 41)}
    table = CliRunner().invoke(app, ["report", "--db", url], env={"COLUMNS": "250"})
    assert f"spent on known buckets: {hits} of the workers' 41 fuzz evaluations" in table.output, table.output
