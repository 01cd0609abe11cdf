"""``attnfuzz replay`` (the corpus and every bucket's minimised case on the current build) and
``attnfuzz regressions`` (transitions along a package line), with what ``builds replay`` shares
with them: the replay tasks, the verdict rows and their tables. Exit 9 (`EXIT_MISMATCH`) when
``replay --check`` finds a verdict contradicting the corpus.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from oracle.errors import AttnFuzzError
from service.cli.matrix.options import (
    BackendOption,
    CaseTimeoutOption,
    DeviceOption,
    IsolationOption,
    PackageOption,
    check_package,
    open_engine,
)
from service.cli.common import EXIT_MISMATCH, DbOption, JsonOption, console, fail, out, print_json


def backend_specs(backend: Sequence[str] | None, wanted: set[str]) -> tuple[list[tuple[str, str]], set[str] | None]:
    """``(name, spec)`` of every known backend the tasks may name, and the names to restrict the
    tasks to (None: no restriction)."""
    from fuzzer import registry

    names = [b for b in (backend or []) if ":" not in b]
    specs = [b for b in (backend or []) if ":" in b]
    found = registry.discover(specs)
    restrict = set(names) | {b.name for spec in specs for b in registry.load_spec(spec)} if backend else None
    pairs = [(name, spec) for name, (_b, spec) in sorted(found.items()) if name in wanted]
    return pairs, restrict


def replay_tasks(
    corpus: str | None, engine: Any, use_db: bool, backend: Sequence[str] | None
) -> tuple[list, list[tuple[str, str]]]:
    """The replay tasks (the corpus's, then every bucket's with ``use_db``; duplicates dropped),
    restricted to ``backend`` when given, and ``(name, spec)`` of every backend they may name."""
    from fuzzer.builds.corpus import load_corpus
    from fuzzer.builds.replay import tasks_from_corpus
    from service.matrix.replay_rows import replay_tasks_from_buckets

    tasks = []
    if corpus and Path(corpus).is_dir():
        tasks.extend(tasks_from_corpus(load_corpus(corpus)))
    if use_db:
        tasks.extend(replay_tasks_from_buckets(engine))
    seen, unique = set(), []
    for task in tasks:
        if task.key not in seen:
            seen.add(task.key)
            unique.append(task)
    named = {b for b in (backend or []) if ":" not in b}
    pairs, restrict = backend_specs(backend, {t.backend for t in unique} | named)
    if restrict is not None:
        unique = [t for t in unique if t.backend in restrict]
    return unique, pairs


def verdict_rows(outcome: Any) -> list[dict[str, Any]]:
    from fuzzer.builds.replay import matches_expectation

    rows = []
    for task in outcome.tasks:
        verdict = outcome.verdict(task)
        rows.append(
            {
                "case_id": task.case.case_id,
                "backend": task.backend,
                "variant": task.variant,
                "source": task.source,
                "status": verdict.status,
                "signature": verdict.signature,
                "expected": None
                if task.expected_status is None
                else {"status": task.expected_status, "signature": task.expected_signature},
                "matches": matches_expectation(task, verdict),
                "detail": verdict.detail[-300:] if verdict.status == "skip" else "",
            }
        )
    return rows


def print_verdicts(title: str, rows: list[dict[str, Any]]) -> None:
    table = Table(title=title)
    for column in ("case", "backend", "variant", "verdict", "expected", "source"):
        table.add_column(column)
    for row in rows:
        verdict = row["status"] + (f" {row['signature']}" if row["signature"] else "")
        if row["status"] == "skip":
            verdict += f" ({row['detail'][:80]})"
        expected = ""
        if row["expected"]:
            expected = row["expected"]["status"] + (f" {row['expected']['signature']}" if row["expected"]["signature"] else "")
            mark = {True: " [green]ok[/]", False: " [bold red]MISMATCH[/]", None: ""}[row["matches"]]
            expected += mark
        table.add_row(row["case_id"], row["backend"], row["variant"], verdict, expected, row["source"])
    out.print(table)


def write_verdicts(corpus: str, outcome: Any, record: Any) -> int:
    """Write this build's verdict into each corpus entry that was replayed (skips excepted)."""
    from fuzzer.builds.corpus import Verdict, load_corpus, save_entry

    if record.build is None:
        return 0
    now = datetime.now(UTC).isoformat(timespec="seconds")
    packages = tuple(sorted(outcome.packages.items()))
    by_key = {(r.case_id, r.backend, r.variant): r for r in outcome.results}
    written = 0
    for entry in load_corpus(corpus):
        result = by_key.get((entry.case.case_id, entry.backend, entry.variant))
        if result is None:
            continue
        verdict = Verdict(outcome.fingerprint, result.status, result.signature, now, packages, record.build.build_key)
        save_entry(corpus, entry.with_verdict(verdict))
        written += 1
    return written


def replay(
    corpus: Annotated[Optional[str], typer.Option("--corpus", help="Corpus directory ('' for none).")] = "corpus",
    backend: BackendOption = None,
    db_cases: Annotated[bool, typer.Option("--db-cases/--no-db-cases", help="Also replay every bucket's case.")] = True,
    db: DbOption = None,
    device: DeviceOption = "auto",
    isolation: IsolationOption = "process",
    case_timeout: CaseTimeoutOption = 120.0,
    update_corpus: Annotated[
        bool, typer.Option("--update-corpus", help="Write this build's verdict into each replayed corpus file.")
    ] = False,
    check: Annotated[bool, typer.Option("--check", help="Exit 9 when a verdict contradicts the corpus's expectation.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Replay the corpus and every bucket's minimised case on the current build; store a result
    (or a skip) per case and backend."""
    from fuzzer.builds.replay import replay_here
    from service.matrix.replay_rows import record_replay

    try:
        engine = open_engine(db)
        try:
            tasks, pairs = replay_tasks(corpus, engine, db_cases, backend)
            outcome = replay_here(tasks, pairs, device=device, isolation=isolation, case_timeout_s=case_timeout)
            record = record_replay(engine, outcome, trigger="cli")
        finally:
            engine.dispose()
        written = write_verdicts(corpus, outcome, record) if update_corpus and corpus else 0
    except AttnFuzzError as exc:
        fail(exc)
    rows = verdict_rows(outcome)
    mismatches = [r for r in rows if r["matches"] is False]
    if as_json:
        build_id = None if record.build is None else record.build.build_id
        print_json({"build_id": build_id, "verdicts": rows, "corpus_files_updated": written})
    else:
        print_verdicts(f"replay of {len(rows)} task(s) on build {record.build.build_id if record.build else '?'}", rows)
        if update_corpus:
            out.print(f"{written} corpus file(s) updated")
    if check and mismatches:
        console.print(f"[bold red]{len(mismatches)} verdict(s) contradict the corpus[/]")
        raise typer.Exit(EXIT_MISMATCH)


def print_transitions(package: str, rows: list[dict[str, Any]]) -> None:
    if not rows:
        out.print(f"[green]no regression or fix along {package}[/]")
        return
    table = Table(title=f"regressions and fixes along {package}")
    for column in ("kind", "case", "backend", "variant", "before", "after", "device"):
        table.add_column(column)
    for r in rows:
        style = "green" if r["kind"] == "fix" else "red"
        before = f"{r['before_version']} {r['before_status']}" + (f" {r['before_signature']}" if r["before_signature"] else "")
        after = f"{r['after_version']} {r['after_status']}" + (f" {r['after_signature']}" if r["after_signature"] else "")
        table.add_row(f"[{style}]{r['kind']}[/]", r["case_id"], r["backend"], r["variant"], before, after, r["device_name"])
    out.print(table)


def regressions(
    package: PackageOption,
    backend: Annotated[Optional[str], typer.Option("--backend", help="Only this backend.")] = None,
    fixes: Annotated[bool, typer.Option("--fixes/--no-fixes", help="Also list fixes.")] = True,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Regressions (passed on an earlier build of the line, fails on a later one), new failure
    signatures and fixes along PACKAGE's builds, per device."""
    from fuzzer.results import FIX, TRANSITION_KINDS
    from service.matrix.grid import find_regressions

    kinds = TRANSITION_KINDS if fixes else tuple(k for k in TRANSITION_KINDS if k != FIX)
    try:
        engine = open_engine(db)
        try:
            check_package(engine, package)
            rows = [r.to_json() for r in find_regressions(engine, package, backend=backend, kinds=kinds)]
        finally:
            engine.dispose()
    except AttnFuzzError as exc:
        fail(exc)
    if as_json:
        print_json(rows)
        return
    print_transitions(package, rows)
