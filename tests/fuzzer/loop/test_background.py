"""`fuzzer.loop.background`: the lanes' late parts and the judge thread's pending judgements, with
stand-in parts and judgements instead of a worker and its children."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fuzzer.loop import background
from fuzzer.loop.background import Background
from fuzzer.loop.stats import WorkerStats
from fuzzer.results import CaseResult
from oracle.config import AttentionCase
from oracle.errors import AttnFuzzError

CASE = AttentionCase(seqlen_q=3, seqlen_k=4, head_dim=8, dtype="float32", backward=False)


class Late:
    """A stand-in `fuzzer.evaluate.LateRun`: done when told."""

    def __init__(self, done: bool, backend: str = "slow") -> None:
        self.is_done, self.case, self.tasks = done, CASE, [(backend, "native")]

    def done(self) -> bool:
        return self.is_done


class Pending:
    """A stand-in `fuzzer.evaluate.PendingJudgement` whose judgement is ``evaluation``."""

    def __init__(self, evaluation, done: bool = True) -> None:
        self.evaluation, self.is_done, self.meta, self.backends = evaluation, done, {}, ["slow"]

    def done(self) -> bool:
        return self.is_done

    def result(self):
        self.is_done = True
        return self.evaluation


def judged(status: str = "pass", pending=None) -> SimpleNamespace:
    signature = None if status == "pass" else status
    result = CaseResult(CASE.case_id, "slow", "native", status, signature=signature)
    return SimpleNamespace(case=CASE, results=[result], pending=pending)


def make(collect=None, judge_in_background=False):
    absorbed, remembered = [], []
    part = Background(
        stats=WorkerStats(), collect=collect or (lambda late, judge_later: judged()),
        judge_in_background=lambda: judge_in_background,
        absorb=lambda evaluation, counted: absorbed.append((evaluation, counted)),
        remember=lambda key, results: remembered.append((key, results)),
    )
    return part, absorbed, remembered


def test_finished_late_parts_are_absorbed_and_those_still_running_kept():
    part, absorbed, _ = make()
    done, running = Late(True), Late(False)
    part.add_late(done)
    part.add_late(running)
    assert part.stats.late == {"slow": 2}
    part.collect_late()
    assert len(absorbed) == 1 and absorbed[0][1] is None
    assert part.late == [running]


def test_a_late_part_whose_child_could_not_start_is_dropped_with_a_warning(caplog):
    def collect(late, judge_later):
        raise AttnFuzzError("child gone")

    part, absorbed, _ = make(collect=collect)
    part.add_late(Late(True))
    part.collect_late()
    assert absorbed == [] and part.late == [] and "child gone" in caplog.text


def test_past_the_limit_of_pending_judgements_the_oldest_is_waited_for(monkeypatch):
    monkeypatch.setattr(background, "MAX_PENDING_JUDGEMENTS", 1)
    part, absorbed, _ = make()
    counted = [CaseResult(CASE.case_id, "fast", "native", "pass"), CaseResult(CASE.case_id, "off", "native", "unsupported")]
    first, second = Pending(judged(), done=False), Pending(judged(), done=False)
    part.add_pending(first, counted)
    assert first.meta["counted"] == {"fast"} and absorbed == []
    part.add_pending(second, [])
    assert [p for p in part.pending] == [second] and len(absorbed) == 1 and absorbed[0][1] == {"fast"}
    assert part.stats.judged_background == 1 and part.stats.judge_s >= 0


def test_a_judged_case_is_remembered_only_when_all_its_results_are_verdicts():
    part, _, remembered = make()
    for status in ("pass", "crash"):
        pending = Pending(judged(status))
        pending.meta["repeat"] = ((status,), [])
        part.add_pending(pending, [])
    part.collect_pending()
    assert [key for key, _ in remembered] == [("pass",)]


def test_a_case_drawn_again_waits_for_its_first_run_s_judgement():
    part, absorbed, _ = make()
    pending = Pending(judged(), done=False)
    pending.meta["repeat"] = (("key",), [])
    part.add_pending(pending, [])
    part.wait_for_first_run(("key",))
    assert part.pending == [] and len(absorbed) == 1


@pytest.mark.parametrize("what", ["late", "pending"])
def test_what_is_still_running_at_the_end_is_dropped_and_counted(what):
    part, absorbed, _ = make()
    if what == "late":
        part.add_late(Late(False))
    else:
        part.add_pending(Pending(judged(), done=False), [])
    part.drop()
    assert part.late == [] and part.pending == [] and absorbed == []
    assert part.stats.late_dropped == {"slow": 1}
