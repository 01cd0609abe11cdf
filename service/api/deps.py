"""FastAPI dependencies: the database sessions, the settings and the token checks.

Tests replace `get_session` and `get_write_session` through ``app.dependency_overrides`` to run
a request inside their rolled-back transaction.

Tokens: API clients send ``Authorization: Bearer <api_token>``. Browsers log in once at
``/login``, which stores a signed session (never the token itself, `service.api.hardening`) in the
``attnfuzz_token`` cookie (HttpOnly, SameSite=Strict,
so other sites' pages never send it); the pages and their forms accept that cookie too. JSON
writes accept only the header. With neither token set every write is open; with the writer token
alone (a service protected for a fleet) the ingestion writes need it and triage is closed
(`triage_closed`): the writer token never triages, and no login exists without the API token.

Bad input: integer path parameters are declared with `id_path` (1 to `MAX_SQL_INTEGER`), and
`reject_unstorable_text` refuses a NUL character or a lone surrogate anywhere in the path, the
query or a JSON or form body (text the databases cannot store or compare), each with 422 naming
the field.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Annotated, Any
from urllib.parse import parse_qsl

import pydantic_core
from fastapi import Depends, HTTPException, Path, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service.db.models import MAX_SQL_INTEGER
from service.settings import Settings

_bearer = HTTPBearer(auto_error=False, description="ATTNFUZZ_API_TOKEN")


TOKEN_COOKIE = "attnfuzz_token"


def get_session(request: Request) -> Iterator[Session]:
    """A session from the app's session factory, closed after the request."""
    with request.app.state.session_factory() as session:
        yield session


def get_write_session(request: Request) -> Iterator[Session]:
    """A session for requests that write: on SQLite its transactions begin ``IMMEDIATE`` (they
    take the write lock up front and wait their turn instead of failing on upgrade)."""
    with request.app.state.write_session_factory() as session:
        yield session


@contextmanager
def write_transaction(session: Session) -> Iterator[Session]:
    """Commit what the block wrote, or roll all of it back when the block raises, so a rejected
    request stores nothing."""
    try:
        yield session
    except BaseException:
        session.rollback()
        raise
    session.commit()


def get_settings(request: Request) -> Settings:
    """The settings `create_app` was built with."""
    return request.app.state.settings


SessionDep = Annotated[Session, Depends(get_session)]
WriteSessionDep = Annotated[Session, Depends(get_write_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def id_path(what: str) -> Any:
    """The declaration of an integer id path parameter: 1 to `MAX_SQL_INTEGER` (an id the
    database cannot hold is refused with 422 instead of reaching SQL)."""
    return Annotated[int, Path(ge=1, le=MAX_SQL_INTEGER, description=f"the {what}'s id")]


BucketId = id_path("bucket")
BuildId = id_path("build")
WorkerId = id_path("worker")
BisectionId = id_path("bisection")

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_MAYBE_UNSTORABLE_JSON = re.compile(rb"\x00|\\u0000|\\u[dD][89a-fA-F]")
"""What a JSON body must contain to hold an unstorable string: a NUL byte, or the escape of NUL or
of a surrogate (raw UTF-8 cannot encode a surrogate). A body without any is not walked (a result
batch of thousands of metrics documents costs more to walk than to store)."""


class FastJSONRequest(Request):
    """A request whose JSON body is parsed by pydantic-core's parser (Rust) instead of the standard
    library's, a third of its cost (16 us a result of a 3 MiB result batch, 2026-12-06): the same
    Python values for any body without a ``\\u`` escape. A body with one (where a lone surrogate
    may hide, which the Rust parser does not keep as the standard one does) and a body the Rust
    parser refuses go to ``json.loads``, whose errors FastAPI reports as before."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            parsed: Any = None
            if b"\\u" not in body:
                try:
                    parsed = pydantic_core.from_json(body)
                except ValueError:
                    parsed = None
            self._json = parsed if parsed is not None else json.loads(body)
        return self._json


class FastJSONRoute(APIRoute):
    """An `APIRoute` whose handler reads the body as a `FastJSONRequest` (FastAPI's custom request
    class pattern): the ingestion routes, where the body is a batch of thousands of results."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def fast_json_handler(request: Request) -> Response:
            return await handler(FastJSONRequest(request.scope, request.receive))

        return fast_json_handler


def _may_hold_unstorable(body: bytes) -> bool:
    """`_MAYBE_UNSTORABLE_JSON` found in ``body``, the regular expression run only where a byte
    search finds a NUL or a ``\\u`` escape: a result batch has neither, and the search runs at
    memory speed where the expression took 8 us a result (3 MiB bodies)."""
    if b"\x00" not in body and b"\\u" not in body:
        return False
    return _MAYBE_UNSTORABLE_JSON.search(body) is not None
"""Characters no database of ours can take in text: NUL (PostgreSQL refuses it in text, JSONB and
comparisons) and lone surrogates (not Unicode: encoding them to UTF-8 fails on both databases)."""


def unstorable_message(text: str) -> str | None:
    """Why ``text`` cannot be stored (the first offending character), or None when it can."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return "must not contain the NUL character (\\x00)"
    return f"must not contain a lone surrogate (\\u{ord(found.group()):04x}): not valid Unicode"


def _shown(name: str) -> str:
    """``name`` with each unstorable character escaped (``\\x00``, ``\\ud800``), for a ``loc``."""
    return _UNSTORABLE.sub(lambda found: found.group().encode("unicode_escape").decode(), name)


def _unstorable_in(value: Any, loc: tuple[str | int, ...]) -> list[tuple[tuple[str | int, ...], str]]:
    """``(loc, message)`` for each string (a value or a key) of a parsed JSON value that cannot be
    stored, in document order (iterative: any nesting the JSON parser took is walked)."""
    found: list[tuple[tuple[str | int, ...], str]] = []
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, loc)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if (message := unstorable_message(item)) is not None:
                found.append((where, message))
        elif isinstance(item, dict):
            children = []
            for key, child in item.items():
                shown = _shown(key) if isinstance(key, str) else key
                if isinstance(key, str) and (message := unstorable_message(key)) is not None:
                    found.append(((*where, shown), message))
                children.append((child, (*where, shown)))
            stack.extend(reversed(children))
        elif isinstance(item, list):
            stack.extend(reversed([(child, (*where, i)) for i, child in enumerate(item)]))
    return found


async def reject_unstorable_text(request: Request) -> None:
    """Refuse a NUL character or a lone surrogate in a path parameter, a query parameter (name or
    value), a JSON body or a form body. PostgreSQL refuses NUL in text, in JSONB and even in a
    comparison, and neither database can encode a lone surrogate (a ``"\\ud800"`` JSON escape):
    without this check each is a 500. No name, note or URL of ours needs either, so both databases
    refuse them alike.

    Raises:
        RequestValidationError: 422, one error per place (at most 20), ``loc`` naming it.
    """
    found: list[tuple[tuple[str | int, ...], str]] = []
    for name, value in request.path_params.items():
        if isinstance(value, str) and (message := unstorable_message(value)) is not None:
            found.append((("path", name), message))
    for name, value in request.query_params.multi_items():
        if (message := unstorable_message(name + value)) is not None:
            found.append((("query", _shown(name)), message))
    if request.method in WRITE_METHODS:
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type == "application/json" or content_type.endswith("+json"):
            if _may_hold_unstorable(await request.body()):  # cached: the route reads the same body
                try:
                    body = await request.json()  # cached too
                except (ValueError, RecursionError):
                    body = None  # not JSON (or nested too deep to parse): FastAPI answers that itself
                found += _unstorable_in(body, ("body",))
        elif content_type == "application/x-www-form-urlencoded":
            fields = parse_qsl((await request.body()).decode("utf-8", errors="replace"), keep_blank_values=True)
            for name, value in fields:
                if (message := unstorable_message(name + value)) is not None:
                    found.append((("body", _shown(name)), message))
    if found:
        raise RequestValidationError(
            [{"type": "value_error", "loc": loc, "msg": f"Value error, {message}", "input": None} for loc, message in found[:20]]
        )


TRIAGE_CLOSED_DETAIL = (
    "triage needs ATTNFUZZ_API_TOKEN to be set on the service: it has only ATTNFUZZ_WRITER_TOKEN, "
    "which is for workers (ingestion writes) only and never triages"
)
"""The 401 detail of a triage write while `triage_closed`."""

WRITER_TOKEN_DETAIL = "the writer token (ATTNFUZZ_WRITER_TOKEN) is for workers only and never triages: use ATTNFUZZ_API_TOKEN"
"""The 401 detail of a triage write that brings the writer token while the API token is set."""


def triage_closed(settings: Settings) -> bool:
    """True when ``writer_token`` is set and ``api_token`` is not: the service is protected for a
    fleet, its workers' token must not triage and no other token exists, so triage (the writes
    `require_write_token` and `require_form_token` guard) is refused instead of left open."""
    return settings.api_token is None and settings.writer_token is not None


def is_valid_token(settings: Settings, token: str | None) -> bool:
    """True when no token is configured (neither ``api_token`` nor ``writer_token``), or ``token``
    equals ``api_token`` (constant-time comparison); never with ``writer_token`` alone
    (`triage_closed`), whatever ``token`` is."""
    if settings.api_token is None:
        return settings.writer_token is None
    return token is not None and secrets.compare_digest(token.encode(), settings.api_token.encode())


def is_writer_token(settings: Settings, token: str | None) -> bool:
    """True when ``writer_token`` is set and ``token`` equals it (constant-time comparison)."""
    return (settings.writer_token is not None and token is not None
            and secrets.compare_digest(token.encode(), settings.writer_token.encode()))


def is_valid_session(settings: Settings, cookie: str | None) -> bool:
    """True when no token is configured (neither ``api_token`` nor ``writer_token``), or ``cookie``
    is a session cookie `/login` signed with the API token (`service.api.hardening.session_is_valid`;
    the raw token is not a session); never with ``writer_token`` alone (`triage_closed`)."""
    from service.api.hardening import session_is_valid

    if settings.api_token is None:
        return settings.writer_token is None
    return session_is_valid(settings.api_token, cookie)


def _check_token(settings: Settings, credentials: HTTPAuthorizationCredentials | None, cookie: str | None = None) -> None:
    """Pass with the API token (header, or the login cookie when ``cookie`` is given), or when no
    token is configured.

    Raises:
        HTTPException: 401 otherwise; with `TRIAGE_CLOSED_DETAIL` while `triage_closed`, with
            `WRITER_TOKEN_DETAIL` when the token given is the writer token.
    """
    if is_valid_token(settings, credentials.credentials if credentials else None):
        return
    if cookie is not None and is_valid_session(settings, cookie):
        return
    if triage_closed(settings):
        detail = TRIAGE_CLOSED_DETAIL
    elif is_writer_token(settings, credentials.credentials if credentials else None):
        detail = WRITER_TOKEN_DETAIL
    else:
        detail = "missing or wrong bearer token (ATTNFUZZ_API_TOKEN)"
    raise HTTPException(status_code=status.HTTP_401_UNAUTHORIZED, detail=detail, headers={"WWW-Authenticate": "Bearer"})


def require_write_token(settings: SettingsDep, credentials: Credentials) -> None:
    """JSON writes that are not ingestion (triage: ``PATCH /api/buckets/{id}``) need
    ``Authorization: Bearer <api_token>`` whenever ``api_token`` is set; open when neither token
    is set; refused with the writer token alone (`triage_closed`: the writer token is not taken).

    Raises:
        HTTPException: 401 without the API token (the request stores nothing); the detail says
            that triage needs ``ATTNFUZZ_API_TOKEN`` while `triage_closed`.
    """
    _check_token(settings, credentials)


def require_writer_token(settings: SettingsDep, credentials: Credentials) -> None:
    """Ingestion writes (what workers send) need ``Authorization: Bearer <token>`` with the
    ``writer_token`` or the ``api_token`` whenever either is set; open when neither is.

    Raises:
        HTTPException: 401 without a valid token (the request stores nothing).
    """
    if settings.writer_token is None:
        _check_token(settings, credentials)
        return
    given = credentials.credentials if credentials else None
    if is_writer_token(settings, given):
        return
    if settings.api_token is not None and given is not None and is_valid_token(settings, given):
        return
    raise HTTPException(
        status_code=status.HTTP_401_UNAUTHORIZED,
        detail="missing or wrong bearer token (ATTNFUZZ_WRITER_TOKEN)",
        headers={"WWW-Authenticate": "Bearer"},
    )


def require_read_token(request: Request, settings: SettingsDep, credentials: Credentials) -> None:
    """Reads need the token (header or login cookie) only when ``read_requires_token`` is set."""
    if settings.read_requires_token:
        _check_token(settings, credentials, request.cookies.get(TOKEN_COOKIE))


def require_form_token(request: Request, settings: SettingsDep, credentials: Credentials) -> None:
    """HTML form writes (the triage form): the API token as header or login cookie whenever
    ``api_token`` is set; open when neither token is set; refused with the writer token alone
    (`triage_closed`). A form of another site never gets here:
    `service.api.hardening.CrossSiteWriteMiddleware` answers it 403 first, token or not.

    Raises:
        HTTPException: 401 without a valid token (nothing changed); the detail says that triage
            needs ``ATTNFUZZ_API_TOKEN`` while `triage_closed`.
    """
    _check_token(settings, credentials, request.cookies.get(TOKEN_COOKIE))
