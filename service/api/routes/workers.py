"""Workers: ``/api/workers`` (list, registration, heartbeats of remote workers)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, status
from fastapi.responses import Response

from service.db import ingest, repository
from service.api.deps import SessionDep, WorkerId, WriteSessionDep, require_writer_token, write_transaction
from service.api.requests import HeartbeatIn, WorkerIn, WorkerQuery
from service.api.schemas import IdOut, WorkerPageOut

api_router = APIRouter(prefix="/api/workers", tags=["workers"])
page_router = APIRouter(tags=["pages"])


@api_router.get("")
def list_workers(session: SessionDep, query: Annotated[WorkerQuery, Query()]) -> WorkerPageOut:
    """Workers, newest heartbeat first, with heartbeat age and cases/s; ``live`` keeps those heard
    from in the last 300 s."""
    page = repository.list_workers(session, live_only=query.live, limit=query.limit, offset=query.offset)
    return WorkerPageOut.from_page(page)


@api_router.post("", dependencies=[Depends(require_writer_token)], status_code=status.HTTP_201_CREATED)
def register_worker(session: WriteSessionDep, body: WorkerIn) -> IdOut:
    """Register a fuzz worker on a build; its id."""
    with write_transaction(session):
        worker_id = ingest.ingest_worker(session.connection(), **body.model_dump())
    return IdOut(id=worker_id)


@api_router.post("/{worker_id}/heartbeat", dependencies=[Depends(require_writer_token)], status_code=204)
def heartbeat(session: WriteSessionDep, worker_id: WorkerId, body: HeartbeatIn) -> Response:
    """Record that the worker is alive, with its case count and status."""
    with write_transaction(session):
        ingest.ingest_heartbeat(
            session.connection(), worker_id, body.cases_run, body.status, evaluations=body.evaluations,
            known_hits=body.known_hits,
        )
    return Response(status_code=204)
