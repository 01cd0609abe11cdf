"""``attnfuzz db upgrade`` / ``db current``: migrate the schema (Alembic) or print its revision.
Exit 5 when the database cannot be opened or migrated."""

from __future__ import annotations

from typing import Annotated

import typer

from fuzzer.text import masked_url
from oracle.errors import AttnFuzzError
from service.cli.common import DbOption, db_url, fail, migrate, out, print_json, schema_revision

db_app = typer.Typer(help="Database schema management (Alembic migrations).", no_args_is_help=True)


@db_app.command("upgrade")
def db_upgrade(
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print {database, revision, head} as JSON.")] = False,
) -> None:
    """Create or migrate the schema to the newest revision."""
    url = db_url(db)
    try:
        migrate(url)
    except AttnFuzzError as exc:
        fail(exc)
    _print_revision(url, as_json)


@db_app.command("current")
def db_current(
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print {database, revision, head} as JSON.")] = False,
) -> None:
    """Print the schema revision of the database (never writes; exit 5 if it cannot be opened)."""
    _print_revision(db_url(db), as_json)


def _print_revision(url: str, as_json: bool) -> None:
    from service.db.migrations import head

    try:
        revision = schema_revision(url)
    except AttnFuzzError as exc:
        fail(exc)
    newest = head()
    if as_json:
        print_json({"database": masked_url(url), "revision": revision, "head": newest, "up_to_date": revision == newest})
    else:
        shown = masked_url(url)
        note = "" if revision == newest else f" (newest is {newest}: attnfuzz db upgrade --db {shown})"
        out.print(f"{shown}: at revision {revision}{note}", soft_wrap=True, highlight=False)

