"""Settings of the web service, read from ``ATTNFUZZ_*`` environment variables.

Built by `service.api.app.create_app()` (or passed to it), never at import time.
"""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.db.engine import DEFAULT_DATABASE_URL


class Settings(BaseSettings):
    """Configuration of `service.api.app.create_app`.

    Attributes:
        database_url: SQLAlchemy URL (``ATTNFUZZ_DATABASE_URL``).
        api_token: bearer token required by writes (triage: ``PATCH /api/buckets/{id}``, the
            triage form through the login cookie) when set (``ATTNFUZZ_API_TOKEN``); None leaves
            them open only while ``writer_token`` is None too.
        writer_token: bearer token of workers (``ATTNFUZZ_WRITER_TOKEN``): accepted, besides
            ``api_token``, by the ingestion writes only (builds, workers, heartbeats, cases,
            results, minimisation leases; `service.api.deps.require_writer_token`), so a fleet
            worker holds no token that triages. When either token is set, an ingestion write
            without one is 401 and stores nothing. Set without ``api_token``, triage is closed:
            every triage write is 401 until ``api_token`` is set (`service.api.deps.triage_closed`).
        read_requires_token: also require the token for every page and GET
            (``ATTNFUZZ_READ_REQUIRES_TOKEN``); needs ``api_token``.
        trusted_hosts: comma-separated ``Host`` names the service answers
            (``ATTNFUZZ_TRUSTED_HOSTS``); loopback names by default (and ``testserver``, the
            name of Starlette's test client), ``*`` for any; others get 400 (DNS rebinding).
        max_body_bytes: largest request body, bytes (``ATTNFUZZ_MAX_BODY_BYTES``); larger is 413
            before it is parsed or any token is checked.
        allowed_origins: comma-separated origins (``https://dash.example``) whose pages may write
            besides this site's own (``ATTNFUZZ_ALLOWED_ORIGINS``; a proxy that rewrites ``Host``);
            a browser's write from any other site is 403 (`service.api.hardening`).
    """

    model_config = SettingsConfigDict(env_prefix="ATTNFUZZ_", extra="ignore")

    database_url: str = Field(default=DEFAULT_DATABASE_URL, repr=False)  # may hold a password
    api_token: str | None = Field(default=None, repr=False, min_length=1)
    writer_token: str | None = Field(default=None, repr=False, min_length=1)
    read_requires_token: bool = False
    trusted_hosts: str = "127.0.0.1,localhost,testserver"
    max_body_bytes: int = Field(default=4 * 2**20, ge=1)
    allowed_origins: str = ""

    @model_validator(mode="after")
    def _read_token_needs_token(self) -> Settings:
        if self.read_requires_token and not self.api_token:
            raise ValueError("read_requires_token=True needs api_token to be set")
        return self
