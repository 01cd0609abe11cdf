"""Cases: ``/cases/{case_id}`` (HTML) and ``/api/cases/{case_id}`` (JSON)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request, status
from fastapi.responses import HTMLResponse

from service import repository
from service.api.deps import SessionDep
from service.schemas import CaseDetailOut

api_router = APIRouter(prefix="/api/cases", tags=["cases"])
page_router = APIRouter(tags=["pages"])

CaseId = Annotated[str, Path(pattern=r"^[0-9a-f]{16}$", description="AttentionCase.case_id: 16 hex digits")]


def _detail(session: SessionDep, case_id: str) -> CaseDetailOut | None:
    detail = repository.get_case(session, case_id)
    return None if detail is None else CaseDetailOut.from_detail(detail)


@api_router.get("/{case_id}")
def get_case(session: SessionDep, case_id: CaseId) -> CaseDetailOut:
    """A case with every result recorded for it."""
    detail = _detail(session, case_id)
    if detail is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"case {case_id} not found")
    return detail


@page_router.get("/cases/{case_id}", response_class=HTMLResponse)
def case_page(request: Request, session: SessionDep, case_id: CaseId) -> HTMLResponse:
    detail = _detail(session, case_id)
    if detail is None:
        return request.app.state.templates.TemplateResponse(
            request, "not_found.html", {"what": f"case {case_id}"}, status_code=status.HTTP_404_NOT_FOUND
        )
    return request.app.state.templates.TemplateResponse(request, "case.html", {"case": detail})
