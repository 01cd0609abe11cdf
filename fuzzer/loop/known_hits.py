"""Which fuzz results hit buckets already known (`KnownHits`, over `fuzzer.known`): their counts,
the hit budgets of minimised buckets, and how draws move away from spent ones (the load of the
target a case was drawn for, the weights of its input families)."""

from __future__ import annotations

from collections import OrderedDict

from fuzzer.known import KNOWN_TARGET_LOAD, FamilyHistory, KnownBuckets, case_families
from fuzzer.loop.repeats import MAX_REPEAT_MEMO
from fuzzer.loop.stats import WorkerStats
from fuzzer.results import BucketUpdate, CaseResult
from fuzzer.severity import severity
from oracle.config import AttentionCase


class KnownHits:
    """The known buckets of one worker and what hitting them moves.

    Args:
        known: the known buckets and their hit budgets (`fuzzer.known.KnownBuckets`).
        stats: the worker's figures (``evaluations``, ``known_hits``, ``spent``, ``known_load``
            are added to here).
    """

    def __init__(self, known: KnownBuckets, stats: WorkerStats):
        self.known = known
        self.stats = stats
        self.families = FamilyHistory()  # recent fuzz cases per input family: did they hit a spent bucket
        self.drawn_for: OrderedDict[str, str] = OrderedDict()  # case_id -> the target it was drawn for (recent cases)

    def note_drawn(self, case_id: str, target_name: str) -> None:
        """Remember that case ``case_id`` was drawn for ``target_name`` (whose draws a hit on a
        spent bucket is charged to, `note`); the last `MAX_REPEAT_MEMO` cases are kept."""
        self.drawn_for[case_id] = target_name
        self.drawn_for.move_to_end(case_id)
        while len(self.drawn_for) > MAX_REPEAT_MEMO:
            self.drawn_for.popitem(last=False)

    def note(
        self, case: AttentionCase, results: list[CaseResult], updates: list[BucketUpdate | None], phase: str
    ) -> None:
        """Count the known buckets of ``results`` just stored (`fuzzer.known`).

        Fuzz phase: each result that ran counts in ``stats.evaluations``, and in
        ``stats.known_hits`` when its failure's bucket was known before (stored when the worker
        started, seen since, or reported as not new by the sink). A hit on a budgeted bucket
        (minimised and confirmed here, minimised according to the sink, or a ``limit``) counts
        toward its budget (`KnownBuckets.hit`); when one of them is past it, the part of the case
        hit a spent bucket: the case's input families note it (`FamilyHistory`), its target gets
        `fuzzer.known.KNOWN_TARGET_LOAD` more load (once per case) and the bucket joins
        ``stats.spent`` the first time. Only parts with a judged result (``pass`` or ``fail``)
        are noted for the families (one note per stored part of a case), and a part that hit
        known buckets, none of them spent, is not noted: it is no clean case either (the
        families would otherwise start from the budget's hits, and those before the shrink,
        counted as clean).

        Every phase: the buckets are known from now; a ``limit`` bucket is budgeted from its
        first hit (it is never shrunk, `minimise_claimed`)."""
        known, fuzz = self.known, phase == "fuzz"
        hit_spent, hit_known, judged = False, False, False
        for r, update in zip(results, updates):
            if fuzz and r.status != "unsupported":
                self.stats.evaluations += 1
            judged = judged or r.status in ("pass", "fail")
            key = r.bucket_key
            if key is None:
                continue
            before = known.is_known(key) or (update is not None and not update.is_new)
            is_limit = severity(key[2]) == "limit"
            if fuzz and before:
                self.stats.known_hits += 1
                hit_known = True
            if fuzz and before and (known.is_budgeted(key) or is_limit or (update is not None and update.minimised)):
                known.start_budget(key)  # a no-op when budgeted here already
                spent = known.hit(key)
                if spent and known.hits(key) == (known.budget or 0) + 1:
                    self.stats.spent.append(key)
                hit_spent = hit_spent or spent
            elif is_limit:
                known.start_budget(key)
            else:
                known.add(key)
        if not fuzz:
            return
        if judged and (hit_spent or not hit_known):  # one that hit a known bucket within its budget: not noted
            self.families.add(case_families(case), hit_spent)
        if hit_spent:
            target_name = self.drawn_for.pop(case.case_id, None)
            if target_name is not None:
                self.stats.known_load[target_name] += KNOWN_TARGET_LOAD

