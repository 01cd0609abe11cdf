"""``attnfuzz export``: write a stored failure as a standalone pytest file.

Wired into the main CLI by ``service.cli.main`` calling `register(app)`. Exit codes follow
`service.cli.common.EXIT_CODES`: 0 written, 2 bad input (unknown case or bucket, neither or both of
them given, a backend without a repro method, a variant recorded only as unsupported or passing
without ``--force``, a stored value that does not validate, an ``--output`` that cannot be
written), 5 no database is there, or it cannot be opened or migrated. It first migrates the
database to the newest revision (the reading commands never do), but creates none.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from fuzzer.text import masked_url
from oracle.errors import AttnFuzzError
from service.cli.common import (
    DbOption,
    console,
    cwd_importable,
    fail,
    open_database,
    print_json,
    resolve_case_id,
    terminal_text,
)


def export_case(
    case_id: Annotated[
        Optional[str],
        typer.Argument(help="AttentionCase.case_id (16 hex digits), or a unique prefix of one; or give --bucket instead."),
    ] = None,
    bucket: Annotated[
        Optional[int],
        typer.Option("--bucket", min=1, help="Bucket id (attnfuzz buckets list): export its minimised case, else its "
                     "first case, for the bucket's backend and variant."),
    ] = None,
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
        bool, typer.Option("--json", help="Print {path, case_id, backend, variant, signature} (and bucket_id) as JSON on stdout.")
    ] = False,
) -> None:
    """Write CASE_ID (or the case of --bucket ID) as a pytest file that needs only torch, pytest and the backend's package.

    The file regenerates the inputs, calls the backend as the variant did and judges the result as
    the fuzzer did: it fails exactly while the recorded signature is still there. Allowances come
    from the stored results (computed with the float64 oracle where none were stored). With
    --bucket, a plugin's bucket needs its --backend module:attr (the database stores only the
    backend's name)."""
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.orm import Session

    from service.errors import NotFoundError, ServiceError
    from service.export.target import load_export

    if (case_id is None) == (bucket is None):
        raise typer.BadParameter("give a CASE_ID or --bucket ID (one of them)", param_hint="'CASE_ID' / '--bucket'")
    if bucket is not None and (variant is not None or (backend is not None and ":" not in backend)):
        raise typer.BadParameter(
            "--bucket exports the bucket's own backend and variant; --backend only as module:attr, for a plugin's bucket",
            param_hint="'--backend' / '--variant'",
        )
    if output is not None and str(output) != "-":
        _check_writable(output)  # before the work, not a traceback after it
    try:
        url, engine = open_database(db, write=True, create=False)
    except AttnFuzzError as exc:
        fail(exc)
    spec = backend if backend is not None and ":" in backend else None
    if spec:  # ./module.py is found as `fuzz --backend module:attr` finds it
        cwd_importable()
    try:
        with Session(engine) as session:
            if bucket is not None:
                repro, target = _load_bucket_export(session, bucket, spec)
                case_id = target.case.id
            else:
                case_id = resolve_case_id(session, case_id)
                repro, target = load_export(
                    session, case_id, backend=None if spec else backend, variant=variant, backend_spec=spec,
                    force=force, compute_missing=True,
                )
    except NotFoundError:
        what = f"bucket: no bucket {bucket}" if bucket is not None else f"case_id: no case {case_id!r}"
        console.print(f"[red]error:[/] {escape(f'{what} in {masked_url(url)}')}")
        raise typer.Exit(2) from None
    except AttnFuzzError as exc:
        fail(exc)
    except SQLAlchemyError as exc:
        fail(ServiceError(f"database {masked_url(url)!r}: {type(exc).__name__}: {exc}"))
    finally:
        engine.dispose()
    if output is not None and str(output) == "-":
        typer.echo(repro.source, nl=False)
        return
    path = output if output is not None else Path(repro.filename)
    try:
        path.write_text(repro.source)
    except OSError as exc:  # the folder went away, a full disk: no traceback
        console.print(f"[red]error:[/] {escape(f'output: cannot write {path}: {exc.strerror or exc}')}")
        raise typer.Exit(2) from None
    if as_json:
        print_json({"path": str(path), "case_id": case_id, **({} if bucket is None else {"bucket_id": bucket}),
                    "backend": target.backend, "variant": target.variant, "signature": target.signature,
                    "also_failing": [f"{b}/{v}" for b, v in target.also_failing]})
        return
    # this interpreter's pytest: a bare "pytest" may be another Python's, without torch, and the file then
    # only skips (a new-user trial saw "1 skipped" and no reason); -rs prints a skip's reason
    python = shlex.quote(sys.executable)
    import importlib.util

    # the interpreter named is this one: the install hint only where its pytest is missing
    needs = "" if importlib.util.find_spec("pytest") is not None else f"; needs pytest: {python} -m pip install pytest"
    console.print(
        f"wrote {escape(str(path))}: {terminal_text(target.backend)} / {terminal_text(target.variant)} / "
        f"{terminal_text(target.signature or '(no recorded failure)')}; "
        f"run it with: {python} -m pytest -rs -c /dev/null {path} (-c /dev/null: without the pytest settings of the "
        f"project you are in, which may add options this file does not need{needs})"
    )
    if target.also_failing:
        others = terminal_text(", ".join(f"{b}/{v}" for b, v in target.also_failing))
        console.print(
            f"the case also failed on {others}: export one of them with --backend and --variant "
            f"(e.g. --backend {terminal_text(target.also_failing[0][0])} --variant {terminal_text(target.also_failing[0][1])})"
        )


def _load_bucket_export(session, bucket_id: int, spec: str | None) -> tuple:
    """``(Repro, ReproTarget)`` of the bucket: its minimised case (else its first case) on its
    backend variant (`service.db.repository.bucket_repro_target`), the adapter loaded from
    ``spec`` for a plugin; exported as the API's ``/api/buckets/{id}/repro.py`` is (the bucket is
    the stored failure: no ``--force`` needed).

    Raises:
        NotFoundError: no bucket ``bucket_id``.
        ExportError: the backend cannot be resolved (a plugin's bucket without its spec: the
            message says to pass ``--backend module:attr``), or anything `export_target` raises.
    """
    from service.db import repository
    from service.export.backend import resolve_backend
    from service.export.safety import ExportError
    from service.export.target import export_target

    target = repository.bucket_repro_target(session, bucket_id)
    try:
        adapter = resolve_backend(target.backend, spec)
    except ExportError as exc:
        if spec is not None:
            raise
        raise ExportError("backend", f"bucket {bucket_id}: {exc.message}") from None
    return export_target(session, target, adapter=adapter, force=True, compute_missing=True), target


def _check_writable(path: Path) -> None:
    """Exit 2 naming ``--output`` when ``path`` cannot be written: its folder is missing, is no
    folder or is not writable, or ``path`` is a folder (a traceback before, after all the work)."""
    folder = path.parent if str(path.parent) else Path(".")
    why = None
    if not folder.exists():
        why = f"its folder {folder} does not exist (create it first)"
    elif not folder.is_dir():
        why = f"{folder} is not a folder"
    elif path.is_dir():
        why = f"{path} is a folder; give a file name"
    elif not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        why = f"{path if path.exists() else folder} is not writable"
    if why is not None:
        console.print(f"[red]error:[/] {escape(f'output: cannot write {path}: {why}')}")
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    """Add ``export`` to ``app`` (the ``attnfuzz`` typer application)."""
    app.command("export")(export_case)
