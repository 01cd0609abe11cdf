"""``attnfuzz export``: write a stored failure as a standalone pytest file.

Wired into the main CLI by ``service.cli.main`` calling `register(app)`. Exit codes follow
`service.cli.common.EXIT_CODES`: 0 written, 2 bad input (unknown case, a backend without a repro method, a variant
recorded only as unsupported or passing without ``--force``, a stored value that does not
validate), 5 the database cannot be opened or migrated. It first migrates the database to
the newest revision (the reading commands never do).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from oracle.errors import AttnFuzzError
from service.cli.common import DbOption, console, cwd_importable, fail, open_database, print_json, resolve_case_id


def export_case(
    case_id: Annotated[str, typer.Argument(help="AttentionCase.case_id (16 hex digits), or a unique prefix of one.")],
    output: Annotated[
        Optional[Path], typer.Option("-o", "--output", help="File to write ('-' = stdout; default: test_attnfuzz_<...>.py).")
    ] = None,
    backend: Annotated[
        Optional[str],
        typer.Option(help="Backend to call (default: the one the case failed on); a plugin not installed by "
                     "entry point as module:attr."),
    ] = None,
    variant: Annotated[Optional[str], typer.Option(help="API variant (default: the one the case failed on).")] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Export a variant whose results are only unsupported or passing.")
    ] = False,
    db: DbOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print {path, case_id, backend, variant, signature} as JSON on stdout.")
    ] = False,
) -> None:
    """Write CASE_ID as a pytest file that needs only torch, pytest and the backend's package.

    The file regenerates the inputs, calls the backend as the variant did and judges the result as
    the fuzzer did: it fails exactly while the recorded signature is still there. Allowances come
    from the stored results (computed with the float64 oracle where none were stored)."""
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.orm import Session

    from service.errors import NotFoundError, ServiceError
    from service.export.target import load_export

    try:
        url, engine = open_database(db, write=True)
    except AttnFuzzError as exc:
        fail(exc)
    spec = backend if backend is not None and ":" in backend else None
    if spec:  # ./module.py is found as `fuzz --backend module:attr` finds it
        cwd_importable()
    try:
        with Session(engine) as session:
            case_id = resolve_case_id(session, case_id)
            repro, target = load_export(
                session, case_id, backend=None if spec else backend, variant=variant, backend_spec=spec,
                force=force, compute_missing=True,
            )
    except NotFoundError:
        console.print(f"[red]error:[/] {escape(f'case_id: no case {case_id!r} in {url}')}")
        raise typer.Exit(2) from None
    except AttnFuzzError as exc:
        fail(exc)
    except SQLAlchemyError as exc:
        fail(ServiceError(f"database {url!r}: {type(exc).__name__}: {exc}"))
    finally:
        engine.dispose()
    if output is not None and str(output) == "-":
        typer.echo(repro.source, nl=False)
        return
    path = output if output is not None else Path(repro.filename)
    path.write_text(repro.source)
    if as_json:
        print_json({"path": str(path), "case_id": case_id, "backend": target.backend,
                    "variant": target.variant, "signature": target.signature,
                    "also_failing": [f"{b}/{v}" for b, v in target.also_failing]})
        return
    # this interpreter's pytest: a bare "pytest" may be another Python's, without torch, and the file then
    # only skips (a new-user trial saw "1 skipped" and no reason); -rs prints a skip's reason
    python = shlex.quote(sys.executable)
    console.print(
        f"wrote {path}: {target.backend} / {target.variant} / {target.signature or '(no recorded failure)'}; "
        f"run it with: {python} -m pytest -rs -c /dev/null {path} (-c /dev/null: without the pytest settings of the "
        f"project you are in, which may add options this file does not need; needs pytest: {python} -m pip install pytest)"
    )
    if target.also_failing:
        others = ", ".join(f"{b}/{v}" for b, v in target.also_failing)
        console.print(
            f"the case also failed on {others}: export one of them with --backend and --variant "
            f"(e.g. --backend {target.also_failing[0][0]} --variant {target.also_failing[0][1]})"
        )


def register(app: typer.Typer) -> None:
    """Add ``export`` to ``app`` (the ``attnfuzz`` typer application)."""
    app.command("export")(export_case)
