"""SQL storage for fuzz workers: `SqlStore`, the `fuzzer.results.ResultSink` on SQL (builds,
workers, cases, results, buckets, minimisation leases): the worker's write path, each call one
transaction with the fault behaviour described below. Cases, results and their bucket counts are
written here; the worker rows are `service.db.worker_rows.WorkerRows` and the minimisation leases
`service.db.minimise_leases.MinimisationLeases`, both parts of `SqlStore`. Hypothesis's example
database is `service.db.examples`; worker runs and their gaps `service.db.workers`.

It works on an `Engine` (one short transaction per call) or on an open `Connection` (each call
in a SAVEPOINT of the caller's transaction; the tests use this).

Concurrency: several worker processes may write one SQLite file or one PostgreSQL database at
once. Every write is a single statement-level get-or-create (``INSERT ... ON CONFLICT DO
NOTHING ... RETURNING``, `service.db.engine.insert_ignore`, then a SELECT or an UPDATE when the
row already existed), so a unique key raced by two workers never raises. Transactions, their
retries and the translation of faults (`StoreUnavailableError`, `StoreRefusedError`) are
`service.db.engine.Transactor`'s: every call is one transaction, so after a fault nothing of the
call is stored.

Minimisation leases are fenced compare-and-set claims: `service.db.minimise_leases`.

No transaction waits on a stopped process (PostgreSQL; a worker stopped with SIGSTOP inside its
write keeps its row locks until it is continued, and the others waited on them and stored no
result for 90 s): counting a result in its bucket (``hit_count``, ``last_seen``, the severity)
takes the row with ``FOR UPDATE SKIP LOCKED``; when another transaction holds it the counts are
kept in this store (`SqlStore.deferred_hits`) and added by the next write that gets the row, and
the results are stored at once. Claims skip locked buckets the same way. Any other wait for a
lock ends after `LOCK_TIMEOUT_MS` (``SET LOCAL lock_timeout``): the write fails as unavailable
and the worker's spool keeps it (`fuzzer.spool`). Counts kept here when the process ends are lost
(the results are not): `hit_count` may then count fewer results than stored.

Create a store in the process that uses it (an Engine must not cross a fork).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Engine, bindparam, case, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from fuzzer.results import BucketUpdate, BuildFingerprint, CaseResult
from fuzzer.severity import severity
from oracle.config import AttentionCase
from service.db.build_rows import register_build
from service.db.engine import DEFAULT_RETRIES, Transactor, insert_ignore
from service.db.minimise_leases import MinimisationLeases, bucket_key
from service.db.worker_rows import WorkerRows
from service.errors import FieldValidationError, NotFoundError
from service.db.models import (
    ORIGINS,
    Bucket,
    Build,
    Case,
    Result,
    TriageState,
    Worker,
    case_filter_columns,
    utcnow,
)


RESULT_KEY = ["case_id", "build_id", "backend", "variant", "phase"]  # a result is stored once per key



T = TypeVar("T")
LOCK_TIMEOUT_MS = 2000
"""How long a write of this store waits for a row lock on PostgreSQL (``SET LOCAL lock_timeout``),
milliseconds: far above a live worker's write (milliseconds), far below a stopped one's."""


def _bucket_severity_values(result: CaseResult) -> dict[str, Any]:
    """``severity`` and ``max_error_ratio`` of a new bucket whose first result is ``result``."""
    return {"severity": severity(result.signature, result.error_ratio), "max_error_ratio": result.error_ratio}


@dataclasses.dataclass(frozen=True)
class BucketHits:
    """Results counted in one bucket and not yet written to its row (`SqlStore.deferred_hits`).

    Attributes:
        count: how many.
        last_seen: the latest result's time.
        build_id: the build of the latest result.
        max_error_ratio: the largest error ratio among them (None: none has one).
        wrong: one of them is ``wrong`` on its own (`fuzzer.severity`).
    """

    count: int
    last_seen: datetime
    build_id: int
    max_error_ratio: float | None
    wrong: bool

    @classmethod
    def of(cls, result: CaseResult, build_id: int, now: datetime) -> BucketHits:
        """One hit: ``result`` of ``build_id`` stored at ``now``."""
        return cls(1, now, build_id, result.error_ratio, severity(result.signature, result.error_ratio) == "wrong")

    def plus(self, other: BucketHits | None) -> BucketHits:
        """Both counted together (the later one's build)."""
        if other is None:
            return self
        later = self if self.last_seen >= other.last_seen else other
        ratios = [r for r in (self.max_error_ratio, other.max_error_ratio) if r is not None]
        return BucketHits(
            self.count + other.count, later.last_seen, later.build_id, max(ratios) if ratios else None, self.wrong or other.wrong
        )

    def values(self) -> dict[str, Any]:
        """The UPDATE values that count these hits in their bucket: ``hit_count``, ``last_seen``,
        ``last_build_id``, ``max_error_ratio`` and the severity. For one signature the severity
        only moves from ``imprecise`` to ``wrong`` as the ratio grows (`fuzzer.severity`), so a
        result that is ``wrong`` on its own makes the bucket so."""
        values: dict[str, Any] = {
            "hit_count": Bucket.hit_count + self.count,
            "last_seen": case((Bucket.last_seen < self.last_seen, self.last_seen), else_=Bucket.last_seen),
            "last_build_id": self.build_id,
        }
        if self.max_error_ratio is not None:
            ratio = self.max_error_ratio
            values["max_error_ratio"] = case(
                (Bucket.max_error_ratio.is_(None) | (Bucket.max_error_ratio < ratio), ratio), else_=Bucket.max_error_ratio
            )
        if self.wrong:
            values["severity"] = "wrong"
        return values


class _Counts:
    """The bucket counts of one write attempt: which deferred counts it wrote (``folded``) and
    which it could not (``deferred``, the bucket's row locked by another transaction). Applied
    to the store's `SqlStore.deferred_hits` only once the write commits (a retried attempt
    starts afresh)."""

    def __init__(self, pending: dict[tuple[str, str, str], BucketHits]):
        self.pending = pending
        self.folded: set[tuple[str, str, str]] = set()
        self.deferred: dict[tuple[str, str, str], BucketHits] = {}

    def commit(self) -> None:
        for key in self.folded:
            self.pending.pop(key, None)
        for key, hits in self.deferred.items():
            self.pending[key] = hits.plus(self.pending.get(key))


# Statements of every case's write, built once (a statement built per call was hashed and looked
# up in SQLAlchemy's compiled cache each time: a third of the write of a CPU fuzz case).
_BUILD_BY_ID = select(Build.id).where(Build.id == bindparam("id"))
# both in one statement (one round trip a case): ``(build id or NULL, worker id or NULL)``
_BUILD_AND_WORKER_BY_ID = select(
    select(Build.id).where(Build.id == bindparam("build_id")).scalar_subquery(),
    select(Worker.id).where(Worker.id == bindparam("worker_id")).scalar_subquery(),
)


@functools.lru_cache(maxsize=4)
def _results_insert(dialect: str) -> Any:
    """The multi-row ``INSERT INTO results ... ON CONFLICT DO NOTHING RETURNING backend, variant,
    phase`` of `SqlStore.record_case_results`, per dialect."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return (
        insert(Result.__table__)
        .on_conflict_do_nothing(index_elements=RESULT_KEY)
        .returning(Result.backend, Result.variant, Result.phase)
    )


class SqlStore(WorkerRows, MinimisationLeases):
    """`fuzzer.results.ResultSink` on SQL: idempotent, safe for concurrent worker processes.

    Its worker calls (`register_worker`, `heartbeat`, `mark_worker_lost`, `worker_runs`) are
    `service.db.worker_rows.WorkerRows`'s, its minimisation calls (`claim_minimisation`,
    `renew_minimisation`, `release_minimisation`, `record_minimised`)
    `service.db.minimise_leases.MinimisationLeases`'s; both share this store's transactor.

    Args:
        bind: an Engine (one transaction per call) or an open Connection (a savepoint per call).
        retries: how many times a transiently failing transaction is retried.
        checkpoint_s: a SQLite file's checkpoint period (`service.db.engine.Transactor`): 0 (the
            default) checkpoints every write before it returns.
    """

    def __init__(self, bind: Engine | Connection, *, retries: int = DEFAULT_RETRIES, checkpoint_s: float = 0.0):
        self._tx = Transactor(bind, retries, lock_timeout_ms=LOCK_TIMEOUT_MS, checkpoint_s=checkpoint_s)
        self._registering: dict[tuple, datetime] = {}  # register_worker's first attempt per key
        #: counts of results stored while their bucket's row was locked by another transaction
        #: (PostgreSQL), by ``(backend, variant, signature)``: added to the row by a later write
        self.deferred_hits: dict[tuple[str, str, str], BucketHits] = {}

    def _write_counting(self, fn: Callable[[Connection, _Counts], T]) -> T:
        """``fn(connection, counts)`` in one write transaction, where every bucket count goes
        through ``counts`` (`_count_hits`); the deferred counts change only when it commits."""
        attempts: list[_Counts] = []

        def run(connection: Connection) -> T:
            counts = _Counts(self.deferred_hits)
            attempts.append(counts)
            value = fn(connection, counts)
            self._fold_deferred(connection, counts)
            return value

        value = self._tx.write(run)
        attempts[-1].commit()
        return value

    def _count_hits(self, connection: Connection, key: tuple[str, str, str], hits: BucketHits | None, counts: _Counts) -> int | None:
        """Add ``hits`` (and the counts deferred for ``key`` before) to bucket ``key``'s row; its
        id, None when there is no such bucket. On PostgreSQL the row is taken with ``FOR UPDATE
        SKIP LOCKED``: when another transaction holds it (a worker stopped inside its write),
        ``hits`` are deferred in ``counts`` and the id read without a lock."""
        earlier = self.deferred_hits.get(key) if key not in counts.folded else None
        total = hits.plus(earlier) if hits is not None else earlier
        if total is None:
            return None
        where = bucket_key(*key)
        if connection.dialect.name == "postgresql":
            target = select(Bucket.id).where(where).with_for_update(skip_locked=True).scalar_subquery()
            bucket_id = connection.execute(
                update(Bucket).where(Bucket.id == target).values(**total.values()).returning(Bucket.id)
            ).scalar_one_or_none()
            if bucket_id is None:  # locked by another transaction (or gone): counted later
                bucket_id = connection.scalar(select(Bucket.id).where(where))
                if bucket_id is not None and hits is not None:
                    counts.deferred[key] = hits.plus(counts.deferred.get(key))
                return bucket_id
        else:
            bucket_id = connection.execute(update(Bucket).where(where).values(**total.values()).returning(Bucket.id)).scalar_one_or_none()
        if earlier is not None:
            counts.folded.add(key)
        return bucket_id

    def _counted(self, connection: Connection, key: tuple[str, str, str], result: CaseResult, build_id: int, now: datetime, counts: _Counts) -> int:
        """`_count_hits` of one result in its existing bucket ``key``; the bucket's id."""
        bucket_id = self._count_hits(connection, key, BucketHits.of(result, build_id, now), counts)
        if bucket_id is None:  # seen in this transaction: it cannot be gone
            raise NotFoundError("bucket", "/".join(key))
        return bucket_id

    def _fold_deferred(self, connection: Connection, counts: _Counts, limit: int = 16) -> None:
        """Write up to ``limit`` deferred counts whose bucket row is free now (each skipped
        again while it is locked)."""
        for key in [k for k in self.deferred_hits if k not in counts.folded][:limit]:
            self._count_hits(connection, key, None, counts)

    def register_build(self, fingerprint: BuildFingerprint, versions: Mapping[str, str] | None = None) -> int:
        """The id of the build of ``fingerprint`` (plus package ``versions``), created on first
        sight with its package rows (`service.db.build_rows.register_build`).

        Raises:
            FieldValidationError: a package name of ``versions`` is empty.
        """
        return self._tx.write(lambda connection: register_build(connection, fingerprint, versions).build_id)

    def record_case(self, case_json: dict[str, Any], origin: str = "fuzz") -> str:
        """Store the case if it is new (the first origin recorded is kept); its ``case_id``.

        Args:
            case_json: ``AttentionCase.to_json()`` output; validated, then stored normalised.
            origin: one of ``"fuzz"``, ``"minimised"``, ``"corpus"``, ``"replay"``.

        Raises:
            oracle.errors.CaseValidationError: ``case_json`` is not a valid case.
            FieldValidationError: ``origin`` is unknown.
        """
        attention_case = AttentionCase.from_json(case_json)
        if origin not in ORIGINS:
            raise FieldValidationError("origin", f"unknown value {origin!r} (allowed: {', '.join(ORIGINS)})")
        self._tx.write(lambda connection: self._insert_case(connection, attention_case, origin))
        return attention_case.case_id

    @staticmethod
    def _insert_case(connection: Connection, attention_case: AttentionCase, origin: str) -> None:
        values = {
            "id": attention_case.case_id,
            "config": attention_case.to_json(),
            "origin": origin,
            "created_at": utcnow(),
            **case_filter_columns(attention_case),
        }
        insert_ignore(connection, Case.__table__, values, ["id"])

    def record_result(self, result: CaseResult, build_id: int, worker_id: int | None) -> BucketUpdate | None:
        """Store ``result`` once per ``(case_id, build_id, backend, variant, phase)`` (one
        transaction; see `_result_writer`).

        Raises:
            NotFoundError: ``result.case_id`` was never recorded (call `record_case` first), or
                ``build_id`` or ``worker_id`` is unknown.
        """
        return self._write_counting(self._result_writer(result, build_id, worker_id))

    def record_case_results(
        self, case_json: dict[str, Any], origin: str, results: list[CaseResult], build_id: int, worker_id: int | None
    ) -> list[BucketUpdate | None]:
        """`record_case` and `record_result` of every result of that case, in one transaction: all
        of it is stored, or (on an error) none of it. The build and the worker are checked once,
        the case not at all (it is written in the same transaction).

        Returns:
            One `record_result` answer per result, in order.

        Raises:
            oracle.errors.CaseValidationError: ``case_json`` is not a valid case.
            FieldValidationError: ``origin`` is unknown, or a result belongs to another case.
            NotFoundError: ``build_id`` or ``worker_id`` is unknown.
        """
        attention_case = AttentionCase.from_json(case_json)
        if origin not in ORIGINS:
            raise FieldValidationError("origin", f"unknown value {origin!r} (allowed: {', '.join(ORIGINS)})")
        for r in results:
            if r.case_id != attention_case.case_id:
                raise FieldValidationError(
                    "case_id", f"result of {r.backend}/{r.variant} has case_id {r.case_id!r}, not {attention_case.case_id!r}"
                )

        def run(connection: Connection, counts: _Counts) -> list[BucketUpdate | None]:
            self._insert_case(connection, attention_case, origin)
            self._check_build_worker(connection, build_id, worker_id)
            # every result row in one INSERT ... ON CONFLICT DO NOTHING RETURNING (the
            # first of a key repeated within the call is the one inserted); then, per failure, its
            # bucket, and per already-stored key the stored row's bucket, as `record_result` does
            now = utcnow()
            first: dict[tuple[str, str, str], int] = {}
            rows = []
            for i, r in enumerate(results):
                if (r.backend, r.variant, r.phase) not in first:
                    first[(r.backend, r.variant, r.phase)] = i
                    rows.append(self._result_values(r, build_id, worker_id, now))
            statement = _results_insert(connection.dialect.name)
            # executemany: SQLAlchemy sends it as multi-row INSERTs ("insertmanyvalues", batches
            # of its own size) from one cached compiled statement
            inserted = {tuple(row) for row in connection.execute(statement, rows)} if rows else set()
            updates: list[BucketUpdate | None] = []
            for i, r in enumerate(results):
                fresh = first[(r.backend, r.variant, r.phase)] == i and (r.backend, r.variant, r.phase) in inserted
                if fresh and not r.is_failure:
                    updates.append(None)
                else:
                    updates.append(self._result_writer(r, build_id, worker_id, check=False, inserted=fresh)(connection, counts))
            return updates

        return self._write_counting(run)

    @staticmethod
    def _result_values(result: CaseResult, build_id: int, worker_id: int | None, now: datetime) -> dict[str, Any]:
        """The ``results`` row of ``result``."""
        return {
            "case_id": result.case_id,
            "build_id": build_id,
            "worker_id": worker_id,
            "backend": result.backend,
            "variant": result.variant,
            "status": result.status,
            "signature": result.signature,
            "signatures": list(result.signatures),
            "metrics": result.metrics,
            "error_ratio": result.error_ratio,
            "run_ms": result.run_ms,
            "compile_ms": result.compile_ms,
            "oracle_ms": result.oracle_ms,
            "detail": result.detail,
            "backend_version": result.backend_version,
            "selected_kernel": result.selected_kernel,
            "phase": result.phase,
            "created_at": now,
        }

    def _result_writer(
        self, result: CaseResult, build_id: int, worker_id: int | None, check: bool = True, inserted: bool | None = None
    ) -> Callable[[Connection, _Counts], BucketUpdate | None]:
        """The write of `record_result` as a function of a connection and the write's bucket
        counts (`_write_counting`; ``check``: verify that the
        case, build and worker exist first; ``inserted``: the result row was already written by
        the caller, True, or was there before, False). Stores ``result`` once per
        ``(case_id, build_id, backend, variant, phase)``.

        A failing result is counted in its bucket ``(backend, variant, signature)``, created on
        first sight (`_count_hits`: never waiting for a row another transaction holds). Writing
        the same key again changes nothing and reports the stored row.

        Returns:
            For a failure: the bucket, whether this call created it and whether it has a
            minimised case. None for a non-failure.

        Raises:
            NotFoundError: ``result.case_id`` was never recorded (call `record_case` first), or
                ``build_id`` or ``worker_id`` is unknown.
        """

        def run(connection: Connection, counts: _Counts) -> BucketUpdate | None:
            now = utcnow()
            if check:
                self._check_references(connection, result.case_id, build_id, worker_id)
            if inserted is None:
                values = self._result_values(result, build_id, worker_id, now)
                result_id = insert_ignore(connection, Result.__table__, values, RESULT_KEY)
            else:
                result_id = 1 if inserted else None
            if result_id is None:
                return self._stored_bucket(connection, result, build_id)
            if not result.is_failure:
                return None
            key = (result.backend, result.variant, result.signature)
            # an existing bucket is read, not inserted over: PostgreSQL's INSERT ... ON CONFLICT
            # waits for a transaction that holds the conflicting row (a stopped worker's UPDATE)
            existing = connection.execute(select(Bucket.id, Bucket.minimised_case_id).where(bucket_key(*key))).first()
            if existing is not None:  # a plain read: no row lock
                bucket_id = self._counted(connection, key, result, build_id, now, counts)
                return BucketUpdate(bucket_id=bucket_id, is_new=False, minimised=existing.minimised_case_id is not None)
            bucket_values = {
                "backend": result.backend,
                "variant": result.variant,
                "signature": result.signature,
                "first_seen": now,
                "last_seen": now,
                "hit_count": 1,
                "first_case_id": result.case_id,
                "minimise_note": "",
                "first_build_id": build_id,
                "last_build_id": build_id,
                "triage_state": TriageState.new,
                "notes": "",
                **_bucket_severity_values(result),
            }
            bucket_id = insert_ignore(connection, Bucket.__table__, bucket_values, ["backend", "variant", "signature"])
            if bucket_id is not None:
                return BucketUpdate(bucket_id=bucket_id, is_new=True)
            bucket_id = self._counted(connection, key, result, build_id, now, counts)
            # a plain read (no row lock: it never waits on a transaction holding the bucket)
            minimised = connection.scalar(select(Bucket.minimised_case_id).where(Bucket.id == bucket_id)) is not None
            return BucketUpdate(bucket_id=bucket_id, is_new=False, minimised=minimised)

        return run

    @staticmethod
    def _check_references(connection: Connection, case_id: str, build_id: int, worker_id: int | None) -> None:
        if connection.scalar(select(Case.id).where(Case.id == case_id)) is None:
            raise NotFoundError("case", case_id)
        SqlStore._check_build_worker(connection, build_id, worker_id)

    @staticmethod
    def _check_build_worker(connection: Connection, build_id: int, worker_id: int | None) -> None:
        """Raise `NotFoundError` for an unknown ``build_id`` (first) or ``worker_id`` (None: not
        checked); both checked with one SELECT."""
        if worker_id is None:
            if connection.scalar(_BUILD_BY_ID, {"id": build_id}) is None:
                raise NotFoundError("build", build_id)
            return
        found_build, found_worker = connection.execute(
            _BUILD_AND_WORKER_BY_ID, {"build_id": build_id, "worker_id": worker_id}
        ).one()
        if found_build is None:
            raise NotFoundError("build", build_id)
        if found_worker is None:
            raise NotFoundError("worker", worker_id)

    @staticmethod
    def _stored_bucket(connection: Connection, result: CaseResult, build_id: int) -> BucketUpdate | None:
        stored = connection.execute(
            select(Result.status, Result.signature).where(
                Result.case_id == result.case_id,
                Result.build_id == build_id,
                Result.backend == result.backend,
                Result.variant == result.variant,
                Result.phase == result.phase,
            )
        ).one()
        if stored.signature is None:
            return None
        bucket = connection.execute(
            select(Bucket.id, Bucket.minimised_case_id).where(bucket_key(result.backend, result.variant, stored.signature))
        ).one_or_none()
        if bucket is None:  # no bucket row for the stored result's signature: no id
            return BucketUpdate(bucket_id=None, is_new=False)  # type: ignore[arg-type]
        return BucketUpdate(bucket_id=bucket.id, is_new=False, minimised=bucket.minimised_case_id is not None)

    def known_bucket_keys(self) -> set[tuple[str, str, str]]:
        """Every ``(backend, variant, signature)`` that has a bucket."""

        def run(connection: Connection) -> set[tuple[str, str, str]]:
            rows = connection.execute(select(Bucket.backend, Bucket.variant, Bucket.signature))
            return {(row.backend, row.variant, row.signature) for row in rows}

        return self._tx.read(run)

    def known_failures(self, backends: list[str]) -> list[tuple[tuple[str, str, str], dict[str, Any]]]:
        """Each bucket of ``backends`` with its minimised case (its first case if not minimised),
        as ``((backend, variant, signature), case_json)``, oldest bucket first."""

        def run(connection: Connection) -> list[tuple[tuple[str, str, str], dict[str, Any]]]:
            rows = bucket_cases(connection, backends)
            return [((r.backend, r.variant, r.signature), r.config) for r in rows]

        return self._tx.read(run)


def bucket_cases(connection: Any, backends: Iterable[str] | None = None) -> list[Any]:
    """Each bucket (of ``backends`` if given, else all) with the case that stands for it: its
    minimised case, else its first case. Rows ``(id, backend, variant, signature, config)``, oldest
    bucket first, read on ``connection`` (a Connection or a Session). Shared by
    `SqlStore.known_failures` and `service.matrix.replay_rows.replay_tasks_from_buckets`."""
    case_id = func.coalesce(Bucket.minimised_case_id, Bucket.first_case_id)
    statement = (
        select(Bucket.id, Bucket.backend, Bucket.variant, Bucket.signature, Case.config)
        .join(Case, Case.id == case_id)
        .order_by(Bucket.id)
    )
    if backends is not None:
        statement = statement.where(Bucket.backend.in_(list(backends)))
    return list(connection.execute(statement).all())
