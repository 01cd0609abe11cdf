"""Known buckets: the hit budget of a bucket already found, and the draw weights that move the
fuzzing away from the spent ones (issue 34 item 4).

Why: on the H200 (2026-12-03, 24321c7) te-unfused failed 3,887 of its 8,792 evaluations, 810 of
them on one bucket: the worker kept finding what it already had. A bucket whose case is
minimised and confirmed says all it has to say; more hits on it are spent evaluations.

The budget. A bucket is *budgeted* once it is minimised and confirmed (`fuzzer.worker.Worker`
minimised it, status ``minimised`` or ``unchanged``, or attached it to a minimised case; the sink
says it is minimised, `fuzzer.results.BucketUpdate.minimised`; or its severity is ``limit``,
from its first hit: a design's limit is no claim against a kernel and is never shrunk). From then
on each fuzz hit on it counts toward ``budget`` further hits (`KnownBuckets.hit`); past the budget
the bucket is *spent*. Counts are per worker: a bucket minimised elsewhere (another worker, an
earlier run) is budgeted at the first hit this worker sees, so ``N`` workers give it at most ``N``
budgets.

Moving away (pure functions of the worker's counts, rebuilt per chunk):

* targets: each fuzz case drawn for a target that hit a spent bucket adds `KNOWN_TARGET_LOAD` to
  that target's load in `fuzzer.coverage.target_plan`, so a target whose cases keep hitting
  spent buckets gets about ``1 / (1 + KNOWN_TARGET_LOAD)`` of its share of the draws; it still
  gets slots as the others' loads grow;
* input families (`FAMILIES`): `family_weights` gives each family a weight in ``[MIN_WEIGHT,
  FULL_WEIGHT]`` from the share of its recent cases (`FAMILY_WINDOW`) that hit a spent bucket:
  about ``FULL_WEIGHT * (1 - share)`` (a power of two), never below `MIN_WEIGHT`; `fuzzer.strategies.input_specs` draws a
  family with its default share times ``weight / FULL_WEIGHT``, so a family is drawn less, never
  not at all (at `MIN_WEIGHT` one draw in 16 of its default share).

Counts (`fuzzer.worker.WorkerStats`): ``evaluations`` (fuzz results that ran: not ``unsupported``)
and ``known_hits`` (those that failed in a bucket known before the evaluation: stored, or seen by
this worker); ``known_share`` is their ratio.

Pure stdlib (no torch, no Hypothesis).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

KNOWN_HIT_BUDGET = 20
"""Default of `fuzzer.worker.WorkerConfig.known_hit_budget`: fuzz hits a budgeted bucket gets
before it is spent (enough to see that a bucket's minimised case is not a fluke of one case, few
next to the 810 hits of one te-unfused bucket in a 600 s campaign)."""
FAMILIES = (
    "score_offset",
    "qk_rank",
    "massive_channels",
    "attention_sink",
    "seq_scale_log2",
    "peaked_rows",
    "dout_distribution",
)
"""The input families whose draw weights adapt: the fields of `oracle.config.INPUT_FAMILY_DEFAULTS`
that turn a family on (``score_offset_mode`` only qualifies ``score_offset``)."""
FULL_WEIGHT = 16
"""A family's weight when its cases hit no spent bucket: its default share of the draws."""
MIN_WEIGHT = 1
"""The lowest weight: a family is drawn at ``MIN_WEIGHT / FULL_WEIGHT`` of its default share,
never not at all (every family stays reachable, so a new bug under it is still found)."""
FAMILY_WINDOW = 16
"""How many of a family's most recent fuzz cases its weight is computed from."""
MIN_FAMILY_CASES = 4
"""A family's weight stays `FULL_WEIGHT` until it has this many recent cases."""
KNOWN_TARGET_LOAD = 3.0
"""Extra load (`fuzzer.coverage.target_plan`) of a target per case drawn for it that hit a
spent bucket: such a case counts as ``1 + KNOWN_TARGET_LOAD`` draws."""


def case_families(case: Any) -> tuple[str, ...]:
    """The `FAMILIES` that ``case`` (an `oracle.config.AttentionCase`) has on, in `FAMILIES` order."""
    on = case.input_families
    return tuple(name for name in FAMILIES if name in on)


def family_weights(recent: Mapping[str, Sequence[bool]]) -> dict[str, int]:
    """The draw weight of each family from its recent cases.

    Args:
        recent: family name -> whether each of its recent fuzz cases (oldest first) hit a spent
            bucket; families not in it have no cases yet.

    Returns:
        ``{family: weight}`` for every name of `FAMILIES`: ``FULL_WEIGHT * (1 - share)`` rounded
        to the nearest power of two (in log scale) and clamped to ``[MIN_WEIGHT, FULL_WEIGHT]``,
        ``share`` the fraction of the last `FAMILY_WINDOW` cases that hit a spent bucket (a
        quarter: 16, a half: 8, 0.8: 4, 0.9: 2, 15 in 16 or more: 1); `FULL_WEIGHT` with fewer than
        `MIN_FAMILY_CASES` cases. Powers of two: few distinct weights, so the worker's per-chunk
        strategies (cached by their arguments) change only when a share moves by a step.
    """
    weights = {}
    for name in FAMILIES:
        seen = list(recent.get(name, ()))[-FAMILY_WINDOW:]
        if len(seen) < MIN_FAMILY_CASES:
            weights[name] = FULL_WEIGHT
            continue
        share = sum(1 for hit in seen if hit) / len(seen)
        raw = FULL_WEIGHT * (1.0 - share)
        weight = MIN_WEIGHT if raw < MIN_WEIGHT else 2 ** round(math.log2(raw))
        weights[name] = max(MIN_WEIGHT, min(FULL_WEIGHT, weight))
    return weights


def reduced_weights(weights: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """The entries of ``weights`` below `FULL_WEIGHT`, in `FAMILIES` order: the hashable argument
    of `fuzzer.strategies.input_specs` (empty: every family at its default share, the draw as
    without weights)."""
    return tuple((name, int(weights[name])) for name in FAMILIES if weights.get(name, FULL_WEIGHT) < FULL_WEIGHT)


@dataclass
class _Budget:
    """One budgeted bucket: the fuzz hits counted since it was budgeted."""

    hits: int = 0


class KnownBuckets:
    """The buckets a worker knows, which are budgeted, and how many further hits each had.

    Args:
        budget: further fuzz hits a budgeted bucket gets before it is spent (`KNOWN_HIT_BUDGET`
            by default in the worker); None: no budget, nothing is ever spent.
        stored: bucket keys ``(backend, variant, signature)`` already stored when the worker
            starts (known, not budgeted until minimised or seen minimised).

    Raises:
        ValueError: ``budget`` is negative or not an integer.
    """

    def __init__(self, budget: int | None, stored: Iterable[tuple[str, str, str]] = ()):
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
            raise ValueError(f"budget: must be an integer >= 0 or None, got {budget!r}")
        self.budget = budget
        self._known: set[tuple[str, str, str]] = set(stored)
        self._budgets: dict[tuple[str, str, str], _Budget] = {}

    def is_known(self, key: tuple[str, str, str]) -> bool:
        """Whether ``key`` was stored when the worker started or has been seen since."""
        return key in self._known

    def add(self, key: tuple[str, str, str]) -> None:
        """``key`` is known from now on."""
        self._known.add(key)

    def start_budget(self, key: tuple[str, str, str]) -> None:
        """``key`` is minimised and confirmed (or a design's limit): its further hits count from
        now (a bucket already budgeted keeps its count)."""
        self._known.add(key)
        self._budgets.setdefault(key, _Budget())

    def is_budgeted(self, key: tuple[str, str, str]) -> bool:
        return key in self._budgets

    def hits(self, key: tuple[str, str, str]) -> int:
        """The fuzz hits counted toward ``key``'s budget (0 for a bucket not budgeted)."""
        budget = self._budgets.get(key)
        return 0 if budget is None else budget.hits

    def hit(self, key: tuple[str, str, str]) -> bool:
        """Count one fuzz hit on ``key`` (a budgeted bucket; others are only marked known).
        Returns whether ``key`` is spent after it (`is_spent`)."""
        self._known.add(key)
        budget = self._budgets.get(key)
        if budget is not None:
            budget.hits += 1
        return self.is_spent(key)

    def is_spent(self, key: tuple[str, str, str]) -> bool:
        """Whether ``key`` is budgeted and has had more than ``budget`` further hits."""
        budget = self._budgets.get(key)
        return self.budget is not None and budget is not None and budget.hits > self.budget

    @property
    def spent(self) -> list[tuple[str, str, str]]:
        """The spent buckets, in the order they were budgeted."""
        return [key for key in self._budgets if self.is_spent(key)]


class FamilyHistory:
    """The recent fuzz cases of each input family: whether each hit a spent bucket (the input
    of `family_weights`), at most `FAMILY_WINDOW` per family."""

    def __init__(self) -> None:
        self.recent: dict[str, deque[bool]] = {}

    def add(self, families: Iterable[str], hit_spent: bool) -> None:
        """One fuzz case with ``families`` on, which hit a spent bucket or not."""
        for name in families:
            self.recent.setdefault(name, deque(maxlen=FAMILY_WINDOW)).append(hit_spent)

    def weights(self) -> dict[str, int]:
        """`family_weights` of the history."""
        return family_weights(self.recent)
