"""Buckets: ``/buckets``, ``/buckets/{id}`` (HTML, triage form) and ``/api/buckets`` (JSON)."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError

from fuzzer.severity import SEVERITIES
from service.db import findings, ingest, repository
from service.api.deps import (
    BucketId,
    SessionDep,
    WriteSessionDep,
    require_form_token,
    require_write_token,
    require_writer_token,
    triage_closed,
    write_transaction,
)
from service.api.routes.cases import repro_response
from service.errors import FieldValidationError
from service.export.backend import exportable_backends, importable_backends, plugin_export_command
from service.export.target import export_target
from service.db.models import TriageState
from service.api.requests import BucketQuery, MinimisedIn, PageQuery, TriageUpdate
from service.api.openapi import PAGE_HEADERS, paginate
from service.api.schemas import BucketDetailOut, BucketOut, BucketRowPageOut, LimitGroupOut, ResultPageOut

api_router = APIRouter(prefix="/api/buckets", tags=["buckets"])
page_router = APIRouter(tags=["pages"])


def _detail(session: SessionDep, bucket_id: int) -> BucketDetailOut | None:
    detail = repository.get_bucket(session, bucket_id)
    if detail is None:
        return None
    b, shown = detail.bucket, detail.failing_result
    case = b.minimised_case if shown is not None and b.minimised_case is not None and shown.case_id == b.minimised_case.id else b.first_case
    return BucketDetailOut.from_detail(detail, findings.bucket_findings(session, b, shown, case.config))


def _page(session: SessionDep, query: BucketQuery) -> BucketRowPageOut:
    page = repository.list_buckets(session, **query.filters())
    return BucketRowPageOut.from_page(page, findings.bucket_evidence(session, page.items))


@api_router.get("")
def list_buckets(session: SessionDep, query: Annotated[BucketQuery, Query()]) -> BucketRowPageOut:
    """Buckets matching the filters (backend, variant, signature substring, triage state, severity,
    and buckets with a failing result on a dtype, head_dim, mask kind or build), one page, each with
    its second opinion and the consensus on its case. Design limits are apart by default (counted
    in ``limit_total``; ``severity=limit`` lists them, ``limits=with`` mixes them in)."""
    return _page(session, query)


@api_router.get("/limits", responses={200: {"headers": PAGE_HEADERS}})
def list_limit_groups(
    request: Request, response: Response, session: SessionDep, page: Annotated[PageQuery, Query()]
) -> list[LimitGroupOut]:
    """The design-limit buckets grouped by (design, mechanism), most failing results first: one
    input regime that a correct kernel of the design fails, listed once with its backends."""
    groups = [LimitGroupOut.from_group(g) for g in findings.limit_groups(session)]
    return paginate(request, response, groups, page.limit, page.offset)


@api_router.get("/{bucket_id}")
def get_bucket(session: SessionDep, bucket_id: BucketId) -> BucketDetailOut:
    """A bucket with its first and minimised case and its latest results."""
    detail = _detail(session, bucket_id)
    if detail is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"bucket {bucket_id} not found")
    return detail


@api_router.get("/{bucket_id}/results")
def get_bucket_results(session: SessionDep, bucket_id: BucketId, page: Annotated[PageQuery, Query()]) -> ResultPageOut:
    """The results counted in the bucket, newest first, one page."""
    return ResultPageOut.from_page(repository.bucket_results(session, bucket_id, **page.model_dump()), bucket_id)


@api_router.get(
    "/{bucket_id}/repro.py",
    response_class=Response,
    responses={200: {"content": {"text/x-python": {}}, "description": "a standalone pytest file"}},
)
def get_bucket_repro(session: SessionDep, bucket_id: BucketId) -> Response:
    """The bucket's minimised case (else its first case) as a standalone pytest file for its
    backend variant (see ``GET /api/cases/{case_id}/repro.py``), from stored figures only."""
    return repro_response(export_target(session, repository.bucket_repro_target(session, bucket_id), force=True))


@api_router.get(
    "/{bucket_id}/issue.md",
    response_class=Response,
    responses={200: {"content": {"text/markdown": {}}, "description": "the bucket as an issue report"}},
)
def get_bucket_issue(session: SessionDep, bucket_id: BucketId) -> Response:
    """The bucket as an issue for the library's tracker (``attnfuzz report --bucket ID --format
    markdown``, `service.export.issue_report`), from stored data only."""
    from service.export.issue_report import bucket_issue

    return Response(bucket_issue(session, bucket_id).markdown, media_type="text/markdown; charset=utf-8")


@api_router.patch("/{bucket_id}", dependencies=[Depends(require_write_token)])
def update_bucket(session: WriteSessionDep, bucket_id: BucketId, update: TriageUpdate) -> BucketOut:
    """Change triage state, notes, upstream URL or duplicate target (only the fields sent). Needs
    the API token whenever it is set; with the writer token alone, 401 whatever is sent (triage
    needs ``ATTNFUZZ_API_TOKEN``, `service.api.deps.require_write_token`)."""
    with write_transaction(session):
        bucket = repository.update_triage(session, bucket_id, **update.changes())
    return BucketOut.from_row(bucket)


@api_router.post("/{bucket_id}/minimised", dependencies=[Depends(require_writer_token)], status_code=204)
def record_minimised(session: WriteSessionDep, bucket_id: BucketId, body: MinimisedIn) -> Response:
    """Store the minimised case of a bucket (what a remote worker's minimiser found)."""
    with write_transaction(session):
        ingest.ingest_minimised(
            session.connection(), bucket_id, body.case, body.original_case_id, body.note, worker_id=body.worker_id,
            attach=body.attach, lease=body.lease,
        )
    return Response(status_code=204)


# ------------------------------------------------------------------------------------- pages
@page_router.get("/buckets", response_class=HTMLResponse)
def buckets_page(request: Request, session: SessionDep, query: Annotated[BucketQuery, Query()]) -> HTMLResponse:
    page = _page(session, query)
    builds = repository.list_builds(session, limit=repository.MAX_PAGE_SIZE).items
    folded = query.severity is None and query.limits == "apart" and page.limit_total
    groups = [LimitGroupOut.from_group(g) for g in findings.limit_groups(session)] if folded else []
    return request.app.state.templates.TemplateResponse(
        request,
        "buckets.html",
        {
            "page": page,
            "query": query,
            "sorts": repository.BUCKET_SORTS,
            "masks": repository.MASKS,
            "builds": builds,
            "states": [s.value for s in TriageState],
            "severities": SEVERITIES,
            "limit_views": repository.LIMIT_VIEWS,
            "limit_groups": groups,
        },
    )


def _triage_access(request: Request) -> str:
    """How the bucket page offers triage: ``open`` (no token), ``login`` (the API token, through
    the login cookie) or ``closed`` (the writer token alone, `service.api.deps.triage_closed`: the
    form could only fail, so the page says what to set instead)."""
    settings = request.app.state.settings
    if triage_closed(settings):
        return "closed"
    return "open" if settings.api_token is None else "login"


def _bucket_page(request: Request, detail: BucketDetailOut, *, errors: list[str] = (), code: int = 200) -> HTMLResponse:
    """The bucket page. Its repro: the download where this process's backend declares a repro call;
    for a backend it cannot import (a plugin ``fuzz`` loaded as ``--backend module:attr``, whose
    spec the database does not keep) the ``attnfuzz export`` command of the bucket's case and
    variant, to run where the plugin imports; else that the adapter declares no repro call."""
    case = detail.minimised_case or detail.first_case  # what the download exports (bucket_repro_target)
    importable = detail.backend in importable_backends()
    return request.app.state.templates.TemplateResponse(
        request,
        "bucket.html",
        {
            "bucket": detail,
            "states": [s.value for s in TriageState],
            "errors": list(errors),
            "exportable": detail.backend in exportable_backends(),
            "plugin_export": None if importable else plugin_export_command(case.case_id, detail.variant),
            "updated": request.query_params.get("updated") == "1",
            "triage_access": _triage_access(request),
        },
        status_code=code,
    )


@page_router.get("/buckets/{bucket_id}", response_class=HTMLResponse)
def bucket_page(request: Request, session: SessionDep, bucket_id: BucketId) -> HTMLResponse:
    detail = _detail(session, bucket_id)
    if detail is None:
        return request.app.state.templates.TemplateResponse(
            request, "not_found.html", {"what": f"bucket {bucket_id}"}, status_code=status.HTTP_404_NOT_FOUND
        )
    return _bucket_page(request, detail)


async def form_fields(request: Request) -> dict[str, str]:
    """The fields of an ``application/x-www-form-urlencoded`` body (last value wins)."""
    return dict(parse_qsl((await request.body()).decode("utf-8", errors="replace"), keep_blank_values=True))


TRIAGE_FORM_FIELDS = ("triage_state", "notes", "upstream_url", "duplicate_of_id")


def _triage_from_form(fields: dict[str, str]) -> TriageUpdate:
    data: dict[str, Any] = {}
    for name in TRIAGE_FORM_FIELDS:
        if name in fields:
            value = fields[name]
            data[name] = None if value == "" and name in ("upstream_url", "duplicate_of_id") else value
    return TriageUpdate.model_validate(data)


@page_router.post("/buckets/{bucket_id}/triage", dependencies=[Depends(require_form_token)], response_class=HTMLResponse)
def triage_form(
    request: Request, session: WriteSessionDep, bucket_id: BucketId, fields: Annotated[dict[str, str], Depends(form_fields)]
) -> Response:
    """The bucket page's triage form: apply it and go back to the page (303), or show the page
    again with the error (422) and nothing changed. 401 without the API token whenever it is set,
    and always with the writer token alone (`service.api.deps.require_form_token`)."""
    errors: list[str] = []
    try:
        update = _triage_from_form(fields)
        with write_transaction(session):
            repository.update_triage(session, bucket_id, **update.changes())
    except ValidationError as exc:
        errors = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
    except FieldValidationError as exc:
        errors = [str(exc)]
    if not errors:
        return RedirectResponse(f"/buckets/{bucket_id}?updated=1", status_code=status.HTTP_303_SEE_OTHER)
    detail = _detail(session, bucket_id)
    if detail is None:
        return request.app.state.templates.TemplateResponse(
            request, "not_found.html", {"what": f"bucket {bucket_id}"}, status_code=status.HTTP_404_NOT_FOUND
        )
    return _bucket_page(request, detail, errors=errors, code=status.HTTP_422_UNPROCESSABLE_CONTENT)
