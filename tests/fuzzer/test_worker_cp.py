"""The fuzz worker with a context-parallel backend, end to end on the CPU: CP cases are drawn, run on
two gloo ranks, judged against the float64 oracle beside their non-CP twin, stored with the twin in
a SQL store (a migrated SQLite file), shrunk as CP cases, and read back by `service.db.cp_view`.

The planted backend is the seed's blind spot: ``cp-cpu-planted-window`` reads the causal window
``(-1, 0)`` as flash-attention after #2490 does, so every causal row sees no key, with and without
CP. Its CP and non-CP outputs are equal (a CP-vs-non-CP test passes) and both are all zeros.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from fuzzer import registry
from fuzzer.backends.cp_layout import cp_twin
from fuzzer.cp.judge import CP_METRICS_KEY
from fuzzer.worker import Worker, WorkerConfig, WorkerStats
from oracle.config import AttentionCase
from service.db import migrations
from service.db.cp_view import cp_view
from service.db.engine import make_engine
from service.db.models import Bucket, Case, Result
from service.db.store import SqlStore

PLANTED, CORRECT = "cp-cpu-planted-window", "cp-cpu-ring"
BUCKET = (PLANTED, "default", "out:all_zero")


def fuzz_config(backend: str, **kw: object) -> WorkerConfig:
    """Small and seeded: 12 cases of at most 16 tokens, in-process for non-CP runs (CP runs always
    take a group of rank processes)."""
    settings: dict = dict(
        backends=registry.select([backend]),
        isolation="none",
        max_cases=12,
        time_budget_s=None,
        seed=1,
        chunk_size=12,
        max_batch_size=2,
        max_heads_kv=2,
        max_seqlen=16,
        max_work=2**14,
        case_timeout_s=60.0,
        shrink_deadline_s=20.0,
        replay_known=False,
    )
    settings.update(kw)
    return WorkerConfig(**settings)


@dataclass
class Run:
    engine: Engine
    stats: WorkerStats

    def stored(self) -> tuple[dict[str, AttentionCase], list[Result]]:
        with Session(self.engine) as session:
            cases = {row.id: row.to_attention_case() for row in session.scalars(select(Case))}
            results = list(session.scalars(select(Result)))
        return cases, results


@pytest.fixture
def fuzz(tmp_path) -> Iterator:
    """``fuzz(config) -> Run``: one worker run into a fresh, migrated SQLite database."""
    engines: list[Engine] = []

    def run(config: WorkerConfig) -> Run:
        url = f"sqlite:///{tmp_path / f'attnfuzz-{len(engines)}.db'}"
        migrations.upgrade(url)
        engine = make_engine(url)
        engines.append(engine)
        stats = Worker(config, SqlStore(engine)).run()
        return Run(engine, stats)

    yield run
    for engine in engines:
        engine.dispose()


def test_the_worker_stores_an_equal_but_wrong_cp_case_and_its_twin_as_failing_and_the_view_marks_it(fuzz) -> None:
    run = fuzz(fuzz_config(PLANTED))
    cases, results = run.stored()
    fuzzed_cp = [r for r in results if r.phase == "fuzz" and cases[r.case_id].cp_size == 2]
    assert fuzzed_cp, f"no CP case drawn: {sorted((c.cp_size, c.qkv_format) for c in cases.values())}"
    blind = [r for r in fuzzed_cp if r.status == "fail" and r.metrics[CP_METRICS_KEY]["agree_but_both_wrong"]]
    assert blind, [(r.status, r.signature, r.metrics.get(CP_METRICS_KEY)) for r in fuzzed_cp]
    result = blind[0]
    block = result.metrics[CP_METRICS_KEY]
    assert (result.signature, block["agrees_with_non_cp"], block["identical"]) == ("out:all_zero", True, True), block
    assert (block["non_cp_status"], block["non_cp_signature"]) == ("fail", "out:all_zero")

    cp_case = cases[result.case_id]
    twin = cp_twin(cp_case)
    assert block["non_cp_case_id"] == twin.case_id and twin.case_id in cases, "the twin case is stored"
    [twin_result] = [r for r in results if r.case_id == twin.case_id and r.phase == "fuzz"]
    assert (twin_result.backend, twin_result.status, twin_result.signature) == (PLANTED, "fail", "out:all_zero")
    assert CP_METRICS_KEY not in twin_result.metrics

    # every CP result of a causal case is failing, and so is its twin; non-causal ones pass on both sides
    for r in fuzzed_cp:
        [twin_r] = [t for t in results if t.case_id == r.metrics[CP_METRICS_KEY]["non_cp_case_id"] and t.phase == "fuzz"]
        assert (r.status, twin_r.status) == (("fail", "fail") if cases[r.case_id].causal else ("pass", "pass"))

    with Session(run.engine) as session:
        bucket = session.scalars(
            select(Bucket).where(Bucket.backend == BUCKET[0], Bucket.variant == BUCKET[1], Bucket.signature == BUCKET[2])
        ).one()
        view = cp_view(session, result.case_id)
        assert view.non_cp_case_id == twin.case_id and view.non_cp_case is not None
        [cp_family] = [c for c in view.cp_cases if c.case.id == result.case_id]
        [pair] = cp_family.pairs
        assert (pair.backend, pair.agrees_with_non_cp, pair.both_fail, pair.basis) == (PLANTED, True, True, "tensors")
        assert pair.agree_but_both_wrong and view.has_blind_spot
        assert pair.non_cp_result.case_id == twin.case_id
        assert cp_view(session, twin.case_id).has_blind_spot, "the mark is seen from the twin's page too"

    # the bucket's first case is a CP case (recorded before its twin), shrunk as a CP case that stays laid out
    assert BUCKET in run.stats.new_buckets and run.stats.new_buckets.count(BUCKET) == 1
    first = cases[bucket.first_case_id]
    assert bucket.minimised_case_id is not None, bucket.minimise_note
    minimal = cases[bucket.minimised_case_id]
    assert (minimal.cp_size, minimal.cp_comm_type) == (first.cp_size, first.cp_comm_type), minimal.describe()
    if minimal.cp_size > 1 and not minimal.is_varlen:
        unit = 2 * minimal.cp_size
        assert minimal.seqlen_q % unit == 0 and minimal.seqlen_k % unit == 0, minimal.describe()
    assert minimal.causal and minimal.batch_size == 1, minimal.describe()


def test_a_correct_cp_backend_passes_with_cp_cases_drawn_and_run_on_two_ranks(fuzz) -> None:
    run = fuzz(fuzz_config(CORRECT, shrink=False))
    cases, results = run.stored()
    assert results and {r.status for r in results} == {"pass"}, sorted({(r.status, r.signature) for r in results})
    cp_sizes = {c.cp_size for c in cases.values()}
    assert cp_sizes == {1, 2}, cp_sizes
    cp_results = [r for r in results if cases[r.case_id].cp_size == 2]
    comm_types = {cases[r.case_id].cp_comm_type for r in cp_results}
    assert comm_types and comm_types <= {"p2p", "all_gather", "a2a"}, comm_types
    for r in cp_results:
        block = r.metrics[CP_METRICS_KEY]
        assert (block["cp_size"], block["non_cp_status"], block["agrees_with_non_cp"]) == (2, "pass", True), block
        assert block["agree_but_both_wrong"] is False
        assert block["non_cp_case_id"] in cases
    assert run.stats.new_buckets == []


def test_the_cp_cpu_backends_are_selectable_by_name_but_not_in_the_default_set() -> None:
    names = ("cp-cpu-ring", "cp-cpu-planted-window", "cp-cpu-planted-merge")
    assert [b.name for b, _ in registry.select(list(names))] == list(names)
    assert not set(names) & set(registry.discover()), "the default job fuzzes only what discover() lists"
    assert set(names) <= set(registry.discover(opt_in=True))
