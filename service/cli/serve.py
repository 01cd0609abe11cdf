"""``attnfuzz serve``: the dashboard and JSON API (`service.api.app.create_app`) under uvicorn.
Reads only: an old schema is exit 5 naming ``attnfuzz db upgrade``."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.markup import escape

from fuzzer.text import masked_url
from oracle.errors import AttnFuzzError
from service.cli.common import DbOption, check_schema, db_url, fail, out


def serve(
    db: DbOption = None,
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0-65535).")] = 8000,
    api_token: Annotated[
        Optional[str],
        typer.Option(
            envvar="ATTNFUZZ_API_TOKEN",
            show_envvar=True,
            show_default=False,
            help="Bearer token that triage (and the browser login) require; unset leaves triage open, "
            "or closed when ATTNFUZZ_WRITER_TOKEN is set (the writer token never triages).",
        ),
    ] = None,
) -> None:
    """Serve the dashboard and JSON API (FastAPI + uvicorn); the database is only read.

    It is never migrated (a read-only database can be served); an old schema is an error naming
    attnfuzz db upgrade. With ATTNFUZZ_WRITER_TOKEN and no API token, triage is closed (said at
    start)."""
    import uvicorn

    from service.api.app import create_app
    from service.api.deps import triage_closed
    from service.settings import Settings

    url = db_url(db)
    try:
        check_schema(url)
    except AttnFuzzError as exc:
        fail(exc)
    settings = Settings(database_url=url, api_token=api_token) if api_token else Settings(database_url=url)
    _check_bindable(host, port)
    out.print(f"serving {masked_url(url)} on http://{host}:{port}/ (API docs: /docs, metrics: /metrics)", soft_wrap=True, highlight=False)
    if triage_closed(settings):
        out.print(
            "triage is closed: ATTNFUZZ_WRITER_TOKEN is set without ATTNFUZZ_API_TOKEN (the writer token never "
            "triages); set ATTNFUZZ_API_TOKEN to triage through the service", soft_wrap=True, highlight=False,
        )
    uvicorn.run(create_app(settings), host=host, port=port, log_config=None)  # logs through our handler


def _check_bindable(host: str, port: int) -> None:
    """Exit 2 naming ``--host``/``--port`` when uvicorn could not listen there (a port in use, an
    address this machine does not have), before it starts: uvicorn logs a traceback and exits 1
    (new-user trial). Binds as uvicorn does (``SO_REUSEADDR``) and closes at once."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        out.print(f"[red]error:[/] {escape(f'host: cannot resolve {host!r}: {exc}')}", highlight=False)
        raise typer.Exit(2) from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            out.print(
                f"[red]error:[/] port: cannot listen on {host}:{port} ({exc.strerror or exc}); "
                "choose another with --port (or --host)", highlight=False,
            )
            raise typer.Exit(2) from None


def register(app: typer.Typer) -> None:
    """Add ``serve`` to ``app`` (the ``attnfuzz`` typer application)."""
    app.command()(serve)
