"""``attnfuzz corpus export`` / ``import``: the readable JSON corpus
(``corpus/<backend>/<variant>-<case_id>.json``) to and from the database. A malformed corpus file
stores nothing (exit 2, naming the file and field).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from fuzzer.text import masked_url
from oracle.errors import AttnFuzzError
from service.cli.matrix.options import open_engine
from service.cli.common import DbOption, db_url, fail, out, print_json


def corpus_export(
    root: Annotated[str, typer.Option("--root", help="Corpus directory to write.")] = "corpus",
    backend: Annotated[Optional[list[str]], typer.Option("--backend", help="Only these backends; repeatable.")] = None,
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print {root, files: [...]} as JSON.")] = False,
) -> None:
    """Write a corpus file per bucket: its minimised case, the last verdict per build, and as
    expected the newest verdict. Existing files keep their why/source and merge verdicts. Nothing
    is written through a symlink (a folder or file of the corpus that is one: exit 2, naming it)."""
    from fuzzer.builds.corpus import entry_path, load_corpus, save_entry
    from service.matrix.corpus_rows import corpus_entries_from_db

    try:
        existing = {e.relative_path.as_posix(): e for e in load_corpus(root)} if Path(root).is_dir() else {}
        engine = open_engine(db)
        try:
            entries = corpus_entries_from_db(engine, backends=backend, existing=existing)
        finally:
            engine.dispose()
        for entry in entries:  # every target checked before the first write (no symlink out of the corpus)
            entry_path(root, entry)
        paths = [save_entry(root, entry) for entry in entries]
    except AttnFuzzError as exc:
        fail(exc)
    if as_json:
        print_json({"root": str(root), "files": [str(p) for p in paths]})
        return
    out.print(f"{len(paths)} corpus file(s) written under {root}")


def corpus_import(
    root: Annotated[str, typer.Argument(help="Corpus directory (every *.json below it).")] = "corpus",
    verdicts: Annotated[
        bool, typer.Option("--verdicts/--no-verdicts", help="Also store each recorded verdict as a replay result on its build.")
    ] = True,
    db: DbOption = None,
) -> None:
    """Store every corpus case (origin ``corpus``) and the verdicts recorded per build. All files
    are checked first: a malformed file stores nothing and the error names the file and field."""
    from fuzzer.builds.corpus import load_corpus
    from service.matrix.corpus_rows import import_corpus

    try:
        entries = load_corpus(root)
        engine = open_engine(db)
        try:
            stored = import_corpus(engine, entries, with_verdicts=verdicts)
        finally:
            engine.dispose()
    except AttnFuzzError as exc:
        fail(exc)
    out.print(
        f"{len(entries)} corpus entries ({len({e.case.case_id for e in entries})} cases, {stored} verdicts) stored in {masked_url(db_url(db))}"
    )
