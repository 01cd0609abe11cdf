"""The front page ``/`` and ``/api/overview``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from service.db import findings, repository, stats
from service.api.deps import SessionDep
from service.api.schemas import BucketRowPageOut, OverviewOut

api_router = APIRouter(prefix="/api", tags=["overview"])
page_router = APIRouter(tags=["pages"])

RECENT_BUCKETS = 10


@api_router.get("/overview")
def get_overview(session: SessionDep) -> OverviewOut:
    """Counts by status and backend, failures by backend and signature, buckets, live workers
    (heartbeat age, cases/s) and cases per hour."""
    return OverviewOut.from_overview(stats.overview(session))


@page_router.get("/", response_class=HTMLResponse)
def overview_page(request: Request, session: SessionDep) -> HTMLResponse:
    overview = OverviewOut.from_overview(stats.overview(session))
    page = repository.list_buckets(session, limit=RECENT_BUCKETS, limits="apart")  # design limits are counted, not listed
    recent = BucketRowPageOut.from_page(page, findings.bucket_evidence(session, page.items))
    chart = {
        "hours": [int(h.hour.timestamp()) for h in overview.cases_per_hour],
        "cases": [h.cases for h in overview.cases_per_hour],
        "results": [h.results for h in overview.cases_per_hour],
    }
    return request.app.state.templates.TemplateResponse(
        request, "overview.html", {"overview": overview, "recent": recent, "chart": chart}
    )
