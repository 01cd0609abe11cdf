"""Cases: ``/cases/{case_id}`` (HTML) and ``/api/cases`` (JSON, ingestion, repro export).

A case of a context-parallel family (a CP case, or the non-CP twin of stored CP cases) also shows
its CP results beside the non-CP results of the same backend variant and build
(`service.db.cp_view`), marking the pairs that agree with each other while both fail the float64
oracle ("agree but both wrong": what a CP-vs-non-CP test cannot see).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, status
from fastapi.responses import HTMLResponse, Response
from pydantic import BaseModel, Field

from oracle.errors import CaseValidationError
from service.db import repository
from service.api.deps import SessionDep, WriteSessionDep, require_write_token, write_transaction
from service.db.cp_view import CP_METRICS_KEY, CPCaseView, CPPair, CPView, cp_view
from service.export.backend import exportable_backends
from service.export.repro import Repro
from service.export.target import load_export
from service.api.schemas import CaseDetailOut, CaseIdOut, CaseIn, ReproQuery, ResultOut

api_router = APIRouter(prefix="/api/cases", tags=["cases"])
page_router = APIRouter(tags=["pages"])

CaseId = Annotated[str, Path(pattern=r"^[0-9a-f]{16}$", description="AttentionCase.case_id: 16 hex digits")]


class CPPairOut(BaseModel):
    """One backend variant on one build: its result on a CP case beside its result on the twin."""

    backend: str
    variant: str
    build_id: int
    cp_result: ResultOut
    non_cp_result: ResultOut | None = Field(description="the twin's latest result for this key; null if none is stored")
    agrees_with_non_cp: bool | None = Field(description="CP and non-CP outputs agree (measured by the worker); null if not measured")
    both_fail: bool | None = Field(description="both fail the float64 oracle; null when the twin's status is unknown")
    agree_but_both_wrong: bool = Field(description="they agree and both fail: the blind spot of CP-vs-non-CP tests")
    basis: str | None = Field(description='"tensors" (measured), "signatures" (same failure signature) or null')
    diff_ratio_vs_non_cp: float | str | None = Field(
        description="largest ||cp - non_cp|| / allowed over the tensors (\"inf\"/\"nan\" as strings); null if not measured"
    )

    @classmethod
    def from_pair(cls, pair: CPPair) -> CPPairOut:
        block = pair.cp_result.metrics.get(CP_METRICS_KEY) if isinstance(pair.cp_result.metrics, dict) else None
        ratio = block.get("diff_ratio_vs_non_cp") if isinstance(block, dict) else None
        return cls(
            backend=pair.backend,
            variant=pair.variant,
            build_id=pair.build_id,
            cp_result=ResultOut.model_validate(pair.cp_result),
            non_cp_result=ResultOut.model_validate(pair.non_cp_result) if pair.non_cp_result is not None else None,
            agrees_with_non_cp=pair.agrees_with_non_cp,
            both_fail=pair.both_fail,
            agree_but_both_wrong=pair.agree_but_both_wrong,
            basis=pair.basis,
            diff_ratio_vs_non_cp=ratio if isinstance(ratio, (int, float, str)) and not isinstance(ratio, bool) else None,
        )


class CPCaseOut(BaseModel):
    """One stored CP case of the family and its pairs."""

    case_id: str
    cp_size: int
    cp_comm_type: str
    description: str
    has_blind_spot: bool
    pairs: list[CPPairOut]

    @classmethod
    def from_view(cls, view: CPCaseView) -> CPCaseOut:
        return cls(
            case_id=view.case.id,
            cp_size=view.cp_size,
            cp_comm_type=view.cp_comm_type,
            description=view.case.to_attention_case().describe(),
            has_blind_spot=view.has_blind_spot,
            pairs=[CPPairOut.from_pair(p) for p in view.pairs],
        )


class CPFamilyOut(BaseModel):
    """A case's context-parallel family: the non-CP twin and every stored CP case, paired."""

    non_cp_case_id: str
    non_cp_case_stored: bool
    has_blind_spot: bool = Field(description="some pair agrees with non-CP while both fail the oracle")
    cp_cases: list[CPCaseOut] = Field(description="by cp_size, then comm type")

    @classmethod
    def from_view(cls, view: CPView) -> CPFamilyOut:
        return cls(
            non_cp_case_id=view.non_cp_case_id,
            non_cp_case_stored=view.non_cp_case is not None,
            has_blind_spot=view.has_blind_spot,
            cp_cases=[CPCaseOut.from_view(c) for c in view.cp_cases],
        )


class CaseWithCPOut(CaseDetailOut):
    """A case with its results and, when it belongs to a context-parallel family, that family."""

    cp: CPFamilyOut | None = Field(
        None, description="CP results beside the non-CP results of the same case; null when no CP case of it is stored"
    )


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


class CaseSummaryOut(BaseModel):
    """A stored case in a list: id, origin, description and its results' count per status."""

    case_id: str
    origin: str
    created_at: datetime
    description: str = Field(description="AttentionCase.describe(), or why the stored JSON no longer validates")
    statuses: dict[str, int] = Field(description="stored results of this case per status")


class CasePageOut(BaseModel):
    items: list[CaseSummaryOut]
    total: int = Field(description="cases matching the filters, over all pages")
    limit: int
    offset: int


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
    items = []
    for item in page.items:
        try:
            description = item.case.to_attention_case().describe()
        except CaseValidationError as exc:
            description = f"(stored config no longer validates: {exc})"
        items.append(CaseSummaryOut(case_id=item.case.id, origin=item.case.origin, created_at=item.case.created_at,
                                    description=description, statuses=item.statuses))
    return CasePageOut(items=items, total=page.total, limit=page.limit, offset=page.offset)


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


@api_router.post("", dependencies=[Depends(require_write_token)], status_code=status.HTTP_201_CREATED)
def record_case(session: WriteSessionDep, body: CaseIn) -> CaseIdOut:
    """Store a case (idempotent: the first origin recorded is kept)."""
    with write_transaction(session):
        case_id = repository.ingest_case(session.connection(), body.case, body.origin)
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
        {"case": detail, "exportable": set(exportable_backends()), "cp": detail.cp, "tensor_metrics": tensor_metrics},
    )
