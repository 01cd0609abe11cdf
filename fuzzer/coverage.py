"""Which backends the draws reach: the target policy of backend-aware draws, and per-backend
runnable cases and unsupported reasons (counted live by the worker, read back by ``attnfuzz
report``).

Backend-aware ("targeted") draws: each case is drawn for one *target* backend, inside its declared
`fuzzer.backends.base.Capabilities`, then run on every selected backend that supports it. Which
backend is the target is decided per Hypothesis chunk by `target_plan`, a pure function of the
counts so far. Pure stdlib: the service imports this module too.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

DRAW_MODES = ("targeted", "union")
"""``targeted``: each case drawn for one backend's capabilities (`target_plan` picks which);
``union``: each case drawn for the union of the selected backends' capabilities."""


def target_plan(
    names: Sequence[str],
    runnable: Mapping[str, int],
    drawn: Mapping[str, int],
    slots: int,
    rotation: int = 0,
    known_load: Mapping[str, float] | None = None,
) -> list[str]:
    """The targets of the next ``slots`` draws: each slot goes, in turn, to the backend with the
    smallest ``max(runnable[b], drawn[b]) + known_load[b] + (slots already given to b in this
    plan)``.

    ``runnable[b]`` counts the cases ``b`` ran so far (drawn for it or not), ``drawn[b]`` the cases
    drawn for it. Taking the larger of the two favours the backends that run the fewest cases
    (they are rarely covered by the other backends' draws), while a backend whose drawn cases do
    not run (limits its capabilities do not declare) is not the target forever: its own draws
    count too. Ties go to the first of ``names`` rotated left by ``rotation`` (the worker passes
    the chunk number, so equal backends take turns). The first slot is the most favoured backend
    (Hypothesis shrinks a ``sampled_from`` toward it).

    ``known_load[b]`` is what the cases drawn for ``b`` spent on known buckets
    (`fuzzer.known.KNOWN_TARGET_LOAD` per case that hit a spent bucket): a backend whose cases
    keep finding what is known is drawn for less, and still drawn for once the others' counts
    have grown by as much.

    Args:
        names: the candidate backends (available and selected), at least one.
        runnable, drawn: counts per backend name (missing = 0).
        slots: how many targets to plan, at least 1.
        rotation: tie-break offset.
        known_load: extra load per backend name (missing = 0; None: none).

    Returns:
        ``slots`` names, each in ``names``; every name appears when ``slots >= len(names)`` and
        all counts are equal.

    Raises:
        ValueError: ``names`` is empty or ``slots < 1``.
    """
    if not names:
        raise ValueError("names: need at least one backend")
    if slots < 1:
        raise ValueError(f"slots: must be >= 1, got {slots}")
    order = list(names[rotation % len(names) :]) + list(names[: rotation % len(names)])
    extra = known_load or {}
    load = {n: max(runnable.get(n, 0), drawn.get(n, 0)) + extra.get(n, 0.0) for n in order}
    plan = []
    for _ in range(slots):
        best = min(order, key=lambda n: load[n])  # min keeps the first of equals
        plan.append(best)
        load[best] += 1
    return plan


_NUMBERED_FIELD = re.compile(r"\b(batch_size|seqlen_q|seqlen_k|num_heads|num_heads_kv|head_dim|head_dim_v|total_q|total_k) \d+")


def reason_keys(detail: str) -> list[str]:
    """The reasons in an ``unsupported`` result's detail (`Backend.unsupported_reasons` joined by
    ``"; "``), with a field's own value replaced by ``N`` (``"head_dim 191 not a multiple of 8"``
    -> ``"head_dim N not a multiple of 8"``) so that one limit counts as one reason. Empty or
    blank parts are dropped; an empty detail gives ``["(no reason given)"]``."""
    parts = [_NUMBERED_FIELD.sub(r"\1 N", p.strip()) for p in (detail or "").split("; ")]
    parts = [p for p in parts if p]
    return parts or ["(no reason given)"]


def top_reasons(counts: Mapping[tuple[str, str], int], backend: str, n: int = 3) -> list[tuple[str, int]]:
    """The ``n`` most frequent reasons of ``backend`` in ``counts`` (``(backend, reason) -> count``),
    most frequent first, ties by reason text."""
    mine = [(reason, c) for (b, reason), c in counts.items() if b == backend]
    mine.sort(key=lambda rc: (-rc[1], rc[0]))
    return mine[:n]


def count_case(results: Iterable, runnable: Counter, reasons: Counter) -> None:
    """Add one case's results to the per-backend counters: ``runnable[backend] += 1`` once per
    backend with at least one result not ``unsupported``, ``reasons[(backend, reason)] += 1`` per
    reason (`reason_keys`) of each ``unsupported`` result. ``results`` are
    `fuzzer.results.CaseResult`-like (``backend``, ``status``, ``detail``)."""
    ran = set()
    for r in results:
        if r.status == "unsupported":
            for reason in reason_keys(r.detail):
                reasons[(r.backend, reason)] += 1
        else:
            ran.add(r.backend)
    for backend in ran:
        runnable[backend] += 1


def format_reasons(top: Sequence[tuple[str, int]], width: int = 60) -> str:
    """``"reason (count); reason (count)"`` cut to ``width`` characters (for tables)."""
    text = "; ".join(f"{reason} ({count})" for reason, count in top)
    return text if len(text) <= width else text[: width - 3] + "..."
