"""The FastAPI application: `create_app()` builds settings, engine and routes, nothing at import.

Run it with ``uvicorn --factory service.app:create_app`` (settings from ``ATTNFUZZ_*``), or call
``create_app(Settings(database_url=...))``. The schema must have been migrated
(`service.migrations.upgrade`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request, status
from fastapi.responses import JSONResponse

from service.api.deps import require_read_token
from service.api.routes import buckets, cases, overview
from service.api.templating import make_templates
from service.db import make_engine, make_session_factory
from service.errors import FieldValidationError, NotFoundError
from service.settings import Settings

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def create_app(settings: Settings | None = None) -> FastAPI:
    """A new application on the database of ``settings`` (default: `Settings()` from the env).

    ``app.state`` holds ``settings``, ``engine``, ``session_factory`` and ``templates``; the
    engine is disposed when the application shuts down.
    """
    settings = settings if settings is not None else Settings()
    engine = make_engine(settings.database_url)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        engine.dispose()

    app = FastAPI(title="attnfuzz", summary="Differential fuzzing of attention kernels", lifespan=lifespan)
    app.state.settings = settings
    app.state.engine = engine
    app.state.session_factory = make_session_factory(engine)
    app.state.templates = make_templates()

    read = [Depends(require_read_token)]
    for module in (overview, buckets, cases):
        app.include_router(module.api_router, dependencies=read)
        app.include_router(module.page_router, dependencies=read, include_in_schema=False)

    @app.exception_handler(NotFoundError)
    async def _not_found(_request: Request, exc: NotFoundError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_404_NOT_FOUND)

    @app.exception_handler(FieldValidationError)
    async def _invalid(request: Request, exc: FieldValidationError) -> JSONResponse:
        where = "body" if request.method in WRITE_METHODS else "query"
        error = {"loc": [where, exc.field], "msg": exc.message, "type": "value_error"}
        return JSONResponse({"detail": [error]}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)

    return app
