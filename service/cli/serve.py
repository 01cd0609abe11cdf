"""``attnfuzz serve``: the dashboard and JSON API (`service.api.app.create_app`) under uvicorn.
It reads the database and writes to it: the ingestion of workers started with ``attnfuzz fuzz
--server`` (`service.api.routes.worker_sink` and the other writer-token routes) and triage. It
never migrates: an old schema is exit 5 naming ``attnfuzz db upgrade``."""

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
            help="Bearer token that triage writes require (the bucket page's form after /login, PATCH /api/buckets/ID); "
            "worker ingestion accepts it besides $ATTNFUZZ_WRITER_TOKEN. Unset, triage is open, or closed when "
            "ATTNFUZZ_WRITER_TOKEN is set (the writer token never triages).",
        ),
    ] = None,
) -> None:
    """Serve the dashboard and JSON API (FastAPI + uvicorn): it reads the database and stores what workers and triage send.

    Ingestion: workers started with 'attnfuzz fuzz --server URL' write through it (POST /api/builds,
    /api/workers and their heartbeats, /api/cases, /api/case-results, /api/results, minimisation
    leases and minimised cases). When $ATTNFUZZ_WRITER_TOKEN or $ATTNFUZZ_API_TOKEN is set, each
    such write needs one of them as its bearer token (401 and nothing stored without).

    Triage: the bucket page's form and PATCH /api/buckets/ID change a bucket's triage state, notes,
    upstream link and duplicate; they need the API token when it is set, and are closed when only
    $ATTNFUZZ_WRITER_TOKEN is set (said at start).

    Without either token every write is open: give one before binding a --host others reach.
    The database is never migrated (run attnfuzz db upgrade; an old schema is an error naming it);
    one opened read-only can still be browsed, and writes to it fail with nothing stored."""
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
    if settings.api_token is None and settings.writer_token is None and not _loopback(host):
        out.print(
            f"warning: every write is open (no ATTNFUZZ_API_TOKEN or ATTNFUZZ_WRITER_TOKEN) and {host} is reachable "
            "from other machines: anyone who reaches it can store results and triage", soft_wrap=True, highlight=False,
        )
    if triage_closed(settings):
        out.print(
            "triage is closed: ATTNFUZZ_WRITER_TOKEN is set without ATTNFUZZ_API_TOKEN (the writer token never "
            "triages); set ATTNFUZZ_API_TOKEN to triage through the service", soft_wrap=True, highlight=False,
        )
    uvicorn.run(create_app(settings), host=host, port=port, log_config=None)  # logs through our handler


def _loopback(host: str) -> bool:
    """True when ``host`` (``--host``) names only this machine: ``localhost`` or a loopback address."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
