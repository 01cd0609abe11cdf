"""``attnfuzz cases list`` / ``cases show`` / ``cases add``: read stored cases (never migrating)
and store cases from JSON files. Exit 2 for bad input or an unknown case, 5 for the database."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from fuzzer.text import masked_url
from oracle.errors import AttnFuzzError, CaseValidationError
from service.cli.common import (
    DbOption,
    check_stored_name,
    describe_stored_case,
    console,
    db_url,
    fail,
    id_column,
    open_database,
    out,
    print_json,
    print_table,
    resolve_case_id,
    terminal_text,
    visible_text,
)

cases_app = typer.Typer(help="Inspect stored cases.", no_args_is_help=True)


@cases_app.command("list")
def cases_list(
    db: DbOption = None,
    failing: Annotated[bool, typer.Option("--failing", help="Only cases with a failing result.")] = False,
    backend: Annotated[Optional[str], typer.Option(help="Only cases this backend ran.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many cases (1-500).")] = 20,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List stored cases, newest first: id, description and result counts per status (the ids
    that `cases show` and `export` take)."""
    from sqlalchemy.orm import Session

    from service.db.repository import list_cases

    try:
        _, engine = open_database(db)
        try:
            with Session(engine) as session:
                if backend:
                    check_stored_name(session, "backend", backend)
                page = list_cases(session, failing=failing, backend=backend, limit=limit)
                rows = []
                for item in page.items:
                    rows.append({"case_id": item.case.id, "origin": item.case.origin,
                                 "description": describe_stored_case(item.case.config), "statuses": item.statuses})
        finally:
            engine.dispose()
    except AttnFuzzError as exc:
        fail(exc)
    if as_json:
        print_json({"total": page.total, "items": rows})
        return
    if not rows:  # an empty table says less than a sentence (new-user trial)
        what = ("no failing stored case" if failing else "no stored case") + (f" with results of {backend}" if backend else "")
        out.print(f"{what} in {masked_url(db_url(db))}")
        return
    table = Table(title=f"{len(rows)} of {page.total} cases")
    id_column(table, "case_id", [r["case_id"] for r in rows])
    table.add_column("origin", no_wrap=True)
    table.add_column("results")
    table.add_column("case")
    for row in rows:
        results = ", ".join(f"{n} {status}" for status, n in sorted(row["statuses"].items()))
        table.add_row(row["case_id"], row["origin"], terminal_text(results), terminal_text(row["description"]))
    print_table(table)


@cases_app.command("show")
def cases_show(
    case_id: Annotated[str, typer.Argument(help="A stored case id, or a unique prefix of one.")],
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show one case: its description, JSON and every stored result."""
    from sqlalchemy.orm import Session

    from oracle.config import AttentionCase
    from service.db.repository import get_case

    try:
        url, engine = open_database(db)
    except AttnFuzzError as exc:
        fail(exc)
    with Session(engine) as session:
        try:
            case_id = resolve_case_id(session, case_id)
        except AttnFuzzError as exc:
            fail(exc)
        detail = get_case(session, case_id)
        if detail is None:
            console.print(f"[red]error:[/] {escape(f'case_id: no case {case_id!r} in {masked_url(url)}')}")
            raise typer.Exit(2)
        try:
            case = AttentionCase.from_json(detail.case.config)
        except (CaseValidationError, TypeError, ValueError) as exc:  # stored before a bound it now breaks
            console.print(f"[bold red]error:[/] {escape(f'case {case_id} is stored but no longer validates: {exc}')}")
            print_json(detail.case.config)
            raise typer.Exit(2) from None
        results = [
            {
                "backend": r.backend,
                "variant": r.variant,
                "status": r.status,
                "signature": r.signature,
                "error_ratio": r.error_ratio,
                "phase": r.phase,
                "detail": r.detail,
            }
            for r in detail.results
        ]
    if as_json:
        print_json({"case": case.to_json(), "results": results})
        return
    out.print(f"[bold]{case.case_id}[/]  {escape(case.describe())}")
    print_json(case.to_json())
    from service.db.findings import ratio_text

    table = Table()
    id_column(table, "backend", [visible_text(r["backend"]) for r in results])
    id_column(table, "variant", [visible_text(r["variant"]) for r in results])
    for column in ("status", "signature", "error_ratio", "phase"):
        table.add_column(column)
    counts = Counter()
    for r in results:
        counts[r["status"]] += 1
        ratio = "" if r["error_ratio"] is None else ratio_text(r["error_ratio"])  # inf, not 1e+300
        table.add_row(terminal_text(r["backend"]), terminal_text(r["variant"]), r["status"], terminal_text(r["signature"] or ""),
                      ratio, r["phase"])
    print_table(table)


def _case_file_error(message: str) -> CaseValidationError:
    """A case file that cannot be read (`fuzzer.builds.corpus.read_json_file`'s message): field ``case``."""
    return CaseValidationError("case", message)


@cases_app.command("add")
def cases_add(
    paths: Annotated[list[str], typer.Argument(help="JSON files, each one AttentionCase.to_json() object.")],
    db: DbOption = None,
) -> None:
    """Store cases from JSON files (origin 'corpus'). Every file is checked first: one bad file
    (not JSON, an unknown field, a constraint violated; not a regular file, over 1 MiB, nested too
    deeply) stores nothing and names the file and field (exit 2)."""
    from fuzzer.builds.corpus import MAX_FILE_BYTES as MAX_CASE_FILE_BYTES, read_json_file
    from oracle.config import AttentionCase
    from service.db.store import SqlStore

    url = db_url(db)
    try:
        cases = []
        for path in paths:
            data = read_json_file(path, MAX_CASE_FILE_BYTES, _case_file_error)
            try:
                cases.append(AttentionCase.from_json(data))
            except CaseValidationError as exc:
                raise CaseValidationError(exc.field, f"{path}: {exc}") from exc
            except TypeError as exc:  # a value of the wrong type for a field
                raise CaseValidationError("case", f"{path}: {exc}") from exc
            except RecursionError as exc:  # a field's value nested deeper than its check walks
                raise CaseValidationError("case", f"{path}: a value nested too deeply") from exc
        _, engine = open_database(url, write=True)
        try:
            store = SqlStore(engine)
            for case in cases:
                store.record_case(case.to_json(), "corpus")
        finally:
            engine.dispose()
    except AttnFuzzError as exc:
        fail(exc)
    for case in cases:
        out.print(f"{case.case_id}  {case.describe()}")

