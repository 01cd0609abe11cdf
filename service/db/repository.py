"""The queries of buckets, cases, results, repros, builds and workers that the pages, the JSON API
and the CLI run (aggregate figures are `service.db.stats`, ingestion `service.db.ingest`).
Routers never build queries.

Functions take a `Session` and return ORM rows (with exactly the relationships they need loaded;
all relationships are ``lazy="raise"``) or small frozen records. Writes (`update_triage`) flush
but do not commit: the caller owns the transaction.
"""

from __future__ import annotations

from collections import defaultdict
import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import ColumnElement, Select, func, select, tuple_
from sqlalchemy import case as sql_case
from sqlalchemy.orm import Session, joinedload, selectinload

from fuzzer.results import FAILING_STATUSES
from fuzzer.severity import LIMIT_KINDS, SEVERITIES, SEVERITY_RANK, signature_kind
from fuzzer.text import did_you_mean
from oracle import mask_kinds
from service.errors import FieldValidationError, NotFoundError
from service.db.models import Bucket, Build, Case, Result, TriageState, Worker, utcnow
from service.db.workers import LIVE_WORKER_S, LiveWorker, is_live_worker

SEVERITY_ORDER = sql_case(SEVERITY_RANK, value=Bucket.severity, else_=0)
"""A bucket's `fuzzer.severity.SEVERITY_RANK` in SQL: larger is more severe."""
BUCKET_SORT_COLUMNS = {
    "severity": SEVERITY_ORDER,
    "last_seen": Bucket.last_seen,
    "first_seen": Bucket.first_seen,
    "hit_count": Bucket.hit_count,
    "id": Bucket.id,
    "backend": Bucket.backend,
    "signature": Bucket.signature,
    "triage_state": Bucket.triage_state,
}
MASKS = mask_kinds.mask_filters()
"""Mask kinds to filter on: no mask, causal only, a sliding window only, causal plus a window
(`oracle.mask_kinds.mask_filters`: every combination of the declared kinds' filter words)."""
BUCKET_SORTS = tuple(f"{prefix}{name}" for name in BUCKET_SORT_COLUMNS for prefix in ("-", ""))
DEFAULT_BUCKET_SORT = "-severity"
"""Most severe first (`fuzzer.severity`); buckets of one severity newest first."""
MAX_PAGE_SIZE = 500
MAX_URL_LENGTH = 2000
MAX_NOTES_LENGTH = 100_000
class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
"""Marks an `update_triage` argument that was not given (None means "clear")."""


# ---------------------------------------------------------------------------------- buckets
LIMIT_VIEWS = ("apart", "with")
"""How a bucket list shows design limits (severity ``limit``, `fuzzer.severity`): ``apart`` leaves
them out of the items and the total and counts them in ``limit_total`` (the pages and the API show
them folded, grouped by design and mechanism: `service.db.findings.limit_groups`); ``with`` lists
them among the others (last, by severity)."""


@dataclass(frozen=True)
class BucketPage:
    """One page of buckets and the number of buckets matching the filters; ``limit_total`` counts the
    design-limit buckets matching the filters other than ``severity`` (in the page or not)."""

    items: list[Bucket]
    total: int
    limit: int
    offset: int
    limit_total: int = 0


def _bucket_filters(
    backend: str | None,
    variant: str | None,
    signature: str | None,
    triage_state: TriageState | str | None,
    dtype: str | None = None,
    head_dim: int | None = None,
    mask: str | None = None,
    build_id: int | None = None,
    defect_id: int | None = None,
) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = []
    if defect_id is not None:
        conditions.append(Bucket.defect_id == defect_id)
    if backend:
        conditions.append(Bucket.backend == backend)
    if variant:
        conditions.append(Bucket.variant == variant)
    if signature:
        conditions.append(Bucket.signature.contains(signature, autoescape=True))
    if triage_state:
        conditions.append(Bucket.triage_state == _triage_state(triage_state))
    if build_id is not None:
        conditions.append(_has_result(Result.build_id == build_id))
    case_conditions: list[ColumnElement[bool]] = []
    if dtype:
        case_conditions.append(Case.dtype == dtype)
    if head_dim is not None:
        case_conditions.append(Case.head_dim == head_dim)
    if mask:
        try:
            columns = mask_kinds.filter_conditions(mask)  # the declared kinds' columns (`oracle.mask_kinds`)
        except ValueError as exc:
            raise FieldValidationError("mask", str(exc)) from None
        case_conditions.extend(getattr(Case, column) == on for column, on in columns.items())
    if case_conditions:
        conditions.append(_has_result(*case_conditions, with_case=True))
    return conditions


def _has_result(*conditions: ColumnElement[bool], with_case: bool = False) -> ColumnElement[bool]:
    """The bucket's key is among the keys of failing results meeting ``conditions`` (a semi-join
    the planner may drive from either side: from the few matching cases through the results'
    ``(case_id, ...)`` unique index, or from the results)."""
    query = select(Result.backend, Result.variant, Result.signature).where(Result.signature.is_not(None), *conditions)
    if with_case:
        query = query.join(Case, Case.id == Result.case_id)
    return tuple_(Bucket.backend, Bucket.variant, Bucket.signature).in_(query)


def _triage_state(value: Any) -> TriageState:
    try:
        return TriageState(value)
    except ValueError:
        allowed = ", ".join(s.value for s in TriageState)
        raise FieldValidationError("triage_state", f"unknown value {value!r} (allowed: {allowed})") from None


def list_buckets(
    session: Session,
    *,
    backend: str | None = None,
    variant: str | None = None,
    signature: str | None = None,
    triage_state: TriageState | str | None = None,
    dtype: str | None = None,
    head_dim: int | None = None,
    mask: str | None = None,
    build_id: int | None = None,
    defect_id: int | None = None,
    severity: str | None = None,
    limits: str = "with",
    sort: str = DEFAULT_BUCKET_SORT,
    limit: int = 50,
    offset: int = 0,
) -> BucketPage:
    """Buckets matching every filter given, sorted, one page; ``first_build`` and ``last_build``
    are loaded.

    Args:
        backend, variant: exact matches.
        signature: a substring of the signature.
        triage_state: one of `TriageState`.
        dtype, head_dim, mask: the bucket has a failing result on a case with this dtype, this
            head_dim, this mask kind (one of ``MASKS``).
        build_id: the bucket has a failing result on this build.
        defect_id: the bucket is in this root-cause group (`service.db.models.Defect`).
        severity: only buckets of this severity (one of `fuzzer.severity.SEVERITIES`).
        limits: without ``severity``, `LIMIT_VIEWS`: ``apart`` leaves the design limits out
            (counted in ``limit_total``), ``with`` lists them too.
        sort: a column of ``BUCKET_SORT_COLUMNS``, prefixed with ``-`` for descending; ties are
            broken by id so pages never overlap (``severity``: by ``last_seen`` first, newest
            first, then id). ``severity`` sorts by rank: ``-severity`` puts ``wrong`` first.
        limit: page size, 1 to ``MAX_PAGE_SIZE``.
        offset: buckets to skip, >= 0.

    Raises:
        FieldValidationError: a bad ``sort``, ``limit``, ``offset``, ``triage_state``, ``mask``,
            ``severity`` or ``limits``.
    """
    if severity is not None and severity not in SEVERITIES:
        raise FieldValidationError("severity", f"unknown value {severity!r} (allowed: {', '.join(SEVERITIES)})")
    if limits not in LIMIT_VIEWS:
        raise FieldValidationError("limits", f"unknown value {limits!r} (allowed: {', '.join(LIMIT_VIEWS)})")
    if sort not in BUCKET_SORTS:
        raise FieldValidationError("sort", f"unknown value {sort!r} (allowed: {', '.join(BUCKET_SORTS)})")
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise FieldValidationError("limit", f"must be between 1 and {MAX_PAGE_SIZE}, got {limit}")
    if offset < 0:
        raise FieldValidationError("offset", f"must be >= 0, got {offset}")
    conditions = _bucket_filters(backend, variant, signature, triage_state, dtype, head_dim, mask, build_id, defect_id)
    limit_total = session.scalar(select(func.count()).select_from(Bucket).where(*conditions, Bucket.severity == "limit")) or 0
    if severity is not None:
        conditions.append(Bucket.severity == severity)
    elif limits == "apart":
        conditions.append(Bucket.severity != "limit")
    column = BUCKET_SORT_COLUMNS[sort.lstrip("-")]
    descending = sort.startswith("-")
    order = [column.desc(), Bucket.id.desc()] if descending else [column.asc(), Bucket.id.asc()]
    if sort.lstrip("-") == "severity":
        order.insert(1, Bucket.last_seen.desc())
    items = session.scalars(
        select(Bucket)
        .where(*conditions)
        .options(selectinload(Bucket.first_build), selectinload(Bucket.last_build))
        .order_by(*order)
        .limit(limit)
        .offset(offset)
    ).all()
    total = session.scalar(select(func.count()).select_from(Bucket).where(*conditions)) or 0
    return BucketPage(items=list(items), total=total, limit=limit, offset=offset, limit_total=limit_total)


@dataclass(frozen=True)
class BucketDetail:
    """A bucket with its cases, the result to show its metrics from, and its latest results.

    ``failing_result`` is this bucket's result for the minimised case if there is one, else for
    the first case, else the latest. ``results`` have ``build`` loaded.
    """

    bucket: Bucket
    failing_result: Result | None
    results: list[Result]
    result_count: int
    group: list[Bucket] = dataclasses.field(default_factory=list)
    """The other buckets of its root-cause group (`service.db.models.Defect`): the other symptoms
    of the same defect, most severe first."""


def _bucket_results(bucket: Bucket) -> Select[tuple[Result]]:
    return select(Result).where(
        Result.backend == bucket.backend, Result.variant == bucket.variant, Result.signature == bucket.signature
    )


def get_bucket(session: Session, bucket_id: int, *, results_limit: int = 50) -> BucketDetail | None:
    """The bucket with ``first_case``, ``minimised_case``, builds and ``duplicate_of`` loaded; None
    if there is no such bucket."""
    bucket = session.scalar(
        select(Bucket)
        .where(Bucket.id == bucket_id)
        .options(
            selectinload(Bucket.first_case),
            selectinload(Bucket.minimised_case),
            selectinload(Bucket.first_build),
            selectinload(Bucket.last_build),
            selectinload(Bucket.duplicate_of),
        )
    )
    if bucket is None:
        return None
    newest_first = (Result.created_at.desc(), Result.id.desc())
    results = session.scalars(
        _bucket_results(bucket).options(joinedload(Result.build)).order_by(*newest_first).limit(results_limit)
    ).all()
    count = session.scalar(select(func.count()).select_from(_bucket_results(bucket).subquery())) or 0
    failing = None
    for case_id in (bucket.minimised_case_id, bucket.first_case_id):
        if case_id is not None and failing is None:
            failing = session.scalar(
                _bucket_results(bucket)
                .where(Result.case_id == case_id)
                .options(joinedload(Result.build))
                .order_by(*newest_first)
                .limit(1)
            )
    if failing is None and results:
        failing = results[0]
    return BucketDetail(
        bucket=bucket, failing_result=failing, results=list(results), result_count=count, group=defect_group(session, bucket)
    )


def bucket_states(session: Session, keys: list[tuple[str, str, str]]) -> dict[tuple[str, str, str], tuple[str | None, str]]:
    """What the database says now of the buckets ``keys`` (``(backend, variant, signature)``):
    ``{key: (minimised case id or None, minimise note)}`` for those it holds. The fuzz summary of
    several worker processes asks it (a bucket one worker found may have been shrunk, or attached
    to another's minimised case, by another worker)."""
    if not keys:
        return {}
    rows = session.execute(
        select(Bucket.backend, Bucket.variant, Bucket.signature, Bucket.minimised_case_id, Bucket.minimise_note).where(
            tuple_(Bucket.backend, Bucket.variant, Bucket.signature).in_([tuple(k) for k in keys])
        )
    )
    return {(b, v, sig): (case_id, note or "") for b, v, sig, case_id, note in rows}


def defect_group(session: Session, bucket: Bucket) -> list[Bucket]:
    """The other buckets of ``bucket``'s root-cause group, most severe first, then by id; empty
    when it has none."""
    if bucket.defect_id is None:
        return []
    return list(
        session.scalars(
            select(Bucket)
            .where(Bucket.defect_id == bucket.defect_id, Bucket.id != bucket.id)
            .order_by(SEVERITY_ORDER.desc(), Bucket.id)
        )
    )


def update_triage(
    session: Session,
    bucket_id: int,
    *,
    triage_state: TriageState | str = UNSET,
    notes: str | None = UNSET,
    upstream_url: str | None = UNSET,
    duplicate_of_id: int | None = UNSET,
) -> Bucket:
    """Change a bucket's triage fields; arguments left `UNSET` keep their value.

    Rules: ``duplicate`` needs ``duplicate_of_id`` (another existing bucket, no cycles), and
    ``duplicate_of_id`` is only allowed with ``duplicate``; leaving ``duplicate`` for another
    state clears ``duplicate_of_id``. ``upstream_url`` is an http(s) URL or None. ``notes`` None
    means empty.

    Raises:
        NotFoundError: there is no bucket ``bucket_id``.
        FieldValidationError: a value breaks the rules; ``field`` names it.
    """
    bucket = session.get(Bucket, bucket_id)
    if bucket is None:
        raise NotFoundError("bucket", bucket_id)

    state = bucket.triage_state if triage_state is UNSET else _triage_state(triage_state)
    duplicate_of = bucket.duplicate_of_id if duplicate_of_id is UNSET else duplicate_of_id
    if triage_state is not UNSET and state is not TriageState.duplicate and duplicate_of_id is UNSET:
        duplicate_of = None
    if state is TriageState.duplicate:
        if duplicate_of is None:
            raise FieldValidationError("duplicate_of_id", "required when triage_state is 'duplicate'")
        _check_duplicate_target(session, bucket_id, duplicate_of)
    elif duplicate_of is not None:
        raise FieldValidationError("duplicate_of_id", "only allowed when triage_state is 'duplicate'")

    if upstream_url is not UNSET:
        bucket.upstream_url = _check_url(upstream_url)
    if notes is not UNSET:
        if notes is not None and len(notes) > MAX_NOTES_LENGTH:
            raise FieldValidationError("notes", f"longer than {MAX_NOTES_LENGTH} characters")
        bucket.notes = notes or ""
    bucket.triage_state = state
    bucket.duplicate_of_id = duplicate_of
    session.flush()
    return bucket


def _check_duplicate_target(session: Session, bucket_id: int, target_id: Any) -> None:
    if isinstance(target_id, bool) or not isinstance(target_id, int):
        raise FieldValidationError("duplicate_of_id", f"must be a bucket id, got {target_id!r}")
    if target_id == bucket_id:
        raise FieldValidationError("duplicate_of_id", "a bucket cannot duplicate itself")
    seen = {bucket_id}
    current: int | None = target_id
    while current is not None:
        if current in seen:
            raise FieldValidationError("duplicate_of_id", f"bucket {target_id} leads back to bucket {bucket_id}")
        seen.add(current)
        row = session.execute(select(Bucket.id, Bucket.duplicate_of_id).where(Bucket.id == current)).first()
        if row is None:
            raise FieldValidationError("duplicate_of_id", f"bucket {current} does not exist")
        current = row.duplicate_of_id


def _check_url(url: str | None) -> str | None:
    if url is None or url == "":
        return None
    message = f"must be an http(s) URL of at most {MAX_URL_LENGTH} characters"
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. "Invalid IPv6 URL" for "http://[::1"
        raise FieldValidationError("upstream_url", f"{message} ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.netloc or len(url) > MAX_URL_LENGTH:
        raise FieldValidationError("upstream_url", message)
    return url


# ------------------------------------------------------------------------------------ cases
@dataclass(frozen=True)
class CaseDetail:
    """A case, its results (``build`` loaded; oldest first) and the bucket of each failure."""

    case: Case
    results: list[Result]
    bucket_ids: dict[tuple[str, str, str], int]

    def bucket_id_for(self, result: Result) -> int | None:
        """The bucket ``result`` was counted in, None for a non-failure."""
        if result.signature is None:
            return None
        return self.bucket_ids.get((result.backend, result.variant, result.signature))


def get_case(session: Session, case_id: str) -> CaseDetail | None:
    """The case with all its results, or None if no case has this id."""
    case = session.get(Case, case_id)
    if case is None:
        return None
    results = session.scalars(
        select(Result)
        .where(Result.case_id == case_id)
        .options(joinedload(Result.build))
        .order_by(Result.created_at, Result.id)
    ).all()
    keys = {(r.backend, r.variant, r.signature) for r in results if r.signature is not None}
    bucket_ids: dict[tuple[str, str, str], int] = {}
    for backend, variant, signature in keys:
        bucket_id = session.scalar(
            select(Bucket.id).where(Bucket.backend == backend, Bucket.variant == variant, Bucket.signature == signature)
        )
        if bucket_id is not None:
            bucket_ids[(backend, variant, signature)] = bucket_id
    return CaseDetail(case=case, results=list(results), bucket_ids=bucket_ids)


# --------------------------------------------------------------------------------- overview
# ------------------------------------------------------------------------------ bucket results
@dataclass(frozen=True)
class ResultPage:
    """One page of results (``build`` loaded) and the number matching."""

    items: list[Result]
    total: int
    limit: int
    offset: int


def _check_page(limit: int, offset: int) -> None:
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise FieldValidationError("limit", f"must be between 1 and {MAX_PAGE_SIZE}, got {limit}")
    if offset < 0:
        raise FieldValidationError("offset", f"must be >= 0, got {offset}")


def bucket_results(session: Session, bucket_id: int, *, limit: int = 50, offset: int = 0) -> ResultPage:
    """The results counted in a bucket, newest first, one page.

    Raises:
        NotFoundError: no bucket ``bucket_id``.
        FieldValidationError: a bad ``limit`` or ``offset``.
    """
    _check_page(limit, offset)
    bucket = session.get(Bucket, bucket_id)
    if bucket is None:
        raise NotFoundError("bucket", bucket_id)
    query = _bucket_results(bucket)
    items = session.scalars(
        query.options(joinedload(Result.build))
        .order_by(Result.created_at.desc(), Result.id.desc())
        .limit(limit)
        .offset(offset)
    ).all()
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    return ResultPage(items=list(items), total=total, limit=limit, offset=offset)


# ------------------------------------------------------------------------------------ repros
@dataclass(frozen=True)
class ReproTarget:
    """What to export: the stored case row, the backend variant, and the recorded signature
    (None when the case did not fail there)."""

    case: Case
    backend: str
    variant: str
    signature: str | None
    also_failing: tuple[tuple[str, str], ...] = ()  # other (backend, variant) pairs the case failed on


def repro_target(session: Session, case_id: str, *, backend: str | None = None, variant: str | None = None) -> ReproTarget:
    """The case and the backend variant to export it for.

    Without ``backend``/``variant`` the case's failing results decide: the backend variant of the
    newest failing result (among those of ``backend``, or of ``variant``, when one is given); the
    other failing pairs are in ``also_failing``, for the caller to mention. A new-user trial found
    that every failing case of the README's CPU job failed on two variants, so asking for one made
    the README's ``attnfuzz export <case_id>`` fail every time. The signature is that of the newest
    failing result of the chosen backend variant. A failure that is the limit of the backend's
    design (`fuzzer.severity.LIMIT_KINDS`) is chosen only when the case has no other.

    Raises:
        NotFoundError: no case ``case_id``.
        FieldValidationError: ``backend``: a ``backend`` without ``variant`` that the case has
            no result of (the message suggests the closest name and lists those it has);
            ``backend``/``variant`` needed: the case has no failing result (of the
            ``backend``/``variant`` given; the message lists those it has).
    """
    case = session.get(Case, case_id)
    if case is None:
        raise NotFoundError("case", case_id)
    query = select(Result.backend, Result.variant, Result.signature).where(
        Result.case_id == case_id, Result.signature.is_not(None)
    )
    rows = session.execute(query.order_by(Result.created_at.desc(), Result.id.desc())).all()
    # a design limit is no claim against the kernel: the case's other failures come first (newest first each)
    rows = sorted(rows, key=lambda r: signature_kind(r.signature) in LIMIT_KINDS)
    failing = list(dict.fromkeys((r.backend, r.variant) for r in rows))
    matching = [r for r in rows if (not backend or r.backend == backend) and (not variant or r.variant == variant)]
    pairs = list(dict.fromkeys((r.backend, r.variant) for r in matching))
    if backend and variant:
        return ReproTarget(case, backend, variant, matching[0].signature if matching else None)
    if not pairs and backend and not variant:
        ran = sorted(session.scalars(select(Result.backend).where(Result.case_id == case_id).distinct()))
        if backend not in ran:  # a mistyped name: say so, not that a variant is needed
            raise FieldValidationError(
                "backend",
                f"unknown for this case: {backend!r}{did_you_mean(backend, ran)} (allowed: the backends it has "
                f"results of: {', '.join(ran) or 'none'}; another backend only with --variant and --force; API: variant=, force=true)",
            )
    if not pairs:
        field = "backend" if not backend else "variant"
        given = " and ".join(f"{name} {value!r}" for name, value in (("backend", backend), ("variant", variant)) if value)
        failed_on = (
            f"; it failed on: {', '.join(f'{b}/{v}' for b, v in failing)}" if failing else "; it has no failing result"
        )
        raise FieldValidationError(
            field,
            f"required: no failing result of this case{' with ' + given if given else ''} to take it from{failed_on};"
            " name the backend and variant (--backend, --variant; API: backend=, variant=; `attnfuzz cases show CASE_ID`"
            " lists its results) and add --force (API: force=true) for a variant that did not fail",
        )
    chosen = pairs[0]
    return ReproTarget(case, chosen[0], chosen[1], matching[0].signature, also_failing=tuple(p for p in failing if p != chosen))


def bucket_repro_target(session: Session, bucket_id: int) -> ReproTarget:
    """The bucket's minimised case (its first case if not minimised) on its backend variant.

    Raises:
        NotFoundError: no bucket ``bucket_id``.
    """
    bucket = session.scalar(
        select(Bucket)
        .where(Bucket.id == bucket_id)
        .options(selectinload(Bucket.first_case), selectinload(Bucket.minimised_case))
    )
    if bucket is None:
        raise NotFoundError("bucket", bucket_id)
    case = bucket.minimised_case or bucket.first_case
    return ReproTarget(case, bucket.backend, bucket.variant, bucket.signature)


# ------------------------------------------------------------------------------------ builds
@dataclass(frozen=True)
class BuildPage:
    """One page of builds (newest first) and the number of builds."""

    items: list[Build]
    total: int
    limit: int
    offset: int


def list_builds(session: Session, *, device_name: str | None = None, limit: int = 50, offset: int = 0) -> BuildPage:
    """Builds, newest first, optionally of one ``device_name``.

    Raises:
        FieldValidationError: a bad ``limit`` or ``offset``.
    """
    _check_page(limit, offset)
    conditions = [Build.device_name == device_name] if device_name else []
    items = session.scalars(
        select(Build).where(*conditions).order_by(Build.first_seen.desc(), Build.id.desc()).limit(limit).offset(offset)
    ).all()
    total = session.scalar(select(func.count()).select_from(Build).where(*conditions)) or 0
    return BuildPage(items=list(items), total=total, limit=limit, offset=offset)


@dataclass(frozen=True)
class CaseSummary:
    """A stored case with how many of its results ended in each status."""

    case: Case
    statuses: dict[str, int]


@dataclass(frozen=True)
class CasePage:
    """One page of cases (newest first) and the number matching."""

    items: list[CaseSummary]
    total: int
    limit: int
    offset: int


def list_cases(
    session: Session, *, failing: bool = False, backend: str | None = None, limit: int = 50, offset: int = 0
) -> CasePage:
    """Stored cases, newest first, each with its result counts per status; with ``failing`` only
    cases that have a failing result (``fuzzer.results.FAILING_STATUSES``), with ``backend`` only
    cases that backend ran.

    Raises:
        FieldValidationError: a bad ``limit`` or ``offset``.
    """
    _check_page(limit, offset)
    conditions = []
    if failing or backend:
        result_conditions = [Result.case_id == Case.id]
        if failing:
            result_conditions.append(Result.status.in_(FAILING_STATUSES))
        if backend:
            result_conditions.append(Result.backend == backend)
        conditions.append(select(Result.id).where(*result_conditions).exists())
    cases = session.scalars(
        select(Case).where(*conditions).order_by(Case.created_at.desc(), Case.id).limit(limit).offset(offset)
    ).all()
    total = session.scalar(select(func.count()).select_from(Case).where(*conditions)) or 0
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    if cases:
        for case_id, status, n in session.execute(
            select(Result.case_id, Result.status, func.count())
            .where(Result.case_id.in_([c.id for c in cases]))
            .group_by(Result.case_id, Result.status)
        ):
            counts[case_id][status] = n
    return CasePage([CaseSummary(c, dict(counts[c.id])) for c in cases], total, limit, offset)


def get_build(session: Session, build_id: int) -> Build | None:
    """The build with id ``build_id``, or None."""
    return session.get(Build, build_id)


# ----------------------------------------------------------------------------------- workers
@dataclass(frozen=True)
class WorkerPage:
    """One page of workers (``build`` loaded) with each one's heartbeat age, newest heartbeat first."""

    items: list[LiveWorker]
    total: int
    limit: int
    offset: int


def list_workers(
    session: Session,
    *,
    live_only: bool = False,
    now: datetime | None = None,
    live_within_s: float = LIVE_WORKER_S,
    limit: int = 50,
    offset: int = 0,
) -> WorkerPage:
    """Workers, newest heartbeat first; with ``live_only`` only the live ones (running or stopping,
    heard from within ``live_within_s`` seconds of ``now``).

    Raises:
        FieldValidationError: a bad ``limit`` or ``offset``.
    """
    _check_page(limit, offset)
    now = now or utcnow()
    conditions = [is_live_worker(now, live_within_s)] if live_only else []
    workers = session.scalars(
        select(Worker)
        .where(*conditions)
        .options(joinedload(Worker.build))
        .order_by(Worker.last_heartbeat.desc(), Worker.id)
        .limit(limit)
        .offset(offset)
    ).all()
    total = session.scalar(select(func.count()).select_from(Worker).where(*conditions)) or 0
    items = [LiveWorker(w, max(0.0, (now - w.last_heartbeat).total_seconds())) for w in workers]
    return WorkerPage(items=items, total=total, limit=limit, offset=offset)


# ----------------------------------------------------------------------------------- metrics
