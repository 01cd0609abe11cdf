"""fuzzer/results.py (line verdicts): regressions, new signatures and fixes along ordered verdicts."""

from __future__ import annotations

from types import SimpleNamespace

from fuzzer.results import LineVerdict, pick_result, transitions


def verdicts(*cells):
    return [LineVerdict(i, f"1.{i}", status, signature) for i, (status, signature) in enumerate(cells)]


def test_pass_then_fail_is_a_regression_and_fail_then_pass_a_fix():
    found = transitions(verdicts(("pass", None), ("fail", "out:all_zero"), ("fail", "out:all_zero"), ("pass", None)))
    assert [(t.kind, t.before.version, t.after.version) for t in found] == [
        ("regression", "1.0", "1.1"),
        ("fix", "1.2", "1.3"),
    ]


def test_skips_and_unsupported_are_stepped_over():
    found = transitions(verdicts(("pass", None), ("skip", None), ("unsupported", None), ("crash", "crash")))
    assert [(t.kind, t.before.version, t.after.version) for t in found] == [("regression", "1.0", "1.3")]


def test_a_signature_no_earlier_build_showed_is_a_new_signature_and_a_known_one_is_not():
    found = transitions(
        verdicts(("fail", "out:all_zero"), ("fail", "lse:nan"), ("fail", "out:all_zero"), ("fail", "lse:nan"))
    )
    assert [(t.kind, t.after.version, t.after.signature) for t in found] == [("new_signature", "1.1", "lse:nan")]


def test_unchanged_verdicts_have_no_transition():
    assert transitions(verdicts(("pass", None), ("pass", None), ("unsupported", None))) == []
    assert transitions([]) == []


def test_the_replay_result_is_preferred_over_fuzz_and_shrink():
    rows = [
        SimpleNamespace(id=1, phase="fuzz"),
        SimpleNamespace(id=2, phase="shrink"),
        SimpleNamespace(id=3, phase="replay"),
        SimpleNamespace(id=4, phase="replay"),
    ]
    assert pick_result(rows).id == 4
    assert pick_result(rows[:2]).id == 1
    assert pick_result([]) is None
