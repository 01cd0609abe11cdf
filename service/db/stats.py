"""Aggregate figures of the stored campaign: the overview page's counts and hourly series
(`overview`), the campaign report and per-backend coverage (`campaign_report`,
`backend_coverage`), and the Prometheus snapshot (`metrics_snapshot`). Functions take a
`Session` and return small frozen records; none writes. `known_hits`: the share of the workers'
evaluations spent on known buckets."""

from __future__ import annotations

from collections import defaultdict
import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, literal_column, select, text
from sqlalchemy.orm import Session, joinedload

from fuzzer.severity import SEVERITIES
from service.errors import FieldValidationError
from service.db.findings import limit_groups
from service.db.models import Bucket, Case, CaseHour, Result, ResultHour, ResultTotal, Worker, utcnow
from service.db.repository import MAX_PAGE_SIZE, SEVERITY_ORDER
from service.db.workers import LIVE_WORKER_S, LIVE_WORKER_STATUSES, LiveWorker, is_live_worker


@dataclass(frozen=True)
class HourCount:
    """Distinct cases run, and results stored, in the hour starting at ``hour`` (UTC)."""

    hour: datetime
    cases: int
    results: int


@dataclass(frozen=True)
class Overview:
    """Counts for the front page.

    ``results_by_backend`` maps backend -> status -> count. ``cases_per_hour`` covers the last
    ``hours`` hours, oldest first, zero-filled. The buckets by class: ``buckets_by_severity``
    (every severity of `fuzzer.severity.SEVERITIES`, most severe first, design limits last),
    ``wrong_by_class`` (the ``wrong`` buckets per ``tensor:kind``, most first) and
    ``limit_groups`` (the design-limit buckets' (design, mechanism) groups, `service.db.findings.limit_groups`).
    """

    case_count: int
    result_count: int
    results_by_status: dict[str, int]
    results_by_backend: dict[str, dict[str, int]]
    buckets_by_backend: dict[str, int]
    buckets_by_triage_state: dict[str, int]
    live_workers: list[LiveWorker]
    cases_per_hour: list[HourCount]
    failures_by_backend: dict[str, int] = dataclasses.field(default_factory=dict)
    failures_by_signature: dict[str, int] = dataclasses.field(default_factory=dict)
    buckets_by_severity: dict[str, int] = dataclasses.field(default_factory=dict)
    wrong_by_class: dict[str, int] = dataclasses.field(default_factory=dict)
    limit_groups: int = 0


def _hour_of(session: Session, column: Any) -> Any:
    if session.get_bind().dialect.name == "postgresql":
        # Literals, not bound parameters: PostgreSQL must see the same expression in SELECT and
        # GROUP BY, and two placeholders ($1, $3) are two different expressions to it.
        return func.date_trunc(literal_column("'hour'"), func.timezone(literal_column("'UTC'"), column))
    return func.strftime("%Y-%m-%d %H:00:00", column)


def _as_utc_hour(value: datetime | str) -> datetime:
    if isinstance(value, str):
        value = datetime.strptime(value, "%Y-%m-%d %H:%M:%S")
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def counts_kept_by_the_database(session: Session) -> bool:
    """True on PostgreSQL, where migration 0008's trigger keeps `ResultTotal`, `ResultHour` and
    `CaseHour` (the overview reads them); False on SQLite (it counts ``results``)."""
    return session.get_bind().dialect.name == "postgresql"


_UTC_HOUR = "date_trunc('hour', created_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"


def rebuild_result_counts(session: Session) -> None:
    """Refill `ResultTotal`, `ResultHour` and `CaseHour` from ``results`` (PostgreSQL; nothing
    elsewhere), as migration 0008 first filled them. The trigger follows inserts only, and results
    are never updated or deleted; this is the repair for a database whose results were (a restore
    of ``results`` alone, or a test that moves ``created_at``)."""
    if not counts_kept_by_the_database(session):
        return
    for table in ("result_totals", "result_hours", "case_hours"):
        session.execute(text(f"DELETE FROM {table}"))
    session.execute(text("INSERT INTO result_totals (backend, status, writer, results) "
                         "SELECT backend, status, 0, count(*) FROM results GROUP BY backend, status"))
    session.execute(text(f"INSERT INTO result_hours (hour, writer, results) SELECT {_UTC_HOUR}, 0, count(*) FROM results GROUP BY 1"))
    session.execute(text(f"INSERT INTO case_hours (hour, writer, case_id) SELECT DISTINCT {_UTC_HOUR}, 0, case_id FROM results"))


def result_counts(session: Session) -> list[tuple[str, str, int]]:
    """``(backend, status, results)`` of every stored result: summed from `ResultTotal` where the
    database keeps it (`counts_kept_by_the_database`: a few hundred rows, not 10 million), else
    counted."""
    if counts_kept_by_the_database(session):
        rows = session.execute(
            select(ResultTotal.backend, ResultTotal.status, func.sum(ResultTotal.results))
            .group_by(ResultTotal.backend, ResultTotal.status)
        )
    else:
        rows = session.execute(select(Result.backend, Result.status, func.count()).group_by(Result.backend, Result.status))
    return [(backend, status, int(n)) for backend, status, n in rows]


def _activity(session: Session, start: datetime) -> dict[datetime, tuple[int, int]]:
    """``UTC hour -> (distinct cases, results)`` of the results created from ``start`` on (an hour
    boundary): from `ResultHour` and `CaseHour` where the database keeps them, else counted."""
    if counts_kept_by_the_database(session):
        results = {
            hour: n
            for hour, n in session.execute(
                select(ResultHour.hour, func.sum(ResultHour.results)).where(ResultHour.hour >= start).group_by(ResultHour.hour)
            )
        }
        # DISTINCT then count(*), not count(DISTINCT case_id): PostgreSQL sorts the input of a
        # count(DISTINCT) whatever its order, while the key (hour, case_id, writer) gives these rows
        # in order, so the DISTINCT is an index-only scan that skips repeats (migration 0009)
        seen = select(CaseHour.hour, CaseHour.case_id).where(CaseHour.hour >= start).distinct().subquery()
        cases = {hour: n for hour, n in session.execute(select(seen.c.hour, func.count()).group_by(seen.c.hour))}
        return {_as_utc_hour(h): (int(cases.get(h, 0)), int(n)) for h, n in results.items()}
    hour = _hour_of(session, Result.created_at).label("hour")
    return {
        _as_utc_hour(row.hour): (row.cases, row.results)
        for row in session.execute(
            select(hour, func.count(func.distinct(Result.case_id)).label("cases"), func.count().label("results"))
            .where(Result.created_at >= start)
            .group_by(hour)
        )
    }


def overview(
    session: Session, *, now: datetime | None = None, live_within_s: float = LIVE_WORKER_S, hours: int = 24
) -> Overview:
    """Counts of cases, results and buckets, the live workers and the hourly activity.

    Args:
        now: the reference time (default: the current time), timezone-aware.
        live_within_s: a worker is live if its status is running or stopping and its last
            heartbeat is at most this many seconds old.
        hours: how many hours of activity ``cases_per_hour`` covers (1 to 24 * 31).

    Raises:
        FieldValidationError: ``hours`` out of range.
    """
    if not 1 <= hours <= 24 * 31:
        raise FieldValidationError("hours", f"must be between 1 and {24 * 31}, got {hours}")
    now = now or utcnow()

    results_by_backend: dict[str, dict[str, int]] = defaultdict(dict)
    results_by_status: dict[str, int] = defaultdict(int)
    for backend, status, n in result_counts(session):
        results_by_backend[backend][status] = n
        results_by_status[status] += n

    buckets_by_backend = {
        backend: n
        for backend, n in session.execute(
            select(Bucket.backend, func.count()).group_by(Bucket.backend).order_by(Bucket.backend)
        )
    }
    buckets_by_triage_state = {
        state.value: n
        for state, n in session.execute(select(Bucket.triage_state, func.count()).group_by(Bucket.triage_state))
    }

    workers = session.scalars(
        select(Worker)
        .where(is_live_worker(now, live_within_s))
        .options(joinedload(Worker.build))
        .order_by(Worker.last_heartbeat.desc(), Worker.id)
    ).all()
    live = [LiveWorker(w, max(0.0, (now - w.last_heartbeat).total_seconds())) for w in workers]

    start = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours - 1)
    counts = _activity(session, start)
    per_hour = [HourCount(h, *counts.get(h, (0, 0))) for h in (start + timedelta(hours=i) for i in range(hours))]

    return Overview(
        case_count=session.scalar(select(func.count()).select_from(Case)) or 0,
        result_count=sum(results_by_status.values()),
        results_by_status=dict(sorted(results_by_status.items())),
        results_by_backend={b: dict(sorted(s.items())) for b, s in sorted(results_by_backend.items())},
        buckets_by_backend=buckets_by_backend,
        buckets_by_triage_state=buckets_by_triage_state,
        live_workers=live,
        cases_per_hour=per_hour,
        failures_by_backend=_failures_by(session, Bucket.backend),
        failures_by_signature=_failures_by(session, Bucket.signature, limit=TOP_SIGNATURES),
        **_buckets_by_class(session),
    )


def _buckets_by_class(session: Session) -> dict[str, Any]:
    """`Overview`'s ``buckets_by_severity``, ``wrong_by_class`` and ``limit_groups``."""
    counted = dict(session.execute(select(Bucket.severity, func.count()).group_by(Bucket.severity)).all())
    by_severity = {name: int(counted.pop(name, 0)) for name in SEVERITIES} | {k: int(n) for k, n in sorted(counted.items())}
    n = func.count()
    wrong = {
        signature: int(count)
        for signature, count in session.execute(
            select(Bucket.signature, n).where(Bucket.severity == "wrong").group_by(Bucket.signature).order_by(n.desc(), Bucket.signature)
        )
    }
    groups = len(limit_groups(session)) if by_severity.get("limit") else 0
    return {"buckets_by_severity": by_severity, "wrong_by_class": wrong, "limit_groups": groups}


TOP_SIGNATURES = 12


def _failures_by(session: Session, column: Any, limit: int | None = None) -> dict[str, int]:
    """Failing results per value of a bucket column (from the buckets' hit counts), largest first."""
    total = func.sum(Bucket.hit_count)
    query = select(column, total).group_by(column).order_by(total.desc(), column)
    if limit is not None:
        query = query.limit(limit)
    return {key: int(n) for key, n in session.execute(query)}


@dataclass(frozen=True)
class BackendTiming:
    """Time spent per backend over all stored results, milliseconds."""

    backend: str
    results: int
    run_ms: float
    compile_ms: float


@dataclass(frozen=True)
class CampaignReport:
    """What a campaign found: counts, times and every bucket with its minimised case.

    ``oracle_ms`` counts each case's float64 reference once (results of one case share it).
    """

    overview: Overview
    timings: list[BackendTiming]
    oracle_ms: float
    buckets: list[Bucket]


def campaign_report(session: Session) -> CampaignReport:
    """Counts, per-backend kernel and JIT times, the oracle's time and all buckets (with their
    first and minimised cases loaded), for ``attnfuzz report``."""
    timings = [
        BackendTiming(backend, n, float(run or 0.0), float(comp or 0.0))
        for backend, n, run, comp in session.execute(
            select(Result.backend, func.count(), func.sum(Result.run_ms), func.sum(Result.compile_ms))
            .where(Result.status != "unsupported")
            .group_by(Result.backend)
            .order_by(Result.backend)
        )
    ]
    per_case = (
        select(func.max(Result.oracle_ms).label("oracle_ms")).group_by(Result.case_id, Result.phase).subquery()
    )
    oracle_ms = float(session.scalar(select(func.sum(per_case.c.oracle_ms))) or 0.0)
    buckets = session.scalars(
        select(Bucket)
        .options(joinedload(Bucket.first_case), joinedload(Bucket.minimised_case))
        .order_by(SEVERITY_ORDER.desc(), Bucket.backend, Bucket.variant, Bucket.signature)
    ).all()
    return CampaignReport(overview(session), timings, oracle_ms, list(buckets))


@dataclass(frozen=True)
class KnownHits:
    """How much of the fuzzing went to buckets already known, summed over the stored workers
    (their last heartbeats: `fuzzer.worker.WorkerStats` ``evaluations`` and ``known_hits``).

    Attributes:
        evaluations: fuzz evaluations (results that ran, not ``unsupported``).
        known_hits: those that failed in a bucket known before their evaluation.
    """

    evaluations: int
    known_hits: int

    @property
    def known_share(self) -> float:
        """``known_hits / evaluations`` (0 without evaluations)."""
        return self.known_hits / self.evaluations if self.evaluations > 0 else 0.0


def known_hits(session: Session) -> KnownHits:
    """`KnownHits` of every ``workers`` row (workers of a revision before 0007 count 0)."""
    evaluations, hits = session.execute(select(func.sum(Worker.evaluations), func.sum(Worker.known_hits))).one()
    return KnownHits(int(evaluations or 0), int(hits or 0))


@dataclass(frozen=True)
class BackendCoverage:
    """How much of the drawn case space one backend ran, from the stored results.

    Attributes:
        backend: the backend name.
        cases: distinct cases with a result of this backend (any status, any phase).
        cases_run: distinct cases with at least one result of this backend that is not
            ``unsupported`` (it ran at least one variant).
        top_unsupported: ``(reason, results)`` pairs, most frequent first: the reasons of its
            ``unsupported`` results (`fuzzer.coverage.reason_keys`: a field's own value replaced
            by ``N``), each counted once per result.
    """

    backend: str
    cases: int
    cases_run: int
    top_unsupported: list[tuple[str, int]]


def backend_coverage(session: Session, top: int = 3) -> list[BackendCoverage]:
    """Per backend (by name): cases seen, cases run and the ``top`` unsupported reasons, for
    ``attnfuzz report``. Reads the ``results`` table in three grouped queries; reasons are split
    and counted in Python over the distinct (backend, detail) pairs."""
    from fuzzer.coverage import reason_keys

    seen = dict(
        session.execute(select(Result.backend, func.count(func.distinct(Result.case_id))).group_by(Result.backend)).all()
    )
    ran = dict(
        session.execute(
            select(Result.backend, func.count(func.distinct(Result.case_id)))
            .where(Result.status != "unsupported")
            .group_by(Result.backend)
        ).all()
    )
    reasons: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for backend, detail, n in session.execute(
        select(Result.backend, Result.detail, func.count())
        .where(Result.status == "unsupported")
        .group_by(Result.backend, Result.detail)
    ):
        for reason in reason_keys(detail or ""):
            reasons[backend][reason] += int(n)
    rows = []
    for backend in sorted(seen):
        ranked = sorted(reasons.get(backend, {}).items(), key=lambda rc: (-rc[1], rc[0]))[:top]
        rows.append(BackendCoverage(backend, int(seen[backend]), int(ran.get(backend, 0)), ranked))
    return rows




@dataclass(frozen=True)
class MetricsSnapshot:
    """What ``/metrics`` exports, read in one go.

    ``results`` maps (backend, status) -> count; ``buckets`` (backend, triage_state) -> count;
    ``bucket_hits`` (backend, variant, signature) -> failing results; ``workers`` every worker
    heard from within ``window_s`` with its heartbeat age.
    """

    cases: int
    results: dict[tuple[str, str], int]
    buckets: dict[tuple[str, str], int]
    bucket_hits: dict[tuple[str, str, str], int]
    workers: list[LiveWorker]
    live_workers: int


def metrics_snapshot(
    session: Session, *, now: datetime | None = None, live_within_s: float = LIVE_WORKER_S, window_s: float = 86_400.0
) -> MetricsSnapshot:
    """Counts for Prometheus (see `MetricsSnapshot`)."""
    now = now or utcnow()
    results = {(backend, status): n for backend, status, n in result_counts(session)}
    buckets = {
        (backend, state.value): n
        for backend, state, n in session.execute(
            select(Bucket.backend, Bucket.triage_state, func.count()).group_by(Bucket.backend, Bucket.triage_state)
        )
    }
    hits = {
        (b.backend, b.variant, b.signature): b.hit_count
        for b in session.execute(select(Bucket.backend, Bucket.variant, Bucket.signature, Bucket.hit_count))
    }
    now = now or utcnow()
    recent = [
        LiveWorker(w, max(0.0, (now - w.last_heartbeat).total_seconds()))
        for w in session.scalars(
            select(Worker)
            .where(Worker.last_heartbeat >= now - timedelta(seconds=window_s))
            .order_by(Worker.last_heartbeat.desc(), Worker.id)
            .limit(MAX_PAGE_SIZE)
        )
    ]
    return MetricsSnapshot(
        cases=session.scalar(select(func.count()).select_from(Case)) or 0,
        results=results,
        buckets=buckets,
        bucket_hits=hits,
        workers=recent,
        live_workers=sum(
            1 for w in recent if w.heartbeat_age_s <= live_within_s and w.worker.status in LIVE_WORKER_STATUSES
        ),
    )
