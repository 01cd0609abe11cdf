"""What a worker finishes in the background: the lanes' late parts of fuzz cases (environments
still working when the case went on) and the judgements on the evaluator's judge thread
(`Background`). Both are judged and stored later, at the next cases, between chunks or at the
end; what is still running at the end is given up and counted."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from fuzzer.evaluate import Evaluation, PendingJudgement
from fuzzer.loop.repeats import REPEATABLE_STATUSES
from fuzzer.loop.stats import WorkerStats
from fuzzer.results import CaseResult
from oracle.errors import AttnFuzzError

MAX_PENDING_JUDGEMENTS = 4
"""Background judging: at most this many judgements wait on the judge thread; past it the worker
waits for the oldest (counted as comparison, its own work), so a judge thread slower than the
cases holds back the fuzzing instead of piling up their tensors."""



class Background:
    """The background parts (lanes) and pending judgements (background judging) of one worker,
    oldest first.

    Args:
        stats: the worker's figures (``wait_s``, ``judge_s``, ``late``, ``late_dropped``,
            ``judged_background`` are added to here).
        collect: ``collect(late, judge_later)``: the finished background part ``late``
            (`fuzzer.evaluate.LateRun`) as an `Evaluation`, its ``ok`` outcomes left on the judge
            thread with ``judge_later`` (`fuzzer.evaluate.Evaluator.collect_late`); raises
            `AttnFuzzError` when its child could not start.
        judge_in_background: whether fuzz cases are judged on the judge thread now.
        absorb: ``absorb(evaluation, counted)``: count and store a finished part or judgement;
            ``counted``: the backends already counted as having run the case (or None).
        remember: ``remember(key, results)``: keep a whole judged case for the same case drawn
            again (`fuzzer.loop.repeats.RepeatMemo.remember`).
    """

    def __init__(
        self,
        *,
        stats: WorkerStats,
        collect: Callable[[Any, bool], Evaluation],
        judge_in_background: Callable[[], bool],
        absorb: Callable[[Evaluation, set[str] | None], None],
        remember: Callable[[tuple, list[CaseResult]], None],
    ):
        self.stats = stats
        self._collect = collect
        self._judge_in_background = judge_in_background
        self._absorb = absorb
        self._remember = remember
        self.late: list[Any] = []  # fuzzer.evaluate.LateRun of fuzz cases still running in the background (lanes)
        self.pending: list[PendingJudgement] = []  # judgements on the judge thread, oldest first (background judging)

    def add_late(self, late: Any) -> None:
        """Keep the background part ``late`` (`fuzzer.evaluate.LateRun`) until it is done,
        counting its tasks in ``stats.late``."""
        self.late.append(late)
        self.stats.late.update(name for name, _ in late.tasks)

    def collect_late(self, wait_s: float | None = None) -> None:
        """Judge and store the background parts of earlier fuzz cases (lanes) that are done; with
        ``wait_s``, first wait up to that many seconds (in all) for those still running. With
        background judging their ``ok`` outcomes go to the judge thread, and the judgements
        finished there are stored first (`collect_pending`).

        Each part's results are stored with their case in one more write (the case row exists:
        the write adds results), counted like a case's results (`WorkerStats` results, backends'
        cases run, kernel and compile seconds, new buckets, crash quarantine, kernel keys), but
        not in ``stats.cases`` (the case counted when it ran) and with no ``target()`` (the
        Hypothesis example is over). A part whose child could not start is dropped with a
        warning (nothing of it was stored). The seconds waited count as waiting for the children
        (``stats.wait_s``, as the grace of a case), not as attnfuzz's own work."""
        self.collect_pending()
        if not self.late:
            return
        deadline = None if wait_s is None else time.monotonic() + wait_s
        still = []
        for late in self.late:
            if deadline is not None and not late.done():
                t0 = time.perf_counter()
                while not late.done() and time.monotonic() < deadline:
                    time.sleep(0.01)
                self.stats.wait_s += time.perf_counter() - t0  # waiting for the backends, not attnfuzz's own work
            if not late.done():
                still.append(late)
                continue
            try:
                evaluation = self._collect(late, self._judge_in_background())
            except AttnFuzzError as exc:
                logging.getLogger("attnfuzz.worker").warning("background part of case %s lost: %s", late.case.case_id, exc)
                continue
            self._absorb(evaluation, None)
            if evaluation.pending is not None:
                self.add_pending(evaluation.pending, evaluation.results)
        self.late = still


    def add_pending(self, pending: PendingJudgement, counted: list[CaseResult]) -> None:
        """Keep ``pending`` until judged; past `MAX_PENDING_JUDGEMENTS` unfinished ones, wait for
        the oldest and store what is done (`collect_pending`). ``counted``: the results of the
        same part already counted (their backends ran the case: not counted again when judged)."""
        pending.meta["counted"] = {r.backend for r in counted if r.status != "unsupported"}
        self.pending.append(pending)
        while sum(1 for p in self.pending if not p.done()) > MAX_PENDING_JUDGEMENTS:
            self.collect_pending(wait=True, oldest_only=True)

    def collect_pending(self, wait: bool = False, oldest_only: bool = False) -> None:
        """Store the judgements of the judge thread that are finished, oldest first (each like a
        lanes' background part, ``absorb``; a fuzz case drawn again is then answered from
        its first run). With ``wait``, wait for them (for the oldest only with
        ``oldest_only``); the seconds waited count as comparison on the worker's thread
        (``stats.judge_s``): the worker was held up by its own work."""
        while self.pending:
            pending = self.pending[0]
            if not pending.done():
                if not wait:
                    return
                t0 = time.perf_counter()
                evaluation = pending.result()
                self.stats.judge_s += time.perf_counter() - t0
                if oldest_only:
                    wait = False
            else:
                evaluation = pending.result()
            self.pending.pop(0)
            self._absorb_pending(pending, evaluation)

    def wait_for_first_run(self, key: tuple) -> None:
        """A fuzz case drawn again while its first run is still being judged on the judge thread
        (the remembered part of ``key``): wait for that judgement (and the older ones) and store
        them, so the case is answered from its first run instead of running again (a judgement
        takes milliseconds, a case on the GPU a tenth of a second or more)."""
        first = next((p for p in self.pending if p.meta.get("repeat", (None,))[0] == key), None)
        while first is not None and first in self.pending:
            self.collect_pending(wait=True, oldest_only=True)

    def _absorb_pending(self, pending: PendingJudgement, evaluation: Evaluation) -> None:
        """Count and store one finished judgement of the judge thread, and remember its case for a
        draw of it again when the whole case qualifies (`fuzzer.loop.repeats.RepeatMemo.is_repeatable`)."""
        self.stats.judged_background += len(evaluation.results)
        self._absorb(evaluation, pending.meta.get("counted"))
        repeat = pending.meta.get("repeat")
        if repeat is not None and all(r.status in REPEATABLE_STATUSES for r in evaluation.results):
            key, first = repeat
            self._remember(key, first + evaluation.results)


    def drop(self) -> None:
        """Give up the background parts still running (the end of the run, or an error): counted
        in ``stats.late_dropped``; the worker's ``close`` stops their children. Nothing of them was stored. The
        judge thread's judgements not stored yet (an error or an interrupt stopped the run
        before `collect_pending`) are given up too, counted by backend in ``late_dropped``."""
        for late in self.late:
            self.stats.late_dropped.update(name for name, _ in late.tasks)
        self.late = []
        for pending in self.pending:
            self.stats.late_dropped.update(pending.backends)
        self.pending = []

