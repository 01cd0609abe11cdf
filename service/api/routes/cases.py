"""Cases: ``/cases/{case_id}`` (HTML) and ``/api/cases`` (JSON, ingestion, repro export).

A case of a context-parallel family (a CP case, or the non-CP twin of stored CP cases) also shows
its CP results beside the non-CP results of the same backend variant and build
(`service.db.cp_view`), marking the pairs that agree with each other while both fail the float64
oracle ("agree but both wrong": what a CP-vs-non-CP test cannot see).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, status
from fastapi.responses import HTMLResponse, Response

from oracle.errors import CaseValidationError
from service.api.deps import SessionDep, WriteSessionDep, require_writer_token, write_transaction
from service.api.requests import CaseIn, ReproQuery
from service.api.schemas import CaseDetailOut, CaseIdOut, CasePageOut, CaseWithCPOut, CPFamilyOut
from service.db import ingest, repository
from service.db.cp_view import CP_METRICS_KEY, cp_view
from service.export.backend import exportable_backends
from service.export.repro import Repro
from service.export.target import load_export, unforced_exports

api_router = APIRouter(prefix="/api/cases", tags=["cases"])
page_router = APIRouter(tags=["pages"])

CaseId = Annotated[str, Path(pattern=r"^[0-9a-f]{16}$", description="AttentionCase.case_id: 16 hex digits")]


def _cp_family(session: SessionDep, case_id: str) -> CPFamilyOut | None:
    try:
        view = cp_view(session, case_id)
    except CaseValidationError:  # a case stored by an older schema: no family to show
        return None
    if view is None or not view.cp_cases:
        return None
    return CPFamilyOut.from_view(view)


def _detail(session: SessionDep, case_id: str) -> CaseWithCPOut | None:
    detail = repository.get_case(session, case_id)
    if detail is None:
        return None
    return CaseWithCPOut(**dict(CaseDetailOut.from_detail(detail)), cp=_cp_family(session, case_id))


def _tensor_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """A result's metrics without the CP block (the page shows that block in the CP table)."""
    return {name: figures for name, figures in metrics.items() if name != CP_METRICS_KEY}


def repro_response(repro: Repro) -> Response:
    """``repro`` as a ``text/x-python`` attachment."""
    return Response(
        repro.source,
        media_type="text/x-python; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{repro.filename}"'},
    )


@api_router.get("")
def list_cases(
    session: SessionDep,
    failing: Annotated[bool, Query(description="Only cases with a failing result.")] = False,
    backend: Annotated[str | None, Query(max_length=64, description="Only cases this backend ran.")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> CasePageOut:
    """Stored cases, newest first, one page, with their result counts per status (the ids that
    ``GET /api/cases/{case_id}`` takes)."""
    page = repository.list_cases(session, failing=failing, backend=backend, limit=limit, offset=offset)
    return CasePageOut.from_page(page)


@api_router.get("/{case_id}")
def get_case(session: SessionDep, case_id: CaseId) -> CaseWithCPOut:
    """A case with every result recorded for it and, for a context-parallel family, ``cp``: the
    CP results beside the non-CP twin's, with the "agree but both wrong" mark."""
    detail = _detail(session, case_id)
    if detail is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"case {case_id} not found")
    return detail


@api_router.get(
    "/{case_id}/repro.py",
    response_class=Response,
    responses={200: {"content": {"text/x-python": {}}, "description": "a standalone pytest file"}},
)
def get_repro(session: SessionDep, case_id: CaseId, query: Annotated[ReproQuery, Query()]) -> Response:
    """The case as a standalone pytest file for one backend variant: it needs only torch and the
    backend's package, regenerates the inputs, calls the backend as the variant did and checks
    the result as the fuzzer judged it (see `service.export.repro`), from stored figures only (no oracle
    in the request). Without ``backend``/``variant`` the one backend variant the case failed on is
    used; a variant whose results are only ``unsupported`` or passing needs ``force=true`` (422
    naming ``force`` otherwise)."""
    repro, _ = load_export(session, case_id, backend=query.backend, variant=query.variant, force=query.force)
    return repro_response(repro)


@api_router.post("", dependencies=[Depends(require_writer_token)], status_code=status.HTTP_201_CREATED)
def record_case(session: WriteSessionDep, body: CaseIn) -> CaseIdOut:
    """Store a case (idempotent: the first origin recorded is kept)."""
    with write_transaction(session):
        case_id = ingest.ingest_case(session.connection(), body.case, body.origin)
    return CaseIdOut(case_id=case_id)


@page_router.get("/cases/{case_id}", response_class=HTMLResponse)
def case_page(request: Request, session: SessionDep, case_id: CaseId) -> HTMLResponse:
    detail = _detail(session, case_id)
    if detail is None:
        return request.app.state.templates.TemplateResponse(
            request, "not_found.html", {"what": f"case {case_id}"}, status_code=status.HTTP_404_NOT_FOUND
        )
    tensor_metrics = {r.id: _tensor_metrics(r.metrics) for r in detail.results}
    return request.app.state.templates.TemplateResponse(
        request,
        "case.html",
        {"case": detail, "exportable": set(exportable_backends()), "unforced": unforced_exports(detail.config, detail.results),
         "cp": detail.cp, "tensor_metrics": tensor_metrics},
    )
