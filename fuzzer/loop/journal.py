"""The worker's journal (`fuzzer.spool.Spool`) after a kill: the evaluation a killed worker left
is redone first, or quarantined when it can no longer be redone."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from fuzzer.loop.stats import WorkerStats
from fuzzer.results import CaseResult
from oracle.config import AttentionCase
from oracle.errors import CaseValidationError

MAX_REDO_ATTEMPTS = 2
"""A journaled evaluation redone this many times without finishing is quarantined."""


def redo_interrupted(
    journal: Any, evaluate: Callable[..., list[CaseResult]], usable: Callable[[], list[str]], stats: WorkerStats
) -> list[CaseResult]:
    """Run again the evaluation a killed worker left in ``journal``, recording its results
    (idempotent: what it had stored is not stored twice). Backends not in ``usable`` (names)
    are skipped; a case that no longer validates, or whose redo already failed
    `MAX_REDO_ATTEMPTS` times, is quarantined (`quarantine`).

    Args:
        journal: the worker's journal (`fuzzer.spool.Spool`).
        evaluate: ``evaluate(case, phase=, tasks=)``: run, judge and record a case.
        usable: the names of the backends usable now.
        stats: the worker's figures (``redone``, ``quarantined`` added to).

    Returns:
        The redone evaluation's results ([] when there was none to redo).
    """
    entry = journal.interrupted_evaluation()
    if entry is None:
        return []
    try:
        case = AttentionCase.from_json(entry["case"])
    except CaseValidationError as exc:
        quarantine(journal, entry, f"no longer validates: {exc}", stats)
        return []
    # a journaled case whose redo already failed twice (its worker died or was killed each
    # time) is quarantined, not redone forever: it would stop every later worker
    attempts_key = f"redo_attempts:{case.case_id}"
    meta = getattr(journal, "meta", None)
    attempts = int(meta(attempts_key) or 0) if meta is not None else 0
    if attempts >= MAX_REDO_ATTEMPTS:
        quarantine(journal, entry, f"its redo failed {attempts} times", stats)
        return []
    if meta is not None:
        journal.set_meta(attempts_key, str(attempts + 1))
    tasks = entry.get("tasks")
    if tasks is not None:
        names = set(usable())
        tasks = [(name, variant) for name, variant in tasks if name in names]
        if not tasks:
            journal.end_evaluation()
            return []
    results = evaluate(case, phase=entry.get("phase", "fuzz"), tasks=tasks)
    stats.redone.append(case.case_id)
    return results


def quarantine(journal: Any, entry: dict, why: str, stats: WorkerStats) -> None:
    """Drop the journaled evaluation ``entry`` from the journal and keep it aside in the
    journal's metadata (``quarantined:<n>``, the entry and why), with a warning."""
    set_meta = getattr(journal, "set_meta", None)
    if set_meta is not None:
        n = int(journal.meta("quarantined") or 0) + 1
        set_meta("quarantined", str(n))
        set_meta(f"quarantined:{n}", json.dumps({"entry": entry, "why": why}, default=str))
    journal.end_evaluation()
    stats.quarantined += 1
    logging.getLogger("attnfuzz.worker").warning("journaled case quarantined, not redone: %s", why)
