"""Fuzz cases drawn again within a run, answered from their first run (`RepeatMemo`).

Hypothesis draws the same case again within a run (its target phase's hill climbing, filters
and maps that send different choices to one case): ~10% of the fuzz cases of a CPU run
(1004 drawn, 902 distinct, 20 s). Run again, such a case stores nothing (its results are
stored once per case, build, backend, variant and phase, `record_case_results`), and its
verdicts, figures and error ratios (the `target` observations) are those of its first run:
the inputs and the oracle are pure functions of the case, and the kernels of a remembered
case ran to a verdict (no crash, timeout or own-step error). So the first run's results are
handed to Hypothesis again: nothing run, journaled or written, and not counted as a case or
an evaluation (``WorkerStats.repeated`` counts them): cases/s stays a rate of cases run.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from fuzzer.backends.base import Backend
from fuzzer.evaluate import Evaluation
from fuzzer.results import CaseResult
from oracle.config import AttentionCase

MAX_REPEAT_MEMO = 2048
"""At most this many fuzz cases' results are kept for a case drawn again in the same run
(`RepeatMemo`; least recently used dropped first, a few KiB each)."""

REPEATABLE_STATUSES = frozenset({"pass", "fail", "unsupported"})
"""The statuses a remembered fuzz case may hold: a case with a crash, timeout, oom or error (a
child restarted, an own-step failure) is always run again."""


class RepeatMemo:
    """The results of the fuzz cases already run and stored in this run, by key (`key`), least
    recently used dropped first past `MAX_REPEAT_MEMO`.

    Args:
        lanes_on: whether fuzz cases run in lanes now (then nothing is remembered).
        usable: the backends the evaluator runs now, or None before it is open (then nothing is
            remembered).
    """

    def __init__(self, *, lanes_on: Callable[[], bool], usable: Callable[[], list[Backend] | None]):
        self._lanes_on = lanes_on
        self._usable = usable
        self.memo: OrderedDict[tuple, list[CaseResult]] = OrderedDict()

    def __contains__(self, key: tuple) -> bool:
        return key in self.memo

    def key(self, case: AttentionCase, phase: str, tasks: list[tuple[str, str]] | None, record: bool) -> tuple | None:
        """The key under which a fuzz case's results are remembered, or None when they are not
        (another phase, not recorded, lanes on, a CP case, no evaluator, a JIT backend selected:
        a compile budget or kernel cache could change what runs)."""
        if phase != "fuzz" or not record or case.cp_size != 1 or self._lanes_on():
            return None
        usable = self._usable()
        if usable is None or any(b.jit_compiled for b in usable):
            return None
        return (case.case_id, None if tasks is None else tuple(map(tuple, tasks)), tuple(b.name for b in usable))

    @staticmethod
    def is_repeatable(evaluation: Evaluation, ran_nowhere: bool, *, pending_ok: bool = False) -> bool:
        """Whether ``evaluation`` may be reused for the same case drawn again: every task ran
        (none busy, late or skipped), no CP twin, and every result a verdict or ``unsupported``;
        its judgement on the judge thread, if any, finished (else ``pending_ok``: the part
        judged so far qualifies, and the rest is checked when judged)."""
        return (
            not ran_nowhere and evaluation.late is None and not evaluation.busy and not evaluation.skipped
            and (evaluation.pending is None or pending_ok)
            and not evaluation.twin_results and all(r.status in REPEATABLE_STATUSES for r in evaluation.results)
        )

    def remember(self, key: tuple, results: list[CaseResult]) -> None:
        """Keep a fuzz case's results for the same case drawn again (`recall`)."""
        self.memo[key] = results
        while len(self.memo) > MAX_REPEAT_MEMO:
            self.memo.popitem(last=False)

    def recall(self, key: tuple) -> list[CaseResult]:
        """A copy of the results remembered under ``key`` (marked as the most recently used).

        Raises:
            KeyError: nothing is remembered under ``key``.
        """
        self.memo.move_to_end(key)
        return list(self.memo[key])
