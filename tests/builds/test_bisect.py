"""fuzzer/builds/bisect.py: the first bad build in O(log n) replays, skips like ``git bisect skip``."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzer.builds.bisect import BisectError, bisect_builds, classify, max_replays
from fuzzer.results import Verdict

NINE = ["1.0", "1.0.1", "1.1", "1.1.1", "1.1.2", "1.2rc1", "1.2", "1.3", "1.4"]


def line(first_bad: int, skipped: set[int] = frozenset(), versions=NINE, signature="out:all_zero"):
    """A test function over ``versions``: builds from ``first_bad`` on fail with ``signature``;
    ``skipped`` ones cannot run. Records which versions it was asked about."""
    asked: list[str] = []

    def test(version: str) -> Verdict:
        asked.append(version)
        position = versions.index(version)
        if position in skipped:
            return Verdict("skip", None, "cannot import")
        if position >= first_bad:
            return Verdict("fail", signature, "")
        return Verdict("pass")

    return test, asked


def test_nine_builds_take_five_replays_counting_both_endpoints():
    test, asked = line(first_bad=5)
    result = bisect_builds(NINE, test)
    assert (result.status, result.last_good, result.first_bad) == ("found", "1.1.2", "1.2rc1")
    assert result.replays == len(asked) == 5 == max_replays(9)
    assert asked[:2] == ["1.4", "1.0"], "the endpoints are confirmed first, bad then good"
    assert result.signature == "out:all_zero"


def test_a_skipped_build_is_stepped_around_and_counted():
    test, asked = line(first_bad=5, skipped={6})
    result = bisect_builds(NINE, test)
    assert (result.status, result.first_bad, result.last_good) == ("found", "1.2rc1", "1.1.2")
    assert "1.2" in asked and result.skips == 1
    assert result.replays <= max_replays(9, skips=1)
    assert [s.verdict for s in result.steps] == ["bad", "good", "good", "skip", "bad"]


def test_a_skipped_build_next_to_the_change_leaves_both_as_candidates():
    test, _ = line(first_bad=5, skipped={4})
    result = bisect_builds(NINE, test)
    assert result.status == "ambiguous"
    assert result.candidates == ("1.1.2", "1.2rc1") and result.last_good == "1.1.1" and result.first_bad == "1.2rc1"


@given(
    st.integers(min_value=3, max_value=40).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(1, n - 1), st.sets(st.integers(1, n - 2), max_size=n // 3))
    )
)
def test_bisection_finds_the_first_bad_build_within_the_replay_bound(args):
    n, first_bad, skipped = args
    versions = [f"1.{i}" for i in range(n)]
    test, asked = line(first_bad, skipped, versions)
    result = bisect_builds(versions, test)
    assert len(asked) == len(set(asked)) == result.replays, "no build is replayed twice"
    assert result.replays <= max_replays(n, skips=result.skips)
    assert versions[first_bad] in result.candidates
    if result.status == "found":
        assert result.first_bad == versions[first_bad] and result.last_good == versions[first_bad - 1]
    else:
        assert result.status == "ambiguous"
        bad_candidates = [versions.index(c) for c in result.candidates]
        assert all(c in skipped for c in bad_candidates[:-1])
        assert min(bad_candidates) <= first_bad <= max(bad_candidates)


def test_without_skips_the_bound_is_logarithmic():
    for n in (2, 3, 9, 17, 26, 100):
        test, asked = line(first_bad=n - 1, versions=[f"0.{i}" for i in range(n)])
        result = bisect_builds([f"0.{i}" for i in range(n)], test)
        assert result.replays <= 2 + math.ceil(math.log2(n - 1))


def test_a_build_failing_with_another_signature_is_a_skip():
    versions = NINE

    def test(version: str) -> Verdict:
        position = versions.index(version)
        if position == 4:
            return Verdict("error", "error:TypeError", "flash_attn_func() got an unexpected keyword")
        return Verdict("fail", "out:all_zero") if position >= 5 else Verdict("pass")

    result = bisect_builds(versions, test)
    assert result.first_bad == "1.2rc1"
    (skip,) = [s for s in result.steps if s.verdict == "skip"]
    assert skip.version == "1.1.2" and "fails differently (error:TypeError" in skip.why


@pytest.mark.parametrize(
    ("first_bad", "skipped", "status"),
    [(0, set(), "good_fails"), (9, set(), "bad_passes"), (5, {8}, "endpoint_skipped"), (5, {0}, "endpoint_skipped")],
)
def test_endpoints_that_do_not_bracket_the_failure_stop_the_search(first_bad, skipped, status):
    test, asked = line(first_bad, skipped)
    result = bisect_builds(NINE, test)
    assert result.status == status and result.replays == len(asked) <= 2


def test_every_step_is_reported_as_it_happens():
    seen = []
    test, _ = line(first_bad=3)
    result = bisect_builds(NINE, test, on_step=seen.append)
    assert seen == list(result.steps) and [s.number for s in seen] == list(range(1, len(seen) + 1))


def test_fewer_than_two_builds_cannot_be_bisected():
    with pytest.raises(BisectError, match="versions: a bisection needs a good and a bad build, got 1"):
        bisect_builds(["1.0"], lambda v: Verdict("pass"))


def test_classification_of_replay_verdicts():
    assert classify(Verdict("pass"), "out:all_zero")[0] == "good"
    assert classify(Verdict("fail", "out:all_zero"), "out:all_zero")[0] == "bad"
    assert classify(Verdict("crash", "crash"), None)[0] == "bad"
    assert classify(Verdict("unsupported", None, "head_dim 512"), None) == (
        "skip",
        "the build declares the case unsupported: head_dim 512",
    )
    assert classify(Verdict("skip", None, "ImportError"), None)[0] == "skip"
