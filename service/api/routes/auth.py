"""Browser login: ``/login`` keeps the API token in an HttpOnly, SameSite=Strict cookie so that
pages (when reads need the token) and the triage form work in a browser; ``/logout`` drops it.
Without an API token there is nothing to log in with: the page says that triage is open (no token
at all) or closed until ``ATTNFUZZ_API_TOKEN`` is set (the writer token alone,
`service.api.deps.triage_closed`; the writer token never logs in)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from service.api.deps import TOKEN_COOKIE, SettingsDep, is_valid_token, triage_closed
from service.api.hardening import make_session
from service.api.routes.buckets import form_fields
from service.settings import Settings

page_router = APIRouter(tags=["pages"])


def _safe_next(target: str | None) -> str:
    """Only same-site paths: ``/buckets?x=1`` yes, ``//evil.example`` or ``https://...`` no."""
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"


NO_API_TOKEN = "this server has no token"
TRIAGE_CLOSED = (
    "this server has no API token: triage is closed until ATTNFUZZ_API_TOKEN is set on the service "
    "(the writer token, ATTNFUZZ_WRITER_TOKEN, is for workers only and does not log in)"
)


def _login_context(settings: Settings, target: str, error: str | None) -> dict[str, object]:
    """What ``login.html`` shows: the form when there is an API token, else why there is none."""
    return {
        "next": target,
        "error": error,
        "token_configured": settings.api_token is not None,
        "triage_closed": triage_closed(settings),
    }


@page_router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, settings: SettingsDep, next: str = "/") -> HTMLResponse:
    return request.app.state.templates.TemplateResponse(request, "login.html", _login_context(settings, _safe_next(next), None))


@page_router.post("/login", response_class=HTMLResponse)
def login(request: Request, settings: SettingsDep, fields: Annotated[dict[str, str], Depends(form_fields)]) -> Response:
    """Check the token; on success set the cookie and go to ``next`` (303), else 401 and the form
    (always 401 without an API token: the writer token never logs in). 429 with ``Retry-After``
    after too many failed logins from the client's address."""
    token = fields.get("token", "")
    target = _safe_next(fields.get("next"))
    limiter = request.app.state.login_limiter
    client = request.client.host if request.client else "unknown"
    wait_s = limiter.retry_after_s(client)
    if wait_s is not None:
        return Response(
            f"too many failed logins from {client}; retry in {wait_s} s",
            status_code=status.HTTP_429_TOO_MANY_REQUESTS,
            headers={"Retry-After": str(wait_s)},
            media_type="text/plain",
        )
    if settings.api_token is None or not is_valid_token(settings, token):
        limiter.failed(client)
        error = "wrong token" if settings.api_token is not None else TRIAGE_CLOSED if triage_closed(settings) else NO_API_TOKEN
        return request.app.state.templates.TemplateResponse(
            request, "login.html", _login_context(settings, target, error), status_code=status.HTTP_401_UNAUTHORIZED
        )
    response = RedirectResponse(target, status_code=status.HTTP_303_SEE_OTHER)
    response.set_cookie(  # a signed session, not the token (service.api.hardening.make_session)
        TOKEN_COOKIE, make_session(settings.api_token), httponly=True, samesite="strict", secure=request.url.scheme == "https", path="/"
    )
    return response


@page_router.post("/logout")
def logout() -> Response:
    response = RedirectResponse("/", status_code=status.HTTP_303_SEE_OTHER)
    response.delete_cookie(TOKEN_COOKIE, path="/")
    return response
