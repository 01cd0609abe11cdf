"""The ingestion API (``POST /api/...``): `service.db.store.SqlStore` in the caller's transaction
(a savepoint each), with the API's field names in its errors (a missing build is
``build_id``, a missing case ``results.<i>.case_id``). The caller commits, or rolls back to store
nothing. The HTTP routes write through these functions only; workers use `SqlStore` directly."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection

from fuzzer.results import BucketUpdate, BuildFingerprint, CaseResult
from service.errors import FieldValidationError, NotFoundError
from service.db.models import Bucket
from service.db.store import SqlStore


def ingest_results(
    connection: Connection, build_id: int, worker_id: int | None, results: list[CaseResult]
) -> list[BucketUpdate | None]:
    """Store ``results`` through `service.db.store.SqlStore` on ``connection`` (each in a savepoint of
    the caller's transaction), in a stable order (by bucket key) so that concurrent batches take
    bucket locks in the same order. The caller commits, or rolls back to store none of them.

    Returns:
        One entry per result, in the order given: the bucket update for a failure, else None.

    Raises:
        NotFoundError: a case, the build or the worker does not exist.
    """
    store = SqlStore(connection)
    order = sorted(range(len(results)), key=lambda i: (results[i].bucket_key or ("", "", ""), i))
    updates: list[BucketUpdate | None] = [None] * len(results)
    for i in order:
        try:
            updates[i] = store.record_result(results[i], build_id, worker_id)
        except NotFoundError as exc:
            field = {"case": f"results.{i}.case_id", "build": "build_id", "worker": "worker_id"}.get(exc.kind, exc.kind)
            raise FieldValidationError(field, f"{exc.kind} {exc.key!r} does not exist") from None
    return updates


def ingest_build(connection: Connection, fingerprint: BuildFingerprint) -> int:
    """`SqlStore.register_build` in the caller's transaction."""
    return SqlStore(connection).register_build(fingerprint)


def ingest_worker(connection: Connection, build_id: int, hostname: str, pid: int, device: str, slot: str | None = None) -> int:
    """`SqlStore.register_worker` in the caller's transaction.

    Raises:
        NotFoundError: ``build_id`` is unknown.
    """
    try:
        return SqlStore(connection).register_worker(build_id, hostname, pid, device, slot)
    except NotFoundError:
        raise FieldValidationError("build_id", f"build {build_id} does not exist") from None


def ingest_heartbeat(
    connection: Connection, worker_id: int, cases_run: int, status: str, *, evaluations: int | None = None,
    known_hits: int | None = None,
) -> None:
    """`SqlStore.heartbeat` in the caller's transaction (``evaluations``/``known_hits``: None keeps them).

    Raises:
        NotFoundError: ``worker_id`` is unknown.
    """
    SqlStore(connection).heartbeat(worker_id, cases_run, status, evaluations=evaluations, known_hits=known_hits)


def ingest_case(connection: Connection, case_json: dict[str, Any], origin: str) -> str:
    """`SqlStore.record_case` in the caller's transaction; the case id.

    Raises:
        oracle.errors.CaseValidationError: the case is invalid.
        FieldValidationError: unknown ``origin``.
    """
    return SqlStore(connection).record_case(case_json, origin)


def ingest_minimised(
    connection: Connection,
    bucket_id: int,
    case_json: dict[str, Any],
    original_case_id: str,
    note: str,
    *,
    worker_id: int | None = None,
    attach: Any = (),
    lease: int | None = None,
) -> list[int]:
    """`SqlStore.record_minimised` in the caller's transaction; the ids of the buckets attached.

    Raises:
        oracle.errors.CaseValidationError: the case is invalid.
        NotFoundError: the bucket or the original case does not exist.
        fuzzer.results.LeaseLostError: ``lease`` no longer holds (the app answers 409).
    """
    if connection.scalar(select(Bucket.id).where(Bucket.id == bucket_id)) is None:
        raise NotFoundError("bucket", bucket_id)
    try:
        return SqlStore(connection).record_minimised(
            bucket_id, case_json, original_case_id, note, worker_id=worker_id, attach=attach, lease=lease
        )
    except NotFoundError as exc:
        raise FieldValidationError("original_case_id", f"case {exc.key!r} does not exist") from None


def known_failures(connection: Connection, backends: list[str]) -> list[tuple[tuple[str, str, str], dict[str, Any]]]:
    """`SqlStore.known_failures`: each bucket of ``backends`` with its minimised (else first) case."""
    return SqlStore(connection).known_failures(backends)
