"""`fuzzer.loop.draws`: the strategy of a chunk and its target plan, without a worker."""

from __future__ import annotations

from hypothesis import given, settings

from fuzzer.known import FamilyHistory
from fuzzer.loop.config import WorkerConfig
from fuzzer.loop.draws import Draws, target_runs
from fuzzer.loop.stats import WorkerStats
from oracle.config import AttentionCase
from tests.fuzzer.standins import CorrectBackend, GateBackend


def draws(backends, *, busy=(), lanes=False, **settings_) -> Draws:
    config = WorkerConfig(backends=[(b, "x:" + type(b).__name__) for b in backends], isolation="none", **settings_)

    class Executor:
        def busy_environments(self):
            return list(busy)

    return Draws(
        config=config, backends={b.name: b for b in backends}, usable=lambda: list(backends), stats=WorkerStats(),
        families=FamilyHistory(), chunk_commons=lambda names, common: {n: common for n in names},
        executor=Executor, lanes_on=lambda: lanes,
    )


def test_with_lanes_a_busy_backend_sits_out_the_plan_while_another_is_free():
    gate, ok = GateBackend(), CorrectBackend()
    part = draws([gate, ok], busy=[gate.environment], lanes=True)
    assert part.busy_backends() == {gate.name}
    part.strategy(0)
    assert part.stats.untargeted_busy == {gate.name: 1}
    assert draws([gate, ok], busy=[gate.environment], lanes=False).busy_backends() == set()


def test_a_chunk_draws_cases_its_target_runs_inside_the_bounds():
    ok = CorrectBackend()
    part = draws([ok], max_seqlen=16, chunk_size=5)
    seen = []

    @settings(max_examples=5, database=None, deadline=None)
    @given(part.strategy(0))
    def draw(drawn):
        seen.append(drawn)

    draw()
    assert seen and all(name == ok.name and case.seqlen_q <= 16 and case.seqlen_k <= 16 for name, case in seen)
    assert all(target_runs(ok, case) for _, case in seen)


def test_the_head_dim_pool_keeps_the_first_head_dims_run():
    part = draws([CorrectBackend()], kernel_pool_size=2)
    for head_dim in (8, 16, 8, 32):
        part.note_ran(AttentionCase(seqlen_q=3, seqlen_k=4, head_dim=head_dim, dtype="float32", backward=False))
    assert part.head_dim_pool == [8, 16]
