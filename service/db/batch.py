"""Batched ingestion: many cases with their results, of one build and worker, in ONE transaction
(``POST /api/case-results``, what `fuzzer.http_sink.HttpSink` sends).

`ingest_case_batch` writes, on the caller's connection and inside its transaction:

1. the cases, one multi-row ``INSERT ... ON CONFLICT (id) DO NOTHING`` (sorted by id);
2. the results: on PostgreSQL a ``COPY`` (psycopg) into a temporary table, then one
   ``INSERT INTO results SELECT ... ON CONFLICT (case_id, build_id, backend, variant, phase) DO
   NOTHING RETURNING`` the keys inserted; on SQLite a multi-row insert with the same conflict
   rule. A key already stored (a retried batch) is not written again: the batch is idempotent;
3. the failures, per bucket ``(backend, variant, signature)``: created on first sight, else
   counted with ONE update per bucket and batch whose row is taken ``FOR UPDATE SKIP LOCKED``
   (`service.db.store`): a bucket row another transaction holds is never waited on; its counts
   go to `DeferredHits` (kept by the app, added by a later batch that gets the row).

Everything is one transaction: the caller commits, or rolls back and nothing of the batch is
stored. ``SET LOCAL lock_timeout`` bounds any other wait (`LOCK_TIMEOUT_MS`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import select, text, tuple_, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DataError

from fuzzer.results import BucketUpdate, CaseResult
from oracle.config import AttentionCase
from service.db.engine import insert_ignore, insert_ignore_statement
from service.db.minimise_leases import bucket_key
from service.db.models import ORIGINS, Bucket, Case, Result, TriageState, case_filter_columns, utcnow
from service.db.store import LOCK_TIMEOUT_MS, RESULT_KEY, BucketHits, SqlStore, _bucket_severity_values
from service.errors import FieldValidationError, NotFoundError

Key = tuple[str, str, str]

RESULT_COLUMNS = (
    "case_id", "build_id", "worker_id", "backend", "variant", "status", "signature", "signatures", "metrics",
    "error_ratio", "run_ms", "compile_ms", "oracle_ms", "detail", "backend_version", "selected_kernel", "phase",
    "created_at",
)
"""The ``results`` columns a batch writes (all but ``id``), in COPY order."""


@dataclasses.dataclass(frozen=True)
class CaseEntry:
    """One case of a batch with its results (all of that case).

    Attributes:
        case: the validated case.
        origin: one of `service.db.models.ORIGINS`.
        results: its results; each ``case_id`` is ``case.case_id``.
    """

    case: AttentionCase
    origin: str
    results: Sequence[CaseResult]


@dataclasses.dataclass(frozen=True, slots=True)
class PassingResult:
    """A non-failing result of a batch whose rows PostgreSQL writes from the batch's JSON document
    (`ingest_case_batch`'s ``results_json``): what the batch reads of it, its key and status."""

    case_id: str
    backend: str
    variant: str
    phase: str
    status: str

    is_failure: ClassVar[bool] = False
    bucket_key: ClassVar[None] = None


@dataclasses.dataclass(frozen=True, slots=True)
class FailingResult:
    """A failing result of such a batch: what the batch reads of it (its key, its bucket key and
    error ratio, from which its bucket is counted), without its metrics or a `CaseResult`. Its
    fields are as the request validated them (`service.api.requests.ResultIn`: names and
    signature within their columns), so they are the values its row holds."""

    case_id: str
    backend: str
    variant: str
    phase: str
    status: str
    signature: str
    error_ratio: float | None

    is_failure: ClassVar[bool] = True

    @property
    def bucket_key(self) -> tuple[str, str, str]:
        return (self.backend, self.variant, self.signature)


class DeferredHits:
    """Bucket counts a batch could not write because another transaction held the bucket's row,
    by ``(backend, variant, signature)``; shared by the requests of one app (thread-safe). A
    batch takes some (`take`) to add to their rows; `Pending.commit` after the batch's commit
    keeps what it deferred, `Pending.abort` after a rollback gives back what it took."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hits: dict[Key, BucketHits] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._hits)

    def add(self, key: Key, hits: BucketHits) -> None:
        with self._lock:
            self._hits[key] = hits.plus(self._hits.get(key))

    def take(self, limit: int) -> dict[Key, BucketHits]:
        """Up to ``limit`` deferred counts, removed from here."""
        with self._lock:
            keys = list(self._hits)[:limit]
            return {key: self._hits.pop(key) for key in keys}

    def begin(self) -> Pending:
        """The deferred counts of one batch (apply with `Pending.commit` / `Pending.abort`)."""
        return Pending(self)


class Pending:
    """What one batch took from and deferred to a `DeferredHits`."""

    def __init__(self, shared: DeferredHits):
        self.shared = shared
        self.taken: dict[Key, BucketHits] = {}
        self.deferred: dict[Key, BucketHits] = {}

    def defer(self, key: Key, hits: BucketHits) -> None:
        self.deferred[key] = hits.plus(self.deferred.get(key))

    def commit(self) -> None:
        """The batch committed: what it deferred is kept for a later batch."""
        for key, hits in self.deferred.items():
            self.shared.add(key, hits)
        self.taken, self.deferred = {}, {}

    def abort(self) -> None:
        """The batch rolled back: what it took is given back (what it deferred was never stored)."""
        for key, hits in self.taken.items():
            self.shared.add(key, hits)
        self.taken, self.deferred = {}, {}


def _count(connection: Connection, key: Key, hits: BucketHits, pending: Pending) -> int | None:
    """Add ``hits`` to bucket ``key``'s row, taken ``FOR UPDATE SKIP LOCKED`` on PostgreSQL
    (deferred in ``pending`` when another transaction holds it); the bucket id, None if none."""
    where = bucket_key(*key)
    if connection.dialect.name == "postgresql":
        target = select(Bucket.id).where(where).with_for_update(skip_locked=True).scalar_subquery()
        bucket_id = connection.execute(
            update(Bucket).where(Bucket.id == target).values(**hits.values()).returning(Bucket.id)
        ).scalar_one_or_none()
        if bucket_id is None:
            bucket_id = connection.scalar(select(Bucket.id).where(where))
            if bucket_id is not None:
                pending.defer(key, hits)
        return bucket_id
    return connection.execute(update(Bucket).where(where).values(**hits.values()).returning(Bucket.id)).scalar_one_or_none()


def _buckets(connection: Connection, keys: list[Key]) -> dict[Key, tuple[int, bool]]:
    """``key -> (bucket id, has a minimised case)`` of the buckets of ``keys`` that exist (one
    plain read: no row lock)."""
    found: dict[Key, tuple[int, bool]] = {}
    for start in range(0, len(keys), 500):
        chunk = keys[start:start + 500]
        rows = connection.execute(
            select(Bucket.id, Bucket.backend, Bucket.variant, Bucket.signature, Bucket.minimised_case_id).where(
                tuple_(Bucket.backend, Bucket.variant, Bucket.signature).in_(chunk)
            )
        )
        for r in rows:
            found[(r.backend, r.variant, r.signature)] = (r.id, r.minimised_case_id is not None)
    return found


_COUNT_ALL = text("""
    WITH v AS (
        SELECT * FROM unnest(CAST(:ids AS integer[]), CAST(:n AS integer[]), CAST(:last_seen AS timestamptz[]),
                             CAST(:build AS integer[]), CAST(:ratio AS double precision[]), CAST(:wrong AS boolean[]))
               AS v(id, n, last_seen, build, ratio, wrong)
    ), free AS (
        SELECT id FROM buckets WHERE id = ANY(CAST(:ids AS integer[])) ORDER BY id FOR UPDATE SKIP LOCKED
    )
    UPDATE buckets SET
        hit_count = buckets.hit_count + v.n,
        last_seen = GREATEST(buckets.last_seen, v.last_seen),
        last_build_id = v.build,
        max_error_ratio = CASE WHEN v.ratio IS NOT NULL AND (buckets.max_error_ratio IS NULL OR buckets.max_error_ratio < v.ratio)
                               THEN v.ratio ELSE buckets.max_error_ratio END,
        severity = CASE WHEN v.wrong THEN 'wrong' ELSE buckets.severity END
    FROM v WHERE buckets.id = v.id AND buckets.id IN (SELECT id FROM free)
    RETURNING buckets.id
""")


def _count_all(connection: Connection, to_count: dict[Key, BucketHits], pending: Pending) -> None:
    """Add each key's hits to its bucket row. PostgreSQL: ONE update of the rows no other
    transaction holds (``FOR UPDATE SKIP LOCKED``); the counts of the others go to ``pending``.
    SQLite (one writer at a time): an update per bucket."""
    if not to_count:
        return
    if connection.dialect.name != "postgresql":
        for key, hits in to_count.items():
            _count(connection, key, hits, pending)
        return
    ids = _buckets(connection, sorted(to_count))
    rows = [(ids[k][0], h) for k, h in to_count.items() if k in ids]
    if not rows:
        return
    params = {
        "ids": [bid for bid, _ in rows], "n": [h.count for _, h in rows], "last_seen": [h.last_seen for _, h in rows],
        "build": [h.build_id for _, h in rows], "ratio": [h.max_error_ratio for _, h in rows], "wrong": [h.wrong for _, h in rows],
    }
    written = set(connection.execute(_COUNT_ALL, params).scalars())
    by_id = {bid: key for key, (bid, _) in ids.items()}
    for bid, hits in rows:
        if bid not in written:  # held by another transaction: counted by a later batch
            pending.defer(by_id[bid], hits)


def _insert_results_copy(connection: Connection, rows: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    """PostgreSQL: the rows COPYed into a temporary table, then inserted with ``ON CONFLICT DO
    NOTHING``; the ``(case_id, backend, variant, phase)`` keys inserted."""
    from psycopg.types.json import Jsonb

    raw = connection.connection.driver_connection  # the psycopg connection, in this transaction
    columns = ", ".join(RESULT_COLUMNS)
    with raw.cursor() as cursor:
        # the columns only (no id, no default drawing on the results' sequence), kept per
        # connection and emptied at each commit; a rolled-back batch's rows go with the rollback
        cursor.execute(
            "CREATE TEMPORARY TABLE IF NOT EXISTS ingest_results_stage ON COMMIT DELETE ROWS "
            f"AS SELECT {columns} FROM results WITH NO DATA"
        )
        cursor.execute("TRUNCATE ingest_results_stage")  # rows of an earlier batch in this same transaction
        with cursor.copy(f"COPY ingest_results_stage ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(
                    [
                        Jsonb(row[c]) if c in ("signatures", "metrics") else row[c]
                        for c in RESULT_COLUMNS
                    ]
                )
        cursor.execute(
            f"INSERT INTO results ({columns}) SELECT {columns} FROM ingest_results_stage "
            f"ORDER BY case_id, backend, variant, phase "
            f"ON CONFLICT ({', '.join(RESULT_KEY)}) DO NOTHING RETURNING case_id, backend, variant, phase"
        )
        return {tuple(r) for r in cursor.fetchall()}


class DocumentRefusedError(Exception):
    """PostgreSQL refused a value of a batch's results document (``SQLSTATE`` class 22, data
    exception: a ``metrics_json`` text that is not JSON it reads, a number out of its range). The
    transaction is lost; the caller writes the batch again through the rows path, which parses
    each text in Python (`service.api.requests.ResultIn.to_case_result`: 422 naming one that is
    no JSON)."""


_DOCUMENT_COLUMNS = (
    "case_id text, backend text, variant text, status text, signature text, signatures jsonb, metrics jsonb, metrics_json text, "
    "error_ratio float8, run_ms float8, compile_ms float8, oracle_ms float8, detail text, backend_version text, "
    "selected_kernel text, phase text"
)
"""The fields of a `service.api.requests.ResultIn` as ``jsonb_to_recordset`` reads them (``metrics_json``,
the metrics as JSON text, parsed into the ``metrics`` column by the database)."""

_INSERT_DOCUMENT = text(f"""
    WITH stored AS (
        INSERT INTO results ({", ".join(RESULT_COLUMNS)})
        SELECT x.case_id, :build_id, :worker_id, x.backend, x.variant, x.status, x.signature,
               coalesce(x.signatures, '[]'::jsonb), coalesce(CAST(x.metrics_json AS jsonb), x.metrics, '{{}}'::jsonb), x.error_ratio,
               x.run_ms, x.compile_ms, x.oracle_ms, x.detail, x.backend_version, x.selected_kernel, x.phase, :at
        FROM jsonb_to_recordset(CAST(:document AS jsonb)) AS x({_DOCUMENT_COLUMNS})
        ORDER BY x.case_id, x.backend, x.variant, x.phase
        ON CONFLICT ({", ".join(RESULT_KEY)}) DO NOTHING
        RETURNING case_id, backend, variant, phase, signature
    )
    SELECT case_id, backend, variant, phase FROM stored WHERE signature IS NOT NULL
""")


def _insert_results_document(
    connection: Connection, document: str, build_id: int, worker_id: int | None, at: datetime
) -> set[tuple[str, str, str, str]]:
    """PostgreSQL: the rows of ``document`` (a JSON array of result objects, each key once:
    `service.api.requests.CaseBatchIn.results_json`) inserted by ONE statement that parses it
    server side (``jsonb_to_recordset``), ``ON CONFLICT DO NOTHING``; the keys of the FAILING rows
    it inserted (the rest are never asked about). Stores the same rows as `_insert_results_copy`
    from `CaseResult`s, without a Python object, a dict and a COPY line per result (about 30 us
    of the service's CPU a result: benchmarks/ingest_bench.py)."""
    try:
        rows = connection.execute(
            _INSERT_DOCUMENT, {"document": document, "build_id": build_id, "worker_id": worker_id, "at": at}
        )
    except DataError as exc:  # a value the database cannot read: a metrics_json text (22P02 and kin)
        raise DocumentRefusedError(str(exc.orig).splitlines()[0] if exc.orig else str(exc)) from exc
    return {tuple(r) for r in rows}  # type: ignore[misc]


def _insert_results_many(connection: Connection, rows: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    """Any dialect: one multi-row ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` (SQLAlchemy's
    insertmanyvalues); the keys inserted."""
    statement = insert_ignore_statement(connection, Result.__table__, RESULT_KEY).returning(
        Result.case_id, Result.backend, Result.variant, Result.phase
    )
    return {tuple(r) for r in connection.execute(statement, rows)}


def ingest_case_batch(
    connection: Connection,
    build_id: int,
    worker_id: int | None,
    entries: Sequence[CaseEntry],
    pending: Pending,
    *,
    now: datetime | None = None,
    fold_limit: int = 16,
    results_json: str | None = None,
) -> list[list[BucketUpdate | None]]:
    """Store ``entries`` (see the module docstring) in the caller's transaction.

    Args:
        connection: a connection inside the caller's (write) transaction.
        build_id, worker_id: whose results (the worker may be None).
        entries: the cases and their results.
        pending: this batch's share of the app's `DeferredHits` (the caller applies it after
            the commit or rollback).
        now: the results' ``created_at`` (default: now, UTC).
        fold_limit: how many deferred counts of earlier batches this one adds to their rows.
        results_json: PostgreSQL only: every result of ``entries`` as one JSON array, the first
            of each key (`service.api.requests.CaseBatchIn.results_json`); the rows are written
            from it (`_insert_results_document`) and the results of ``entries`` may be
            `PassingResult`s and `FailingResult`s. Ignored on another dialect, where they may not.

    Returns:
        Per entry, per result in order: the `BucketUpdate` of a failure, None otherwise.

    Raises:
        FieldValidationError: ``build_id`` or ``worker_id`` does not exist (field ``build_id`` /
            ``worker_id``); an origin is unknown (``cases.<i>.origin``); a result's ``case_id``
            is not its entry's case (``cases.<i>.results.<j>.case_id``).
    """
    at = now or utcnow()
    for i, entry in enumerate(entries):
        if entry.origin not in ORIGINS:
            raise FieldValidationError(f"cases.{i}.origin", f"unknown value {entry.origin!r} (allowed: {', '.join(ORIGINS)})")
        for j, r in enumerate(entry.results):
            if r.case_id != entry.case.case_id:
                raise FieldValidationError(
                    f"cases.{i}.results.{j}.case_id", f"{r.case_id!r} is not the case's id {entry.case.case_id!r}"
                )
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql(f"SET LOCAL lock_timeout = {int(LOCK_TIMEOUT_MS)}")
    try:
        SqlStore._check_build_worker(connection, build_id, worker_id)
    except NotFoundError as exc:
        raise FieldValidationError(f"{exc.kind}_id", f"{exc.kind} {exc.key!r} does not exist") from None

    cases: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if entry.case.case_id not in cases:
            cases[entry.case.case_id] = {
                "id": entry.case.case_id,
                "config": entry.case.to_json(),
                "origin": entry.origin,
                "created_at": at,
                **case_filter_columns(entry.case),
            }
    if cases:
        connection.execute(insert_ignore_statement(connection, Case.__table__, ["id"]), [cases[k] for k in sorted(cases)])

    inserted: set[tuple[str, str, str, str]]
    if results_json is not None and connection.dialect.name == "postgresql":
        inserted = _insert_results_document(connection, results_json, build_id, worker_id, at)
    else:
        rows: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        for entry in entries:
            for r in entry.results:
                key = (r.case_id, r.backend, r.variant, r.phase)
                if key not in rows:  # the first of a key repeated within the batch is the one stored
                    rows[key] = SqlStore._result_values(r, build_id, worker_id, at)
        ordered = [rows[k] for k in sorted(rows)]  # one order for every batch: fewer deadlocks between them
        if not ordered:
            inserted = set()
        elif connection.dialect.name == "postgresql":
            inserted = _insert_results_copy(connection, ordered)
        else:
            inserted = _insert_results_many(connection, ordered)

    # failures: per bucket, one count of this batch's new results
    updates: list[list[BucketUpdate | None]] = [[None] * len(entry.results) for entry in entries]
    groups: dict[Key, list[tuple[int, int, CaseResult]]] = {}
    stored_before: list[tuple[int, int, CaseResult]] = []
    claimed: set[tuple[str, str, str, str]] = set()
    for i, entry in enumerate(entries):
        for j, r in enumerate(entry.results):
            key = (r.case_id, r.backend, r.variant, r.phase)
            fresh = key in inserted and key not in claimed
            if fresh:
                claimed.add(key)
            if fresh and r.is_failure:
                groups.setdefault(r.bucket_key, []).append((i, j, r))
            elif not fresh and r.is_failure:
                stored_before.append((i, j, r))
    keys = sorted(groups)
    hits_of: dict[Key, BucketHits] = {}
    for key in keys:
        hits: BucketHits | None = None
        for _, _, r in groups[key]:
            hits = BucketHits.of(r, build_id, at).plus(hits)
        hits_of[key] = hits  # type: ignore[assignment]
    found = _buckets(connection, keys)
    created: dict[Key, int] = {}
    new_keys = [k for k in keys if k not in found]
    if new_keys:  # one multi-row insert; a key another batch created meanwhile is counted below
        values = []
        for key in new_keys:
            first = groups[key][0][2]
            values.append({
                "backend": key[0], "variant": key[1], "signature": key[2], "first_seen": at, "last_seen": at,
                "hit_count": 1, "first_case_id": first.case_id, "minimise_note": "", "first_build_id": build_id,
                "last_build_id": build_id, "triage_state": TriageState.new, "notes": "", **_bucket_severity_values(first),
            })
        statement = insert_ignore_statement(connection, Bucket.__table__, ["backend", "variant", "signature"]).returning(
            Bucket.id, Bucket.backend, Bucket.variant, Bucket.signature
        )
        created = {(r.backend, r.variant, r.signature): r.id for r in connection.execute(statement, values)}
        raced = [k for k in new_keys if k not in created]
        if raced:
            found.update(_buckets(connection, raced))
    to_count: dict[Key, BucketHits] = {}
    for key in keys:
        members = groups[key]
        if key in created:
            rest: BucketHits | None = None
            for _, _, r in members[1:]:
                rest = BucketHits.of(r, build_id, at).plus(rest)
            if rest is not None:
                to_count[key] = rest
        else:
            to_count[key] = hits_of[key]
    pending.taken = pending.shared.take(fold_limit)  # counts earlier batches could not write
    for key, hits in pending.taken.items():
        to_count[key] = hits.plus(to_count.get(key))
    _count_all(connection, to_count, pending)
    for key in keys:
        bucket_id, minimised = (created[key], False) if key in created else found.get(key, (None, False))
        for n, (i, j, _) in enumerate(groups[key]):
            updates[i][j] = BucketUpdate(bucket_id=bucket_id, is_new=key in created and n == 0, minimised=minimised)  # type: ignore[arg-type]
    for i, j, r in stored_before:
        updates[i][j] = SqlStore._stored_bucket(connection, r, build_id)
    return updates
