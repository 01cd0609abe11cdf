"""The build matrix: ``/matrix`` (HTML) and ``/api/matrix`` (JSON): package lines, their builds in
version order, the case x build matrix per backend, regressions and fixes, bisections."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import HTMLResponse

from fuzzer.results import TRANSITION_KINDS
from service.matrix import bisection_rows, grid, lines
from service.api.deps import BisectionId, SessionDep
from service.api.openapi import PAGE_HEADERS, paginate
from service.matrix.schemas import (
    BisectionOut,
    BisectRunOut,
    LineBuildOut,
    MatrixOut,
    PackageLineOut,
    RegressionOut,
)

api_router = APIRouter(prefix="/api/matrix", tags=["matrix"])
page_router = APIRouter(tags=["pages"])

Package = Annotated[str, Query(min_length=1, max_length=128, description="The package line, e.g. flash-attn-4.")]
Backend = Annotated[str | None, Query(max_length=64, description="Only this backend.")]
Device = Annotated[str | None, Query(max_length=256, description="Only builds on this device name.")]
Limit = Annotated[int, Query(ge=1, le=2000, description="At most this many rows.")]
Kind = Annotated[list[str] | None, Query(description="regression, new_signature, fix (repeatable; default all).")]
PageLimit = Annotated[int, Query(ge=1, le=10_000, description="Page size (X-Total-Count has the total).")]
PageOffset = Annotated[int, Query(ge=0, le=2**31 - 1, description="Rows to skip.")]
PAGED = {200: {"headers": PAGE_HEADERS}}


@api_router.get("/lines", responses=PAGED)
def list_lines(
    request: Request, response: Response, session: SessionDep, limit: PageLimit = 1000, offset: PageOffset = 0
) -> list[PackageLineOut]:
    """Every package line with its number of builds (paginated: ``X-Total-Count``, ``Link``)."""
    rows = paginate(request, response, lines.package_lines(session), limit, offset)
    return [PackageLineOut(package=p, builds=n) for p, n in rows]


@api_router.get("/builds", responses=PAGED)
def list_line_builds(
    request: Request,
    response: Response,
    session: SessionDep,
    package: Package,
    device_name: Device = None,
    limit: PageLimit = 1000,
    offset: PageOffset = 0,
) -> list[LineBuildOut]:
    """The builds of a line, ordered by the package's PEP 440 version, then first seen (paginated)."""
    rows = paginate(request, response, lines.line_builds(session, package, device_name=device_name), limit, offset)
    return [LineBuildOut.from_build(b) for b in rows]


@api_router.get("")
def get_matrix(
    session: SessionDep,
    package: Package,
    backend: Backend = None,
    device_name: Device = None,
    changes_only: bool = False,
    limit: Limit = grid.DEFAULT_MATRIX_ROWS,
) -> MatrixOut:
    """The case x build matrix of a line: each replayed task's verdict on each build (pass, fail
    with signature, unsupported, skip), transitions marked; rows with a regression first."""
    return MatrixOut.from_matrix(
        grid.build_matrix(session, package, backend=backend, device_name=device_name, changes_only=changes_only, limit=limit)
    )


@api_router.get("/regressions", responses=PAGED)
def list_regressions(
    request: Request,
    response: Response,
    session: SessionDep,
    package: Package,
    backend: Backend = None,
    kind: Kind = None,
    limit: PageLimit = 1000,
    offset: PageOffset = 0,
) -> list[RegressionOut]:
    """Regressions (pass then fail), new signatures and fixes along a line, per device (paginated)."""
    rows = grid.find_regressions(session, package, backend=backend, kinds=kind or TRANSITION_KINDS)
    return [RegressionOut.model_validate(r) for r in paginate(request, response, rows, limit, offset)]


@api_router.get("/bisections", responses=PAGED)
def list_bisections(
    request: Request,
    response: Response,
    session: SessionDep,
    package: Annotated[str | None, Query(max_length=128)] = None,
    limit: PageLimit = 1000,
    offset: PageOffset = 0,
) -> list[BisectRunOut]:
    """Stored bisections, newest first (paginated)."""
    rows = paginate(request, response, bisection_rows.list_bisections(session, package), limit, offset)
    return [BisectRunOut.model_validate(r) for r in rows]


@api_router.get("/bisections/{run_id}")
def get_bisection(session: SessionDep, run_id: BisectionId) -> BisectionOut:
    """One bisection with every step."""
    return BisectionOut.from_view(bisection_rows.get_bisection(session, run_id))


@page_router.get("/matrix", response_class=HTMLResponse)
def matrix_page(
    request: Request,
    session: SessionDep,
    package: Annotated[str | None, Query(max_length=128)] = None,
    backend: Backend = None,
    device_name: Device = None,
    changes_only: bool = False,
    limit: Limit = grid.DEFAULT_MATRIX_ROWS,
) -> HTMLResponse:
    line_rows = [PackageLineOut(package=p, builds=n) for p, n in lines.package_lines(session)]
    context: dict = {"lines": line_rows, "package": package or "", "backend": backend or "", "device_name": device_name or "",
                     "changes_only": changes_only, "limit": limit, "matrix": None, "regressions": [], "bisections": []}
    if package:
        # One build of the matrix serves the table and the regression list, unless a device filter
        # narrows the table (the list is always the line's, on every device).
        full = grid.build_matrix(session, package, backend=backend, device_name=device_name, changes_only=changes_only, limit=None)
        context["matrix"] = MatrixOut.from_matrix(grid.limited(full, limit))
        regressions = (
            grid.find_regressions(session, package, backend=backend) if device_name else grid.regressions_of(full)
        )
        context["regressions"] = [RegressionOut.model_validate(r) for r in regressions]
        context["bisections"] = [BisectRunOut.model_validate(r) for r in bisection_rows.list_bisections(session, package)]
    return request.app.state.templates.TemplateResponse(request, "matrix.html", context)


@page_router.get("/matrix/bisections/{run_id}", response_class=HTMLResponse)
def bisection_page(request: Request, session: SessionDep, run_id: BisectionId) -> HTMLResponse:
    bisection = BisectionOut.from_view(bisection_rows.get_bisection(session, run_id))
    return request.app.state.templates.TemplateResponse(request, "matrix_bisection.html", {"bisection": bisection})
