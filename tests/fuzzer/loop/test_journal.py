"""`fuzzer.loop.journal`: the evaluation a killed worker left, redone or quarantined, with a
stand-in journal and evaluation instead of a worker."""

from __future__ import annotations

import json

from fuzzer.loop.journal import MAX_REDO_ATTEMPTS, redo_interrupted
from fuzzer.loop.stats import WorkerStats
from oracle.config import AttentionCase

CASE = AttentionCase(seqlen_q=3, seqlen_k=4, head_dim=8, dtype="float32", backward=False)


class Journal:
    """The journal calls of a `fuzzer.spool.Spool`, in memory."""

    def __init__(self, entry):
        self.entry, self.metadata, self.ended = entry, {}, 0

    def interrupted_evaluation(self):
        return self.entry

    def meta(self, key):
        return self.metadata.get(key)

    def set_meta(self, key, value):
        self.metadata[key] = value

    def end_evaluation(self):
        self.ended += 1


def redo(journal, usable=("a",)):
    calls, stats = [], WorkerStats()
    results = redo_interrupted(journal, lambda case, **kw: calls.append((case, kw)) or ["result"], lambda: list(usable), stats)
    return results, calls, stats


def test_the_left_evaluation_is_redone_on_the_usable_backends_and_counted():
    journal = Journal({"case": CASE.to_json(), "phase": "fuzz", "tasks": [["a", "native"], ["gone", "native"]]})
    results, calls, stats = redo(journal)
    assert results == ["result"] and calls == [(CASE, {"phase": "fuzz", "tasks": [("a", "native")]})]
    assert stats.redone == [CASE.case_id] and journal.metadata[f"redo_attempts:{CASE.case_id}"] == "1"


def test_an_evaluation_of_no_usable_backend_is_forgotten():
    journal = Journal({"case": CASE.to_json(), "tasks": [["gone", "native"]]})
    assert redo(journal)[:2] == ([], []) and journal.ended == 1


def test_an_evaluation_whose_redo_kept_failing_or_that_no_longer_validates_is_quarantined():
    journal = Journal({"case": CASE.to_json()})
    journal.metadata[f"redo_attempts:{CASE.case_id}"] = str(MAX_REDO_ATTEMPTS)
    results, calls, stats = redo(journal)
    assert results == [] and calls == [] and stats.quarantined == 1 and journal.ended == 1
    assert json.loads(journal.metadata["quarantined:1"])["why"] == f"its redo failed {MAX_REDO_ATTEMPTS} times"
    broken = Journal({"case": {**CASE.to_json(), "head_dim": -1}})
    assert redo(broken)[2].quarantined == 1 and "no longer validates" in broken.metadata["quarantined:1"]
    assert redo(Journal(None))[:2] == ([], [])
