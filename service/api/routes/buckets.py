"""Buckets: ``/buckets``, ``/buckets/{id}`` (HTML) and ``/api/buckets`` (JSON, triage by PATCH)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse

from service import repository
from service.api.deps import SessionDep, require_write_token
from service.schemas import BucketDetailOut, BucketOut, BucketPageOut, BucketQuery, TriageUpdate

api_router = APIRouter(prefix="/api/buckets", tags=["buckets"])
page_router = APIRouter(tags=["pages"])


def _detail(session: SessionDep, bucket_id: int) -> BucketDetailOut | None:
    detail = repository.get_bucket(session, bucket_id)
    return None if detail is None else BucketDetailOut.from_detail(detail)


@api_router.get("")
def list_buckets(session: SessionDep, query: Annotated[BucketQuery, Query()]) -> BucketPageOut:
    """Buckets matching the filters, one page."""
    return BucketPageOut.from_page(repository.list_buckets(session, **query.filters()))


@api_router.get("/{bucket_id}")
def get_bucket(session: SessionDep, bucket_id: int) -> BucketDetailOut:
    """A bucket with its first and minimised case and its latest results."""
    detail = _detail(session, bucket_id)
    if detail is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"bucket {bucket_id} not found")
    return detail


@api_router.patch("/{bucket_id}", dependencies=[Depends(require_write_token)])
def update_bucket(session: SessionDep, bucket_id: int, update: TriageUpdate) -> BucketOut:
    """Change triage state, notes, upstream URL or duplicate target (only the fields sent)."""
    bucket = repository.update_triage(session, bucket_id, **update.changes())
    session.commit()
    return BucketOut.from_row(bucket)


@page_router.get("/buckets", response_class=HTMLResponse)
def buckets_page(request: Request, session: SessionDep, query: Annotated[BucketQuery, Query()]) -> HTMLResponse:
    page = BucketPageOut.from_page(repository.list_buckets(session, **query.filters()))
    return request.app.state.templates.TemplateResponse(
        request, "buckets.html", {"page": page, "query": query, "sorts": repository.BUCKET_SORTS}
    )


@page_router.get("/buckets/{bucket_id}", response_class=HTMLResponse)
def bucket_page(request: Request, session: SessionDep, bucket_id: int) -> HTMLResponse:
    detail = _detail(session, bucket_id)
    if detail is None:
        return request.app.state.templates.TemplateResponse(
            request, "not_found.html", {"what": f"bucket {bucket_id}"}, status_code=status.HTTP_404_NOT_FOUND
        )
    return request.app.state.templates.TemplateResponse(request, "bucket.html", {"bucket": detail})
