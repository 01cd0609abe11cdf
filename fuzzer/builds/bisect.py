"""Bisection: the first build of a package line on which a case fails, in O(log n) replays.

`bisect_builds` searches the ordered versions between a known-good and a known-bad build (both
included) with an injected ``test(version) -> Verdict`` (in production: a replay of the case in
that build's environment, `fuzzer.builds.replay.replay_in_build`). Each replay is one *step*:

* ``good``: the case passes;
* ``bad``: it fails with the target signature (by default the one the bad build shows, so a
  build that fails *differently* does not count as the bug);
* ``skip``: the build cannot say (it does not import, the API is missing, the case is
  ``unsupported`` there, or it fails with another signature), like ``git bisect skip``: the
  search tries the untested build nearest to the middle instead.

Replays counted: both endpoints are confirmed first (bad, then good), then one replay per
halving, plus one per skip: at most ``2 + ceil(log2(n - 1)) + skips`` for ``n`` builds (5 for 9
builds without skips). When skipped builds are left between the last good and the first bad one,
the result is ``ambiguous`` and ``candidates`` lists every build that may be the first bad one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from fuzzer.results import BAD, GOOD, SKIP, BisectResult, BisectStep, Verdict
from oracle.errors import AttnFuzzError

class BisectError(AttnFuzzError, ValueError):
    """A bisection cannot start: fewer than two builds."""

    exit_code = 2


def classify(verdict: Verdict, signature: str | None) -> tuple[str, str]:
    """``(good | bad | skip, why)`` for one replay.

    Args:
        verdict: what the replay found.
        signature: the target failure signature; None: any failure is ``bad``.
    """
    if verdict.status == SKIP:
        return SKIP, f"the build cannot run the case: {verdict.detail}"
    if verdict.status == "unsupported":
        return SKIP, f"the build declares the case unsupported: {verdict.detail}"
    if verdict.status == "pass":
        return GOOD, "passes"
    if verdict.is_failure:
        if signature is None or verdict.signature == signature:
            return BAD, f"fails with {verdict.signature}"
        return SKIP, f"fails differently ({verdict.signature}, not {signature})"
    return SKIP, f"status {verdict.status!r}"  # pragma: no cover - every status is covered above


def max_replays(build_count: int, skips: int = 0) -> int:
    """The most replays `bisect_builds` makes on ``build_count`` builds: ``2 + ceil(log2(n - 1))
    + skips``."""
    return 2 + math.ceil(math.log2(max(build_count - 1, 1))) + skips


def bisect_builds(
    versions: Sequence[str],
    test: Callable[[str], Verdict],
    *,
    signature: str | None = None,
    on_step: Callable[[BisectStep], None] | None = None,
) -> BisectResult:
    """Find the first build of ``versions`` (ordered oldest first; the first is the good
    endpoint, the last the bad one) on which ``test`` fails.

    Args:
        versions: the builds, oldest first (see `fuzzer.builds.selection.BuildSelection.between`).
        test: replays the case on a build and returns what it found.
        signature: the failure that counts as ``bad``; None: the bad endpoint's signature.
        on_step: called after each replay (the CLI stores each step as it happens).

    Returns:
        The result; ``result.replays`` counts every replay.

    Raises:
        BisectError: fewer than two versions.
    """
    versions = tuple(versions)
    if len(versions) < 2:
        raise BisectError(f"versions: a bisection needs a good and a bad build, got {len(versions)}")
    steps: list[BisectStep] = []
    target = signature

    def run(position: int) -> BisectStep:
        started = time.monotonic()
        observed = test(versions[position])
        verdict, why = classify(observed, target)
        step = BisectStep(len(steps) + 1, position, versions[position], verdict, observed, why, time.monotonic() - started)
        steps.append(step)
        if on_step is not None:
            on_step(step)
        return step

    def result(status: str, lo: int | None, hi: int | None, candidates: Sequence[int]) -> BisectResult:
        return BisectResult(
            status,
            versions,
            None if lo is None else versions[lo],
            None if hi is None else versions[hi],
            tuple(versions[i] for i in candidates),
            target,
            tuple(steps),
        )

    last = len(versions) - 1
    bad_end = run(last)
    if bad_end.verdict != BAD:
        status = "bad_passes" if bad_end.verdict == GOOD else "endpoint_skipped"
        return result(status, None, None, ())
    if target is None:
        target = bad_end.observed.signature
    good_end = run(0)
    if good_end.verdict != GOOD:
        status = "good_fails" if good_end.verdict == BAD else "endpoint_skipped"
        return result(status, None, last, ())
    lo, hi = 0, last
    skipped: set[int] = set()
    while True:
        untested = [i for i in range(lo + 1, hi) if i not in skipped]
        if not untested:
            break
        middle = (lo + hi) / 2
        position = min(untested, key=lambda i: (abs(i - middle), i))
        step = run(position)
        if step.verdict == GOOD:
            lo = position
        elif step.verdict == BAD:
            hi = position
        else:
            skipped.add(position)
    candidates = [i for i in range(lo + 1, hi) if i in skipped] + [hi]
    return result("found" if len(candidates) == 1 else "ambiguous", lo, hi, candidates)


__all__ = [
    "BisectError",
    "bisect_builds",
    "classify",
    "max_replays",
]
