"""Regressions and fixes along a package line, as pure functions over ordered verdicts.

For one ``(case, backend, variant)`` the verdicts on the builds of a line, ordered by the line's
package version (PEP 440) then first-seen time, form a sequence. Only judged verdicts count
(``pass`` and the failing statuses); ``unsupported`` and ``skip`` say nothing about the bug and
are stepped over. Between two consecutive judged verdicts:

* ``regression``: pass, then a failure;
* ``new_signature``: a failure, then a failure whose signature no earlier build of the line
  showed (counted with the regressions);
* ``fix``: a failure, then a pass.

When one build holds several results of a task (phases), `pick_result` keeps one: ``replay``
first, then ``confirm``, ``fuzz``, ``shrink``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fuzzer.results import FAILING_STATUSES

REGRESSION, NEW_SIGNATURE, FIX = "regression", "new_signature", "fix"
TRANSITION_KINDS = (REGRESSION, NEW_SIGNATURE, FIX)
PHASE_PREFERENCE = ("replay", "confirm", "fuzz", "shrink")


@dataclass(frozen=True)
class LineVerdict:
    """The verdict of one task on one build of a line.

    Attributes:
        build_id: the build.
        version: the build's version of the line's package.
        status: a result status or ``"skip"``.
        signature: the failure signature (None unless failing).
    """

    build_id: int
    version: str
    status: str
    signature: str | None = None

    @property
    def is_failure(self) -> bool:
        return self.status in FAILING_STATUSES

    @property
    def is_judged(self) -> bool:
        return self.status == "pass" or self.is_failure


@dataclass(frozen=True)
class Transition:
    """A change of verdict between two consecutive judged builds: ``kind`` is one of
    `TRANSITION_KINDS`; ``before`` is the last build with the old verdict, ``after`` the first
    with the new one."""

    kind: str
    before: LineVerdict
    after: LineVerdict


def transitions(verdicts: Sequence[LineVerdict]) -> list[Transition]:
    """Every regression, new signature and fix along ``verdicts`` (already in line order)."""
    found: list[Transition] = []
    previous: LineVerdict | None = None
    seen: set[str | None] = set()
    for verdict in verdicts:
        if not verdict.is_judged:
            continue
        if previous is not None:
            if previous.status == "pass" and verdict.is_failure:
                found.append(Transition(REGRESSION, previous, verdict))
            elif previous.is_failure and verdict.status == "pass":
                found.append(Transition(FIX, previous, verdict))
            elif previous.is_failure and verdict.is_failure and verdict.signature not in seen:
                found.append(Transition(NEW_SIGNATURE, previous, verdict))
        if verdict.is_failure:
            seen.add(verdict.signature)
        previous = verdict
    return found


def pick_result(rows: Sequence[Any]) -> Any | None:
    """The row to show for one task on one build among rows with a ``phase`` attribute:
    `PHASE_PREFERENCE` order, unknown phases last, then the newest ``id``."""

    def rank(row: Any) -> tuple[int, int]:
        phase = getattr(row, "phase", "")
        order = PHASE_PREFERENCE.index(phase) if phase in PHASE_PREFERENCE else len(PHASE_PREFERENCE)
        return (order, -int(getattr(row, "id", 0) or 0))

    return min(rows, key=rank) if rows else None


__all__ = [
    "FIX",
    "LineVerdict",
    "NEW_SIGNATURE",
    "PHASE_PREFERENCE",
    "REGRESSION",
    "TRANSITION_KINDS",
    "Transition",
    "pick_result",
    "transitions",
]
