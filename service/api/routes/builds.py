"""Builds: ``/builds`` (HTML; the place of the case x build matrix) and ``/api/builds`` (JSON)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse

from service.db import ingest, repository
from service.api.deps import BuildId, SessionDep, WriteSessionDep, require_writer_token, write_transaction
from service.api.requests import BuildIn, BuildQuery
from service.api.schemas import BuildOut, BuildPageOut, IdOut

api_router = APIRouter(prefix="/api/builds", tags=["builds"])
page_router = APIRouter(tags=["pages"])


@api_router.get("")
def list_builds(session: SessionDep, query: Annotated[BuildQuery, Query()]) -> BuildPageOut:
    """Builds (software and hardware fingerprints), newest first, one page."""
    return BuildPageOut.from_page(repository.list_builds(session, **query.model_dump()))


@api_router.get("/{build_id}")
def get_build(session: SessionDep, build_id: BuildId) -> BuildOut:
    """One build."""
    build = repository.get_build(session, build_id)
    if build is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"build {build_id} not found")
    return BuildOut.model_validate(build)


@api_router.post("", dependencies=[Depends(require_writer_token)])
def register_build(session: WriteSessionDep, body: BuildIn) -> IdOut:
    """The id of the build with this fingerprint, registered on first sight (idempotent)."""
    with write_transaction(session):
        build_id = ingest.ingest_build(session.connection(), body.fingerprint())
    return IdOut(id=build_id)


@page_router.get("/builds", response_class=HTMLResponse)
def builds_page(request: Request, session: SessionDep, query: Annotated[BuildQuery, Query()]) -> HTMLResponse:
    page = BuildPageOut.from_page(repository.list_builds(session, **query.model_dump()))
    return request.app.state.templates.TemplateResponse(request, "builds.html", {"page": page, "query": query})
