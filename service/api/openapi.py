"""What the JSON API promises in its OpenAPI document, and the Swagger UI served offline.

* Operation ids are the route functions' names (``list_buckets``, ``get_case``), not FastAPI's
  generated ``list_buckets_api_buckets_get``: `operation_id` is the app's
  ``generate_unique_id_function``; a test checks they are unique.
* One error shape for every error status: FastAPI's validation shape,
  ``{"detail": [{"loc": [...], "msg": "...", "type": "..."}]}`` (`ErrorResponse`). 404, 401, 403,
  503 answer it too (`error_response`, and the `HTTPException` handler installed by `install`);
  ``loc`` is ``[]`` when no one field is at fault.
* Declared errors: every ``/api`` operation and ``/metrics`` declares 401 (reads may need the
  token, ``ATTNFUZZ_READ_REQUIRES_TOKEN``), 503 (database busy or unavailable: retry after
  ``Retry-After``) and 422 (bad input); operations with a path parameter declare 404; writes
  declare 403 only where forms are involved (not in the JSON API).
* ``/docs`` is Swagger UI from ``service/static/swagger-ui`` (swagger-ui-dist, its licence files
  beside it), so it works without a network; ``/redoc`` (CDN only) is off.

Source: OpenAPI 3.1 (https://spec.openapis.org/oas/v3.1.0), FastAPI "Generate Clients" (custom
``generate_unique_id_function``) and "Custom Docs UI Static Assets (Self-Hosting)".
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

SWAGGER_DIR = "/static/swagger-ui"
ERROR_SCHEMA_REF = {"$ref": "#/components/schemas/ErrorResponse"}
DECLARED = {
    "401": "Missing or wrong bearer token (writes when ATTNFUZZ_API_TOKEN is set; reads too with ATTNFUZZ_READ_REQUIRES_TOKEN).",
    "404": "No such row (the message names it).",
    "422": "Bad input: loc names the field, msg says what is allowed.",
    "503": "The database is busy or unavailable; nothing was stored. Retry after the Retry-After header's seconds.",
}


class ErrorItem(BaseModel):
    """One error: where (``loc``: ``["query", "limit"]``, ``["body", "case", "head_dim"]``, or
    ``[]``), what (``msg``) and its kind (``type``: ``value_error``, ``not_found``, ...)."""

    loc: list[str | int] = Field(default_factory=list)
    msg: str
    type: str


class ErrorResponse(BaseModel):
    """The body of every error response of the API."""

    detail: list[ErrorItem]


def error_body(msg: str, type_: str, loc: list[str | int] | None = None) -> dict[str, Any]:
    """``{"detail": [{"loc": loc, "msg": msg, "type": type_}]}``."""
    return {"detail": [{"loc": list(loc or []), "msg": msg, "type": type_}]}


def error_response(status_code: int, msg: str, type_: str, loc: list[str | int] | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """A JSON error response in the one shape (`ErrorResponse`)."""
    return JSONResponse(error_body(msg, type_, loc), status_code=status_code, headers=headers)


HTTP_ERROR_TYPES = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed", 503: "unavailable"}


def operation_id(route: APIRoute) -> str:
    """The route function's name: ``list_buckets``, ``get_case``."""
    return route.name


async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    detail = exc.detail
    if isinstance(detail, list):  # already in the shape
        return JSONResponse({"detail": detail}, status_code=exc.status_code, headers=getattr(exc, "headers", None))
    return error_response(exc.status_code, str(detail), HTTP_ERROR_TYPES.get(exc.status_code, "http_error"),
                          headers=getattr(exc, "headers", None))


def _declare_errors(schema: dict[str, Any]) -> dict[str, Any]:
    """Add `DECLARED` responses (`ErrorResponse` bodies) to every API operation of ``schema``."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["ErrorResponse"] = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, sub in components["ErrorResponse"].pop("$defs", {}).items():
        components[name] = sub
    for path, operations in schema.get("paths", {}).items():
        if not (path.startswith("/api") or path == "/metrics"):
            continue
        for operation in operations.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            responses = operation["responses"]
            wanted = ["401", "503"]
            if "{" in path:
                wanted.append("404")
            if operation.get("parameters") or operation.get("requestBody"):
                wanted.append("422")
            for code in wanted:
                responses[code] = {
                    "description": DECLARED[code],
                    "content": {"application/json": {"schema": ERROR_SCHEMA_REF}},
                }
    for unused in ("HTTPValidationError", "ValidationError"):
        if not any(unused in str(v) for k, v in schema.items() if k != "components"):
            components.pop(unused, None)
    return schema


def install(app: FastAPI) -> None:
    """Install the error handler, the declared errors in ``app.openapi()`` and offline ``/docs``.

    ``app`` must have been created with ``docs_url=None, redoc_url=None`` and
    ``generate_unique_id_function=operation_id``.
    """
    app.add_exception_handler(StarletteHTTPException, _http_error)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, summary=app.summary, description=app.description,
                routes=app.routes,
            )
            app.openapi_schema = _declare_errors(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/docs", include_in_schema=False, response_class=HTMLResponse)
    async def swagger_ui() -> HTMLResponse:
        """Swagger UI on the API's OpenAPI document, from local assets (works offline)."""
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} API",
            swagger_js_url=f"{SWAGGER_DIR}/swagger-ui-bundle.js",
            swagger_css_url=f"{SWAGGER_DIR}/swagger-ui.css",
            swagger_favicon_url=f"{SWAGGER_DIR}/favicon-32x32.png",
        )


def case_json_schema() -> dict[str, Any]:
    """The JSON Schema of ``AttentionCase.to_json()`` (the ``case`` of ``POST /api/cases``): the
    fields of `oracle.config.AttentionCase` with their types and defaults, the allowed values of
    the enumerated ones (their ``Literal`` types: ``dtype``, ``qkv_format``, ...), ``schema_version``,
    and no other field. Cross-field rules (divisibility,
    bounds against each other) are checked by ``AttentionCase.from_json`` on the server: a case
    that breaks one is a 422 naming the field."""
    from pydantic import TypeAdapter

    from oracle import config

    schema = TypeAdapter(config.AttentionCase).json_schema()
    schema.pop("required", None)  # every field has a default
    schema["title"] = "AttentionCase"
    schema["additionalProperties"] = False
    properties = schema.setdefault("properties", {})
    properties["schema_version"] = {"type": "integer", "const": config.SCHEMA_VERSION, "title": "Schema Version"}
    return schema


class _CaseJsonMarker:
    """Publishes `case_json_schema` for a ``dict[str, Any]`` field (validation stays in
    ``AttentionCase.from_json``, whose errors name the field)."""

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> dict[str, Any]:
        return case_json_schema()


CaseJson = Annotated[dict[str, Any], _CaseJsonMarker]
"""The type of a case in request bodies: a dict, documented by `case_json_schema`."""


PAGE_HEADERS = {
    "X-Total-Count": {"description": "items over all pages", "schema": {"type": "integer"}},
    "Link": {"description": 'RFC 8288 rel="next" link to the next page, when there is one', "schema": {"type": "string"}},
}


def paginate(request: Request, response: Any, items: list, limit: int, offset: int) -> list:
    """One page of a list endpoint that answers a JSON array: ``items[offset:offset + limit]``,
    with the total in ``X-Total-Count`` and the next page in ``Link: <...>; rel="next"`` (the
    array stays the body, so existing clients keep working)."""
    total = len(items)
    response.headers["X-Total-Count"] = str(total)
    if offset + limit < total:
        next_page = request.url.include_query_params(limit=limit, offset=offset + limit)
        response.headers["Link"] = f'<{next_page}>; rel="next"'
    return items[offset:offset + limit]
