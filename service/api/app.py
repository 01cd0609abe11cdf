"""The FastAPI application: `create_app()` builds settings, engine and routes, nothing at import.

Run it with ``uvicorn --factory service.api.app:create_app`` (settings from ``ATTNFUZZ_*``), or call
``create_app(Settings(database_url=...))``. The schema must have been migrated
(`service.db.migrations.upgrade`).
"""

from __future__ import annotations

import gc

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pathlib import Path

from fastapi import Depends, FastAPI, Request, status
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import DBAPIError

from fuzzer.results import LeaseLostError, ResultValidationError
from oracle.errors import CaseValidationError
from service.api import hardening
from service.api import metrics
from service.api import openapi
from service.api.deps import WRITE_METHODS, reject_unstorable_text, require_read_token
from service.api.routes import auth, buckets, builds, cases, overview, results, workers
from service.api.routes import matrix, worker_sink
from service.api.templating import make_templates
from service.db.engine import SQLITE_BEGIN_OPTION, make_engine, make_session_factory
from service.errors import FieldValidationError, NotFoundError
from service.settings import Settings
from service.db.engine import StoreRefusedError, StoreUnavailableError, is_transient, translate_fault

STATIC_DIR = Path(__file__).resolve().parents[1] / "static"
RETRY_AFTER_S = 1


GC_GEN0_THRESHOLD = 50_000
"""Allocations between two young collections in a service process (CPython's default: 700)."""
_gc_tuned = False


def tune_gc() -> None:
    """Once per process, at the app's start: collect, then freeze what is alive (the imported
    modules, the app: `gc.freeze`, out of every later collection) and make young collections
    rarer (`GC_GEN0_THRESHOLD`; the older generations keep CPython's ratios, so a full collection
    still comes every 100 young ones). A result batch builds about 100 objects a result (the
    parsed body, the request models): with CPython's defaults the collector walked the live heap
    many times a batch, 17-22 us of the service's CPU a result, a third of it
    (benchmarks/ingest_bench.py, 3 senders, 2026-12-06: 49 -> 27-32 us a result). Cyclic garbage
    is still collected; it waits longer for it."""
    global _gc_tuned
    if _gc_tuned:
        return
    _gc_tuned = True
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


async def _store_error(_request: Request, exc: Exception) -> JSONResponse:
    """503 for `StoreUnavailableError` / `StoreRefusedError`: nothing of the request was stored."""
    return openapi.error_response(
        status.HTTP_503_SERVICE_UNAVAILABLE,
        f"{exc}; nothing was stored, retry later",
        "unavailable",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def create_app(settings: Settings | None = None) -> FastAPI:
    """A new application on the database of ``settings`` (default: `Settings()` from the env).

    ``app.state`` holds ``settings``, ``engine``, ``session_factory``, ``write_session_factory``
    (``BEGIN IMMEDIATE`` on SQLite) and ``templates``; the engine is
    disposed when the application shuts down.

    Errors: bad input answers 422 with ``loc`` naming the field, never 500: request validation
    (ids bounded to what the database holds, enums with their allowed values), a NUL character
    anywhere in the request (`reject_unstorable_text`), `FieldValidationError`,
    `CaseValidationError` (also a stored case that no longer validates) and
    `fuzzer.results.ResultValidationError`; `NotFoundError` 404, a transient database conflict (deadlock,
    serialization failure, SQLite busy) or a database fault (connection refused, terminated or lost,
    server shutting down: `service.db.engine.translate_fault`) 503 with ``Retry-After``; the
    request then stored nothing. PostgreSQL connections are pre-pinged at checkout
    (`service.db.engine.make_engine`), so the first request after the database is back works.
    """
    settings = settings if settings is not None else Settings()
    engine = make_engine(settings.database_url)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        tune_gc()
        yield
        engine.dispose()

    from service import __version__

    app = FastAPI(
        title="attnfuzz",
        summary="Differential fuzzing of attention kernels",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,  # served from local assets by openapi.install
        redoc_url=None,
        generate_unique_id_function=openapi.operation_id,
    )
    openapi.install(app)
    app.state.settings = settings
    app.state.engine = engine
    app.state.session_factory = make_session_factory(engine)
    write_engine = engine.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"}) if engine.dialect.name == "sqlite" else engine
    app.state.write_session_factory = make_session_factory(write_engine)
    app.state.templates = make_templates()
    from service.db.batch import DeferredHits

    app.state.deferred_hits = DeferredHits()  # bucket counts of batches whose bucket row was held (service.db.batch)
    hardening.install(app, settings)  # security headers, trusted hosts, body limit, login rate limit

    read = [Depends(require_read_token), Depends(reject_unstorable_text)]
    for module in (overview, buckets, cases, builds, workers, results, matrix, worker_sink):
        app.include_router(module.api_router, dependencies=read)
        app.include_router(module.page_router, dependencies=read, include_in_schema=False)
    app.include_router(metrics.router, dependencies=read, include_in_schema=True)
    app.include_router(auth.page_router, include_in_schema=False)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.exception_handler(NotFoundError)
    async def _not_found(_request: Request, exc: NotFoundError) -> JSONResponse:
        return openapi.error_response(status.HTTP_404_NOT_FOUND, str(exc), "not_found")

    @app.exception_handler(FieldValidationError)
    async def _invalid(request: Request, exc: FieldValidationError) -> JSONResponse:
        where = "body" if request.method in WRITE_METHODS else "query"
        loc = [where, *(int(p) if p.isdigit() else p for p in exc.field.split("."))]
        error = {"loc": loc, "msg": exc.message, "type": "value_error"}
        return JSONResponse({"detail": [error]}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)

    @app.exception_handler(CaseValidationError)
    async def _invalid_case(request: Request, exc: CaseValidationError) -> JSONResponse:
        where = "body" if request.method in WRITE_METHODS else "query"
        error = {"loc": [where, "case", exc.field], "msg": str(exc), "type": "value_error"}
        return JSONResponse({"detail": [error]}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)

    @app.exception_handler(ResultValidationError)
    async def _invalid_result(request: Request, exc: ResultValidationError) -> JSONResponse:
        where = "body" if request.method in WRITE_METHODS else "query"
        field, _, message = str(exc).partition(": ")  # its messages are "<field>: <what is wrong>"
        error = {"loc": [where, field] if message else [where], "msg": str(exc), "type": "value_error"}
        return JSONResponse({"detail": [error]}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)

    @app.exception_handler(LeaseLostError)
    async def _lease_lost(_request: Request, exc: LeaseLostError) -> JSONResponse:
        return openapi.error_response(status.HTTP_409_CONFLICT, str(exc), "lease_lost")

    for store_error in (StoreUnavailableError, StoreRefusedError):
        app.add_exception_handler(store_error, _store_error)

    @app.exception_handler(DBAPIError)
    async def _database_error(request: Request, exc: DBAPIError) -> JSONResponse:
        # a fault (`translate_fault`: connection refused, terminated or lost, server shutting down)
        # or a transient conflict (a lock timeout, a serialization failure) is 503: the pool is
        # pre-pinged and a dead connection invalidated, so the next request after the database
        # answers again gets a new one; anything else is a bug (500)
        fault = translate_fault(exc, engine.dialect.name)
        if fault is None and not is_transient(exc):
            raise exc
        if fault is None or (is_transient(exc) and not exc.connection_invalidated):
            return openapi.error_response(
                status.HTTP_503_SERVICE_UNAVAILABLE,
                "the database is busy (transient conflict); nothing was stored, retry",
                "unavailable",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        return await _store_error(request, fault)

    return app
