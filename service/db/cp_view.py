"""Context-parallel results beside the non-CP results of the same case: one query function.

A CP case (``cp_size > 1``) and its *non-CP twin* (the same case with ``cp_size=1,
cp_comm_type=None``) share inputs and oracle, so their results on one backend variant and build
can be read side by side. `cp_view` finds, from either side, the twin and every stored CP sibling
(the twin with any ``cp_size`` in ``2..64`` and comm type; their ids are content hashes, so no
JSON is scanned) and pairs their results by ``(backend, variant, build)``.

Each pair is marked ``agree_but_both_wrong`` when CP and non-CP agree with each other and both
fail the float64 oracle: the seed's blind spot, where a CP-vs-non-CP test passes on a kernel that
is wrong with and without CP. Agreement is read from the CP result's ``metrics["cp"]``
(``agrees_with_non_cp``, measured by the worker on the tensors, `fuzzer.cp.judge.judge_cp`; basis
``"tensors"``); results stored without it fall back to "both fail with the same primary
signature" (basis ``"signatures"``, weaker: equal signatures need not mean equal outputs).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, joinedload

from fuzzer.results import FAILING_STATUSES
from oracle.config import CP_COMM_TYPES, AttentionCase
from service.db.models import Case, Result

#: The key of the CP block in ``Result.metrics``: `fuzzer.cp.judge.CP_METRICS_KEY` (service imports only
#: oracle.config and fuzzer.results; tests/service/test_cp_view.py checks the two agree).
CP_METRICS_KEY = "cp"
MAX_CP_SIZE = 64  # AttentionCase allows 1 <= cp_size <= 64


@dataclass(frozen=True)
class CPPair:
    """One backend variant on one build: its result on a CP case and on the non-CP twin.

    Attributes:
        backend, variant, build_id: the key both results share.
        cp_result: the latest result of the CP case for that key.
        non_cp_result: the latest result of the twin for that key, None when none is stored.
        agrees_with_non_cp: from ``cp_result.metrics["cp"]`` (None when not measured).
        both_fail: both results fail the oracle (statuses in ``FAILING_STATUSES``); the twin's
            status comes from ``metrics["cp"]["non_cp_status"]`` when its row is missing; None
            when unknown.
        agree_but_both_wrong: they agree and both fail (see the module docstring).
        basis: ``"tensors"`` (measured agreement), ``"signatures"`` (fallback) or None (unknown).
    """

    backend: str
    variant: str
    build_id: int
    cp_result: Result
    non_cp_result: Result | None
    agrees_with_non_cp: bool | None
    both_fail: bool | None
    agree_but_both_wrong: bool
    basis: str | None


@dataclass(frozen=True)
class CPCaseView:
    """One stored CP case of the family and its pairs (sorted by backend, variant, build)."""

    case: Case
    cp_size: int
    cp_comm_type: str
    pairs: list[CPPair]

    @property
    def has_blind_spot(self) -> bool:
        """Some pair agrees with non-CP while both fail the oracle."""
        return any(p.agree_but_both_wrong for p in self.pairs)


@dataclass(frozen=True)
class CPView:
    """A non-CP case and its stored CP siblings, results side by side.

    Attributes:
        non_cp_case_id: the twin's id (whether or not it is stored).
        non_cp_case: the twin's row, None when it was never stored.
        non_cp_results: the twin's results (build loaded), oldest first.
        cp_cases: every stored CP sibling, by ``cp_size`` then comm type.
    """

    non_cp_case_id: str
    non_cp_case: Case | None
    non_cp_results: list[Result]
    cp_cases: list[CPCaseView]

    @property
    def has_blind_spot(self) -> bool:
        """Some CP sibling has a pair that agrees with non-CP while both fail the oracle."""
        return any(c.has_blind_spot for c in self.cp_cases)


def _cp_siblings(base: AttentionCase) -> list[str]:
    """Ids of ``base`` with every ``cp_size`` in ``2..MAX_CP_SIZE`` and every valid comm type."""
    ids = []
    for size in range(2, MAX_CP_SIZE + 1):
        for comm in CP_COMM_TYPES:
            if comm == "a2a+p2p" and size < 4:
                continue
            ids.append(base.replace(cp_size=size, cp_comm_type=comm).case_id)
    return ids


def _latest(results: list[Result]) -> dict[tuple[str, str, int], Result]:
    """The latest result per ``(backend, variant, build_id)`` of results sorted oldest first."""
    latest: dict[tuple[str, str, int], Result] = {}
    for result in results:
        latest[(result.backend, result.variant, result.build_id)] = result
    return latest


def _pair(key: tuple[str, str, int], cp_result: Result, non_cp_result: Result | None) -> CPPair:
    block = cp_result.metrics.get(CP_METRICS_KEY) if isinstance(cp_result.metrics, dict) else None
    block = block if isinstance(block, dict) else {}
    agrees = block.get("agrees_with_non_cp")
    agrees = agrees if isinstance(agrees, bool) else None
    non_cp_status = non_cp_result.status if non_cp_result is not None else block.get("non_cp_status")
    both_fail = None if non_cp_status is None else (cp_result.status in FAILING_STATUSES and non_cp_status in FAILING_STATUSES)
    if agrees is not None:
        flagged, basis = bool(agrees and both_fail), "tensors"
    elif non_cp_result is not None and both_fail is not None:
        flagged = bool(both_fail and cp_result.signature == non_cp_result.signature)
        basis = "signatures"
    else:
        flagged, basis = False, None
    return CPPair(
        backend=key[0], variant=key[1], build_id=key[2], cp_result=cp_result, non_cp_result=non_cp_result,
        agrees_with_non_cp=agrees, both_fail=both_fail, agree_but_both_wrong=flagged, basis=basis,
    )


def cp_view(session: Session, case_id: str) -> CPView | None:
    """The CP family of a case: its non-CP twin and every stored CP sibling, results paired.

    Args:
        session: a database session.
        case_id: any case of the family (CP or not).

    Returns:
        `CPView`, or None when no case has this id. A family without stored CP cases has an
        empty ``cp_cases``.

    Raises:
        oracle.errors.CaseValidationError: the stored case no longer validates (older schema).
    """
    row = session.get(Case, case_id)
    if row is None:
        return None
    attention = row.to_attention_case()
    base = attention if attention.cp_size == 1 else attention.replace(cp_size=1, cp_comm_type=None)
    sibling_ids = _cp_siblings(base)
    cp_rows = session.scalars(select(Case).where(Case.id.in_(sibling_ids))).all()
    non_cp_row = session.get(Case, base.case_id)
    ids = [base.case_id] + [c.id for c in cp_rows]
    results = session.scalars(
        select(Result).where(Result.case_id.in_(ids)).options(joinedload(Result.build)).order_by(Result.created_at, Result.id)
    ).all()
    by_case: dict[str, list[Result]] = {}
    for result in results:
        by_case.setdefault(result.case_id, []).append(result)
    non_cp_results = by_case.get(base.case_id, [])
    non_cp_latest = _latest(non_cp_results)
    cp_cases = []
    for cp_row in cp_rows:
        cp_case = cp_row.to_attention_case()
        latest = _latest(by_case.get(cp_row.id, []))
        pairs = [_pair(key, latest[key], non_cp_latest.get(key)) for key in sorted(latest)]
        cp_cases.append(CPCaseView(case=cp_row, cp_size=cp_case.cp_size, cp_comm_type=cp_case.cp_comm_type, pairs=pairs))
    cp_cases.sort(key=lambda c: (c.cp_size, CP_COMM_TYPES.index(c.cp_comm_type)))
    return CPView(non_cp_case_id=base.case_id, non_cp_case=non_cp_row, non_cp_results=list(non_cp_results), cp_cases=cp_cases)


__all__ = ["CP_METRICS_KEY", "CPCaseView", "CPPair", "CPView", "cp_view"]
