"""What a worker without database credentials needs (`fuzzer.http_sink.HttpSink`): batched
results (``POST /api/case-results``, one transaction a batch, `service.db.batch`), the known
buckets, minimisation leases (one owner per bucket across every worker) and the end of a lost
worker. Writes need the writer token (`service.api.deps.require_writer_token`); reads stay as
every other read."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request, Response

from service.api.deps import (
    BucketId,
    FastJSONRoute,
    SessionDep,
    WorkerId,
    WriteSessionDep,
    require_writer_token,
    write_transaction,
)
from service.api.requests import CaseBatchIn, ClaimIn, MinimisedIn, ReleaseIn, RenewIn
from service.api.schemas import AttachedOut, BatchUpdateOut, CaseBatchOut, ClaimOut, HeldOut, KnownOut
from service.db import batch, ingest
from service.db.store import SqlStore

api_router = APIRouter(prefix="/api", tags=["ingestion"], route_class=FastJSONRoute)
page_router = APIRouter(tags=["pages"])
_write = [Depends(require_writer_token)]


@api_router.post("/case-results", dependencies=_write)
def ingest_case_results(request: Request, session: WriteSessionDep, body: CaseBatchIn) -> CaseBatchOut:
    """Store cases with all their results, of one build (and worker), in ONE transaction: all or
    none. Idempotent per result (case, build, backend, variant, phase): a retried batch stores
    nothing twice. Each failure is counted in its bucket, created on first sight; a bucket row
    another request holds is not waited on (its count is added by a later batch)."""
    # PostgreSQL parses the results itself (one JSON document, jsonb_to_recordset): no CaseResult
    # for a result that passed or was unsupported
    document = body.results_json() if session.get_bind().dialect.name == "postgresql" else None
    try:
        updates = _ingest(request, session, body, document)
    except batch.DocumentRefusedError:
        # a value the database could not read (a metrics_json text): the rows path, which parses
        # every text in Python and answers 422 naming the first that is no JSON
        updates = _ingest(request, session, body, None)
    return CaseBatchOut(
        updates=[
            [None if u is None else BatchUpdateOut(bucket_id=u.bucket_id, is_new=u.is_new, minimised=u.minimised) for u in case]
            for case in updates
        ]
    )


def _ingest(request: Request, session: WriteSessionDep, body: CaseBatchIn, document: str | None) -> list[list[Any]]:
    """`batch.ingest_case_batch` of ``body`` in one transaction (``document``: its results as one
    JSON text, PostgreSQL only; None: the rows path)."""
    entries = body.entries(light=document is not None)
    pending = request.app.state.deferred_hits.begin()
    try:
        with write_transaction(session):
            updates = batch.ingest_case_batch(
                session.connection(), body.build_id, body.worker_id, entries, pending, results_json=document
            )
    except BaseException:
        pending.abort()
        raise
    pending.commit()
    return updates


@api_router.get("/known-buckets")
def known_buckets(session: SessionDep) -> list[tuple[str, str, str]]:
    """Every ``(backend, variant, signature)`` that has a bucket, sorted."""
    return sorted(SqlStore(session.connection()).known_bucket_keys())


@api_router.post("/minimisation/claim", dependencies=_write)
def claim_minimisation(session: WriteSessionDep, body: ClaimIn) -> ClaimOut | None:
    """Lease the oldest bucket of ``backends`` with no minimised case, no live lease and fewer
    than ``max_attempts`` claims to ``worker_id`` for ``lease_s`` seconds (with its sibling
    buckets); null when there is none. One owner per bucket across every worker."""
    with write_transaction(session):
        claim = SqlStore(session.connection()).claim_minimisation(body.worker_id, body.backends, body.lease_s, body.max_attempts)
    if claim is None:
        return None
    return ClaimOut(
        bucket_id=claim.bucket_id, key=claim.key, case=claim.case_json, attempt=claim.attempt, siblings=list(claim.siblings)
    )


@api_router.post("/minimisation/{bucket_id}/renew", dependencies=_write)
def renew_minimisation(session: WriteSessionDep, bucket_id: BucketId, body: RenewIn) -> HeldOut:
    """Extend the worker's lease by ``lease_s`` seconds from now; ``held`` false if it lost it."""
    with write_transaction(session):
        held = SqlStore(session.connection()).renew_minimisation(bucket_id, body.worker_id, body.lease_s)
    return HeldOut(held=held)


@api_router.post("/minimisation/{bucket_id}/release", dependencies=_write, status_code=204)
def release_minimisation(session: WriteSessionDep, bucket_id: BucketId, body: ReleaseIn) -> Response:
    """End the worker's lease without a minimised case (``outcome`` goes to the bucket's note)."""
    with write_transaction(session):
        SqlStore(session.connection()).release_minimisation(bucket_id, body.worker_id, body.outcome)
    return Response(status_code=204)


@api_router.post("/minimisation/{bucket_id}/minimised", dependencies=_write)
def record_minimised_leased(session: WriteSessionDep, bucket_id: BucketId, body: MinimisedIn) -> AttachedOut:
    """Store the bucket's minimised case (`SqlStore.record_minimised`); with ``lease``, 409 and
    nothing stored once that lease no longer holds."""
    with write_transaction(session):
        attached = ingest.ingest_minimised(
            session.connection(), bucket_id, body.case, body.original_case_id, body.note, worker_id=body.worker_id,
            attach=body.attach, lease=body.lease,
        )
    return AttachedOut(attached=attached)


@api_router.post("/workers/{worker_id}/lost", dependencies=_write)
def mark_worker_lost(session: WriteSessionDep, worker_id: WorkerId) -> KnownOut:
    """The worker is known dead (its spool slot was taken over): ``lost`` and its leases ended;
    ``known`` false when there is no such worker."""
    with write_transaction(session):
        known = SqlStore(session.connection()).mark_worker_lost(worker_id)
    return KnownOut(known=known)
