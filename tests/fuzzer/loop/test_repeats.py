"""`fuzzer.loop.repeats`: a fuzz case drawn again is answered from its first run, without a worker."""

from __future__ import annotations

from types import SimpleNamespace

from fuzzer.loop import repeats
from fuzzer.loop.repeats import RepeatMemo
from fuzzer.results import CaseResult
from oracle.config import AttentionCase
from tests.fuzzer.planted_jit import PlantedJitBackend
from tests.fuzzer.standins import CorrectBackend

CASE = AttentionCase(seqlen_q=3, seqlen_k=4, head_dim=8, dtype="float32", backward=False)


def memo(usable=(CorrectBackend(),), lanes=False) -> RepeatMemo:
    return RepeatMemo(lanes_on=lambda: lanes, usable=lambda: None if usable is None else list(usable))


def test_only_recorded_fuzz_cases_without_lanes_cp_or_jit_backends_have_a_key():
    assert memo().key(CASE, "fuzz", None, True) == (CASE.case_id, None, ("standin-ok",))
    assert memo().key(CASE, "fuzz", [["standin-ok", "native"]], True)[1] == (("standin-ok", "native"),)
    assert memo().key(CASE, "shrink", None, True) is None
    assert memo().key(CASE, "fuzz", None, False) is None
    assert memo(lanes=True).key(CASE, "fuzz", None, True) is None
    assert memo(usable=None).key(CASE, "fuzz", None, True) is None  # no evaluator yet
    assert memo(usable=(CorrectBackend(), PlantedJitBackend())).key(CASE, "fuzz", None, True) is None


def test_remembered_results_come_back_as_a_copy_and_the_least_recently_used_go_first(monkeypatch):
    monkeypatch.setattr(repeats, "MAX_REPEAT_MEMO", 2)
    m = memo()
    results = [CaseResult(CASE.case_id, "standin-ok", "native", "pass")]
    m.remember(("a",), results)
    m.remember(("b",), [])
    assert m.recall(("a",)) == results and m.recall(("a",)) is not results
    m.remember(("c",), [])  # "b" was used least recently
    assert ("a",) in m and ("c",) in m and ("b",) not in m


def evaluation(**overrides) -> SimpleNamespace:
    fields = dict(late=None, busy=[], skipped=[], pending=None, twin_results=[],
                  results=[CaseResult(CASE.case_id, "standin-ok", "native", "pass")])
    return SimpleNamespace(**{**fields, **overrides})


def test_an_evaluation_is_repeatable_only_when_every_task_ran_to_a_verdict():
    assert RepeatMemo.is_repeatable(evaluation(), ran_nowhere=False)
    assert not RepeatMemo.is_repeatable(evaluation(), ran_nowhere=True)
    assert not RepeatMemo.is_repeatable(evaluation(busy=["standin-ok"]), ran_nowhere=False)
    assert not RepeatMemo.is_repeatable(evaluation(late=object()), ran_nowhere=False)
    crash = CaseResult(CASE.case_id, "standin-ok", "native", "crash", signature="crash")
    assert not RepeatMemo.is_repeatable(evaluation(results=[crash]), ran_nowhere=False)
    assert not RepeatMemo.is_repeatable(evaluation(pending=object()), ran_nowhere=False)
    assert RepeatMemo.is_repeatable(evaluation(pending=object()), ran_nowhere=False, pending_ok=True)
