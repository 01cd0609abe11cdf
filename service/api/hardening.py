"""Web-service hardening: security headers, a body size limit, login rate limiting and signed
session cookies. `install` adds the ASGI middleware to an app (`service.api.app.create_app`).

* **Security headers** on every response: ``Content-Security-Policy`` (scripts and styles from
  this site only; inline ``style`` attributes allowed, inline scripts only on the API docs page),
  ``X-Frame-Options: DENY``, ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: same-origin``
  (other sites get no referrer; this site's own forms keep their ``Origin``, which under
  ``no-referrer`` browsers send as ``null``, the value a cross-site sandboxed form sends too).
* **Cross-site writes refused**: a ``POST``/``PUT``/``PATCH``/``DELETE`` whose browser says it
  comes from another site (``Origin`` of another host or port, or ``null``; without ``Origin``, a
  ``Referer`` of another site or ``Sec-Fetch-Site: cross-site``/``same-site``) is answered 403
  before it is routed, with or without an API token configured (`CrossSiteWriteMiddleware`): a
  page elsewhere cannot triage through the browser of someone who can reach the dashboard.
  Clients that send none of those headers (curl, httpx, the workers) are not browsers and go on
  to the token checks; ``Settings.allowed_origins`` adds origins (a proxy that rewrites ``Host``).
* **Trusted hosts**: Starlette's ``TrustedHostMiddleware`` with ``Settings.trusted_hosts``
  (loopback names by default), so a DNS-rebinding page cannot reach a loopback dashboard.
* **Body size limit**: ``Settings.max_body_bytes``; a larger ``Content-Length`` is answered 413
  before anything is read, and a chunked body is cut off (413) as soon as it grows past the limit.
  Middleware runs before routing, so before the body is parsed and before any token check.
* **Login rate limit**: at most `LOGIN_ATTEMPTS` failed logins per client address per
  `LOGIN_WINDOW_S` seconds; more are answered 429 with ``Retry-After``.
* **Session cookie**: ``/login`` sets `make_session` (issue time and an HMAC-SHA256 of it keyed
  by the API token), never the token itself; `session_is_valid` accepts it for
  `SESSION_MAX_AGE_S` seconds, and changing the token ends every session.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections import defaultdict, deque
from typing import Any
from urllib.parse import urlsplit

from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "object-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
DOCS_CSP = CSP.replace("script-src 'self'", "script-src 'self' 'unsafe-inline'")  # the docs page's init script
DOCS_PATHS = ("/docs", "/redoc")
SECURITY_HEADERS = {
    b"x-frame-options": b"DENY",
    b"x-content-type-options": b"nosniff",
    b"referrer-policy": b"same-origin",
}
LOGIN_ATTEMPTS = 10
LOGIN_WINDOW_S = 60.0
SESSION_MAX_AGE_S = 7 * 24 * 3600
SESSION_PREFIX = "v1"


class SecurityHeadersMiddleware:
    """Adds the security headers (module docstring) to every HTTP response."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        csp = DOCS_CSP if scope.get("path", "").startswith(DOCS_PATHS) else CSP

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in SECURITY_HEADERS]
                headers += list(SECURITY_HEADERS.items()) + [(b"content-security-policy", csp.encode())]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def _site(scheme: str, netloc: str) -> tuple[str, int | None] | None:
    """``(host, port)`` of ``netloc`` in lower case, the scheme's default port as None; None when
    it holds no host."""
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is no number, a malformed IPv6 address
        return None
    if not host:
        return None
    return host.lower(), None if port == DEFAULT_PORTS.get(scheme) else port


def cross_site_reason(method: str, headers: dict[str, str], scheme: str, allowed_origins: frozenset[str] = frozenset()) -> str | None:
    """Why the request is a cross-site write to refuse, or None (see the module docstring).

    Args:
        method: the HTTP method; only `WRITE_METHODS` are checked.
        headers: the request headers, names in lower case.
        scheme: the request's scheme (``http``; the default port of ``Host`` is its).
        allowed_origins: origins accepted besides this site's (``https://dash.example``).
    """
    if method.upper() not in WRITE_METHODS:
        return None
    here = _site(scheme, headers.get("host", ""))
    origin = headers.get("origin")
    if origin is not None:
        origin = origin.strip()
        if origin.rstrip("/").lower() in allowed_origins:
            return None
        if origin == "null":
            return "Origin: null (a sandboxed frame, a redirect or a page of another site)"
        parts = urlsplit(origin)
        there = _site(parts.scheme.lower(), parts.netloc) if parts.scheme else None
        return None if there is not None and there == here else f"Origin {origin[:200]!r} is not this site"
    fetch_site = headers.get("sec-fetch-site", "").strip().lower()
    if fetch_site in ("cross-site", "same-site"):
        return f"Sec-Fetch-Site: {fetch_site}"
    referer = headers.get("referer")
    if referer:
        parts = urlsplit(referer.strip())
        there = _site(parts.scheme.lower(), parts.netloc) if parts.scheme else None
        if f"{parts.scheme}://{parts.netloc}".lower() in allowed_origins:
            return None
        if there is None or there != here:
            return f"Referer of another site ({parts.scheme}://{parts.netloc[:200]})"
    return None


class CrossSiteWriteMiddleware:
    """Answers 403 for a cross-site write (`cross_site_reason`), before routing: nothing is read,
    checked or stored."""

    def __init__(self, app: ASGIApp, allowed_origins: frozenset[str] = frozenset()):
        self.app = app
        self.allowed_origins = allowed_origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method", "GET").upper() in WRITE_METHODS:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            reason = cross_site_reason(scope["method"], headers, scope.get("scheme", "http"), self.allowed_origins)
            if reason is not None:
                body = json.dumps({"detail": [{
                    "loc": ["header", "origin"], "type": "forbidden",
                    "msg": f"cross-site request refused: {reason}; nothing was changed (send it from this site's "
                           "pages, or from a client that is not a browser)",
                }]}).encode()
                await send({"type": "http.response.start", "status": 403,
                            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


class BodyTooLarge(Exception):
    """A request body grew past the limit while it was read."""


class BodySizeLimitMiddleware:
    """Answers 413 for a request body over ``max_bytes`` (module docstring)."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def _refuse(self, send: Send) -> None:
        body = b'{"detail":"request body too large (at most %d bytes); nothing was stored"}' % self.max_bytes
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = self.max_bytes + 1
                if declared > self.max_bytes:
                    await self._refuse(send)
                    return
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge()
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._refuse(send)


class LoginRateLimiter:
    """Failed logins per client address in a sliding window (thread-safe; one per app)."""

    def __init__(self, attempts: int = LOGIN_ATTEMPTS, window_s: float = LOGIN_WINDOW_S, clock: Any = time.monotonic):
        self.attempts = attempts
        self.window_s = window_s
        self._clock = clock
        self._failures: dict[str, deque[float]] = defaultdict(deque)
        self._lock = threading.Lock()

    def _recent(self, client: str) -> deque[float]:
        now = self._clock()
        failures = self._failures[client]
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
        return failures

    def retry_after_s(self, client: str) -> int | None:
        """Seconds until ``client`` may try again, or None when it may now."""
        with self._lock:
            failures = self._recent(client)
            if len(failures) < self.attempts:
                return None
            return max(1, int(failures[0] + self.window_s - self._clock()) + 1)

    def failed(self, client: str) -> None:
        with self._lock:
            self._recent(client).append(self._clock())
            if len(self._failures) > 10_000:  # bound the table: forget the oldest addresses
                for key in list(self._failures)[:5_000]:
                    del self._failures[key]


def _signature(token: str, issued: str) -> str:
    return hmac.new(token.encode(), f"attnfuzz-session:{issued}".encode(), hashlib.sha256).hexdigest()


def make_session(token: str, now: float | None = None) -> str:
    """The session cookie value for a login with ``token``: ``v1.<issued>.<hmac>`` (no token)."""
    issued = str(int(time.time() if now is None else now))
    return f"{SESSION_PREFIX}.{issued}.{_signature(token, issued)}"


def session_is_valid(token: str, cookie: str | None, now: float | None = None) -> bool:
    """True when ``cookie`` is a session made with ``token`` less than `SESSION_MAX_AGE_S` ago."""
    if not cookie:
        return False
    parts = cookie.split(".")
    if len(parts) != 3 or parts[0] != SESSION_PREFIX or not parts[1].isdigit():
        return False
    age = (time.time() if now is None else now) - int(parts[1])
    if not -60 <= age <= SESSION_MAX_AGE_S:
        return False
    return hmac.compare_digest(parts[2], _signature(token, parts[1]))


def trusted_hosts(setting: str) -> list[str]:
    """``Settings.trusted_hosts`` (comma-separated) as a list; ``*`` allows any host."""
    return [h.strip() for h in setting.split(",") if h.strip()] or ["*"]


def allowed_origins(setting: str) -> frozenset[str]:
    """``Settings.allowed_origins`` (comma-separated ``scheme://host[:port]``) as a set, lower case."""
    return frozenset(o.strip().rstrip("/").lower() for o in setting.split(",") if o.strip())


def install(app: Any, settings: Any) -> None:
    """Add the middleware to ``app`` (outermost first: hosts, headers, cross-site writes, body
    limit) and the login rate limiter to ``app.state.login_limiter``."""
    app.state.login_limiter = LoginRateLimiter()
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(CrossSiteWriteMiddleware, allowed_origins=allowed_origins(getattr(settings, "allowed_origins", "")))
    app.add_middleware(SecurityHeadersMiddleware)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=trusted_hosts(settings.trusted_hosts))


__all__ = [
    "BodySizeLimitMiddleware",
    "CrossSiteWriteMiddleware",
    "allowed_origins",
    "cross_site_reason",
    "LoginRateLimiter",
    "SecurityHeadersMiddleware",
    "install",
    "make_session",
    "session_is_valid",
    "trusted_hosts",
]
