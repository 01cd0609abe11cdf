"""FastAPI dependencies: the database session, the settings and the bearer-token checks.

Tests replace `get_session` through ``app.dependency_overrides`` to run a request inside their
rolled-back transaction.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service.settings import Settings

_bearer = HTTPBearer(auto_error=False, description="ATTNFUZZ_API_TOKEN")


def get_session(request: Request) -> Iterator[Session]:
    """A session from the app's session factory, closed after the request."""
    with request.app.state.session_factory() as session:
        yield session


def get_settings(request: Request) -> Settings:
    """The settings `create_app` was built with."""
    return request.app.state.settings


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _check_token(settings: Settings, credentials: HTTPAuthorizationCredentials | None) -> None:
    if settings.api_token is None:
        return
    if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), settings.api_token.encode()):
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail="missing or wrong bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )


def require_write_token(settings: SettingsDep, credentials: Credentials) -> None:
    """Writes need ``Authorization: Bearer <api_token>`` whenever ``api_token`` is set."""
    _check_token(settings, credentials)


def require_read_token(settings: SettingsDep, credentials: Credentials) -> None:
    """Reads need the token only when ``read_requires_token`` is set."""
    if settings.read_requires_token:
        _check_token(settings, credentials)
