"""Result ingestion for workers that cannot reach the database: ``POST /api/results`` and the
replay list ``GET /api/known-failures``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from service.db import ingest
from service.api.openapi import PAGE_HEADERS, paginate
from service.api.deps import SessionDep, WriteSessionDep, require_writer_token, write_transaction
from service.errors import FieldValidationError
from service.export.safety import NAME_PATTERN
from service.api.requests import ResultBatchIn
from service.api.schemas import BucketUpdateOut, KnownFailureOut, ResultBatchOut

api_router = APIRouter(prefix="/api", tags=["ingestion"])
page_router = APIRouter(tags=["pages"])


@api_router.post("/results", dependencies=[Depends(require_writer_token)])
def ingest_results(session: WriteSessionDep, body: ResultBatchIn) -> ResultBatchOut:
    """Store up to 1000 results of one build (and worker), all or none: each result's case must
    have been stored first (``POST /api/cases``). Idempotent per (case, build, backend, variant,
    phase). Each failure is counted in its bucket, created on first sight."""
    results = body.case_results()
    with write_transaction(session):
        updates = ingest.ingest_results(session.connection(), body.build_id, body.worker_id, results)
    return ResultBatchOut(
        updates=[None if u is None else BucketUpdateOut(bucket_id=u.bucket_id, is_new=u.is_new) for u in updates]
    )


@api_router.get("/known-failures", responses={200: {"headers": PAGE_HEADERS}})
def known_failures(
    request: Request,
    response: Response,
    session: SessionDep,
    backend: Annotated[list[str], Query(min_length=1, max_length=100)],
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> list[KnownFailureOut]:
    """Each bucket of the given backends with its minimised (else first) case, oldest first: what a
    starting worker replays. Paginated: ``limit``/``offset``, ``X-Total-Count`` and ``Link``."""
    for name in backend:
        if not NAME_PATTERN.match(name):
            raise FieldValidationError("backend", f"{name[:80]!r} is not a backend name")
    rows = ingest.known_failures(session.connection(), backend)
    rows = paginate(request, response, rows, limit, offset)
    return [KnownFailureOut(backend=b, variant=v, signature=s, case=case) for (b, v, s), case in rows]


