"""Browser login: ``/login`` keeps the API token in an HttpOnly, SameSite=Strict cookie so that
pages (when reads need the token) and the triage form work in a browser; ``/logout`` drops it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from service.api.deps import TOKEN_COOKIE, SettingsDep, is_valid_token
from service.api.hardening import make_session
from service.api.routes.buckets import form_fields

page_router = APIRouter(tags=["pages"])


def _safe_next(target: str | None) -> str:
    """Only same-site paths: ``/buckets?x=1`` yes, ``//evil.example`` or ``https://...`` no."""
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"


@page_router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, settings: SettingsDep, next: str = "/") -> HTMLResponse:
    return request.app.state.templates.TemplateResponse(
        request, "login.html", {"next": _safe_next(next), "error": None, "token_configured": settings.api_token is not None}
    )


@page_router.post("/login", response_class=HTMLResponse)
def login(request: Request, settings: SettingsDep, fields: Annotated[dict[str, str], Depends(form_fields)]) -> Response:
    """Check the token; on success set the cookie and go to ``next`` (303), else 401 and the form."""
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
        return request.app.state.templates.TemplateResponse(
            request,
            "login.html",
            {
                "next": target,
                "error": "wrong token" if settings.api_token is not None else "this server has no token",
                "token_configured": settings.api_token is not None,
            },
            status_code=status.HTTP_401_UNAUTHORIZED,
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
