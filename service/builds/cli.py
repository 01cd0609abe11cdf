"""The build-matrix commands of the ``attnfuzz`` CLI; `register` adds them to the main typer app.

Commands:

=============================  ==================================================================
``builds fetch``               download wheels into a wheelhouse (``pip download``; a convenience
                               where the index is reachable)
``builds prepare``             one environment per build of a package from an offline wheelhouse
                               (or adopt directories like ``/tmp/fa4/<version>``)
``builds list``                prepared environments and the builds of a line in the database
``builds replay``              replay the corpus and every bucket's case on each build, each in
                               its own child process
``replay``                     replay them on the current build
``regressions``                regressions, new signatures and fixes along a package line
``bisect``                     the first failing build of a case, in O(log n) replays
``corpus export`` / ``import`` the readable corpus to and from the database
=============================  ==================================================================

Exit codes follow `service.cli.main` (2 bad input, 5 database) plus 8 (a build cannot be prepared)
and 9 (a replay contradicts the corpus with ``--check``, or a bisection's endpoints do not
bracket the failure).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from oracle.errors import AttnFuzzError
from service.cli.common import DbOption, console, db_url, exit_code, fail, log, migrate, out

EXIT_BUILD = 8
EXIT_MISMATCH = 9

PackageOption = Annotated[str, typer.Option("--package", help="The package line, e.g. flash-attn-4.")]
BuildsDirOption = Annotated[
    Optional[str],
    typer.Option(
        "--builds-dir",
        envvar="ATTNFUZZ_BUILDS_DIR",
        show_envvar=True,
        help="Where build environments live (default ~/.cache/attnfuzz/builds).",
    ),
]
BuildDirOption = Annotated[
    Optional[list[str]],
    typer.Option("--build-dir", help="A directory already holding one build (e.g. /tmp/fa4/4.0.0b11); repeatable."),
]
WheelhouseOption = Annotated[
    Optional[list[str]], typer.Option("--wheelhouse", help="A directory of wheels (offline); repeatable.")
]
RulesOption = Annotated[
    Optional[str], typer.Option("--rules", help="Extra-package rules (TOML; default fuzzer/builds/build_rules.toml).")
]
InstallerOption = Annotated[
    str,
    typer.Option(
        "--installer",
        help="auto (uv when available, else unpack), uv (uv pip install --offline --no-deps --target), "
        "unpack (unzip, as gpu_stage.py) or pip.",
    ),
]
AllowMissingOption = Annotated[
    bool,
    typer.Option(
        "--allow-missing",
        help="Prepare a build even when a Requires-Dist is in neither the shared stack nor the wheelhouse (the replay shows whether it runs).",
    ),
]
BackendOption = Annotated[
    Optional[list[str]],
    typer.Option("--backend", help="Backend name to replay, or module:attr of a plugin; repeatable (default: every backend the cases name)."),
]
DeviceOption = Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")]
IsolationOption = Annotated[
    str, typer.Option("--isolation", help="process (each backend in a child, crashes contained) or none.")
]
CaseTimeoutOption = Annotated[float, typer.Option("--case-timeout", help="Seconds per backend call.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


# ------------------------------------------------------------------------------------ plumbing
def _exit_code(exc: AttnFuzzError) -> int:
    from fuzzer.builds.bisect import BisectError
    from fuzzer.builds.envs import BuildError, BuildPrepareError
    from fuzzer.builds.replay import ReplayError

    if isinstance(exc, (BuildError, BisectError, ReplayError)):
        return 2
    if isinstance(exc, BuildPrepareError):
        return EXIT_BUILD
    return exit_code(exc)


def _fail(exc: AttnFuzzError) -> None:
    fail(exc, _exit_code(exc))


def _engine(db: str | None):
    """Migrate the database and return an Engine on it."""
    from service.db.engine import make_engine

    url = db_url(db)
    migrate(url)
    return make_engine(url)


def _check_package(engine, package: str | None, known_elsewhere: Sequence[str] = ()) -> None:
    """A ``--package`` filter that names no package line in the database (nor in
    ``known_elsewhere``, e.g. prepared environments) is an error listing the lines it has.

    Raises:
        FieldValidationError: unknown package line (exit 2).
    """
    from service.errors import FieldValidationError
    from service.builds.matrix import package_lines

    if not package:
        return
    names = sorted({name for name, _count in package_lines(engine)} | set(known_elsewhere))
    if package not in names:
        raise FieldValidationError("package", f"no package line {package!r} (known: {', '.join(names) or 'none yet'})")


def _rules(path: str | None):
    from fuzzer.builds.envs import load_rules

    return load_rules(path)


def _builds_dir(path: str | None) -> Path:
    from fuzzer.builds.envs import default_builds_dir

    return Path(path) if path else default_builds_dir()


def _backend_specs(backend: Sequence[str] | None, wanted: set[str]) -> tuple[list[tuple[str, str]], set[str] | None]:
    """``(name, spec)`` of every known backend the tasks may name, and the names to restrict the
    tasks to (None: no restriction)."""
    from fuzzer import registry

    names = [b for b in (backend or []) if ":" not in b]
    specs = [b for b in (backend or []) if ":" in b]
    found = registry.discover(specs)
    restrict = set(names) | {b.name for spec in specs for b in registry.load_spec(spec)} if backend else None
    pairs = [(name, spec) for name, (_b, spec) in sorted(found.items()) if name in wanted]
    return pairs, restrict


def _tasks(
    corpus: str | None, engine: Any, use_db: bool, backend: Sequence[str] | None
) -> tuple[list, list[tuple[str, str]]]:
    """The replay tasks (the corpus's, then every bucket's with ``use_db``; duplicates dropped),
    restricted to ``backend`` when given, and ``(name, spec)`` of every backend they may name."""
    from fuzzer.builds.corpus import load_corpus
    from fuzzer.builds.replay import tasks_from_corpus
    from service.builds.matrix import replay_tasks_from_buckets

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
    pairs, restrict = _backend_specs(backend, {t.backend for t in unique} | named)
    if restrict is not None:
        unique = [t for t in unique if t.backend in restrict]
    return unique, pairs


def _verdict_rows(outcome: Any) -> list[dict[str, Any]]:
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


def _print_verdicts(title: str, rows: list[dict[str, Any]]) -> None:
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


def _update_corpus(corpus: str, outcome: Any, record: Any) -> int:
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


# ------------------------------------------------------------------------------------ builds
def builds_fetch(
    requirements: Annotated[list[str], typer.Argument(help="Requirements, e.g. flash-attn-4==4.0.0b11.")],
    wheelhouse: Annotated[str, typer.Option("--wheelhouse", help="Where the wheels go.")],
    pip_arg: Annotated[
        Optional[list[str]], typer.Option("--pip-arg", help="Extra pip download argument (e.g. --platform=manylinux_2_28_x86_64); repeatable.")
    ] = None,
) -> None:
    """Download wheels (no dependencies, pre-releases allowed) where the package index is
    reachable; on an air-gapped GPU host, bring the wheelhouse instead."""
    from fuzzer.builds.envs import fetch_wheels

    try:
        fetch_wheels(requirements, wheelhouse, pip_arg or [])
    except AttnFuzzError as exc:
        _fail(exc)
    out.print(f"{len(requirements)} requirement(s) downloaded into {wheelhouse}")


def builds_prepare(
    package: PackageOption,
    wheelhouse: WheelhouseOption = None,
    version: Annotated[Optional[list[str]], typer.Option("--version", help="Only these versions; repeatable.")] = None,
    builds_dir: BuildsDirOption = None,
    build_dir: BuildDirOption = None,
    rules: RulesOption = None,
    installer: InstallerOption = "auto",
    force: Annotated[bool, typer.Option("--force", help="Prepare again even when up to date.")] = False,
    allow_missing: AllowMissingOption = False,
) -> None:
    """Prepare one environment per build of PACKAGE from the wheelhouse (every version there, or
    --version), each with the extra packages its Requires-Dist and the rules ask for; adopt
    --build-dir directories as they are. A build that cannot be prepared is reported and the
    others go on (exit 8 at the end)."""
    from fuzzer.builds.envs import (
        BuildPrepareError,
        adopt_build_dir,
        normalise_package,
        prepare_from_wheelhouse,
        wheelhouse_versions,
    )

    from service.errors import FieldValidationError

    failures = 0
    prepared = []
    try:
        if not wheelhouse and not build_dir:
            raise FieldValidationError("wheelhouse", "nothing to prepare: give --wheelhouse DIR and/or --build-dir DIR")
        name = normalise_package(package)
        rule_list = _rules(rules)
        root = _builds_dir(builds_dir)
        for directory in build_dir or []:
            try:
                prepared.append(
                    adopt_build_dir(
                        directory, name, root, wheelhouses=wheelhouse or [], rules=rule_list, installer=installer,
                        allow_missing=allow_missing,
                    )
                )
            except BuildPrepareError as exc:
                failures += 1
                log.error("cannot adopt %s: %s", directory, exc)
        versions = list(version or (wheelhouse_versions(wheelhouse, name) if wheelhouse else []))
        for v in versions:
            try:
                prepared.append(
                    prepare_from_wheelhouse(
                        name, v, wheelhouse or [], root, rules=rule_list, installer=installer, force=force,
                        allow_missing=allow_missing,
                    )
                )
            except BuildPrepareError as exc:
                failures += 1
                log.error("cannot prepare %s==%s: %s", name, v, exc)
    except AttnFuzzError as exc:
        _fail(exc)
    table = Table(title=f"{len(prepared)} build environment(s) of {package}")
    for column in ("version", "source", "paths", "extras", "unresolved"):
        table.add_column(column)
    for env in prepared:
        extras = ", ".join(f"{e.name}=={e.version}" for e in env.extras)
        table.add_row(env.version, env.source, "\n".join(map(str, env.paths)), extras, "\n".join(env.unresolved))
    out.print(table)
    if failures:
        raise typer.Exit(EXIT_BUILD)


def builds_list(
    package: Annotated[Optional[str], typer.Option("--package", help="Only this package line.")] = None,
    builds_dir: BuildsDirOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Prepared build environments, and the builds of each package line in the database (in line
    order: PEP 440 version, then first seen)."""
    from fuzzer.builds.envs import load_environments
    from service.builds.matrix import line_builds, package_lines

    try:
        envs = load_environments(_builds_dir(builds_dir), package)
        engine = _engine(db)
        try:
            if not envs:
                _check_package(engine, package)
            lines = [package] if package else [name for name, _count in package_lines(engine)]
            known = {line: line_builds(engine, line) for line in lines}
        finally:
            engine.dispose()
    except AttnFuzzError as exc:
        _fail(exc)
    if as_json:
        data = {
            "environments": [e.to_json() for e in envs],
            "lines": {
                line: [
                    {"build_id": b.build_id, "version": b.version, "device_name": b.device_name, "first_seen": b.first_seen.isoformat()}
                    for b in builds
                ]
                for line, builds in known.items()
            },
        }
        typer.echo(json.dumps(data))
        return
    table = Table(title="prepared build environments")
    for column in ("package", "version", "source", "paths", "extras"):
        table.add_column(column)
    for env in envs:
        table.add_row(env.package, env.version, env.source, "\n".join(map(str, env.paths)), ", ".join(f"{e.name}=={e.version}" for e in env.extras))
    out.print(table)
    for line, builds in known.items():
        table = Table(title=f"builds of {line} in the database")
        for column in ("build", "version", "device", "first seen"):
            table.add_column(column)
        for b in builds:
            table.add_row(str(b.build_id), b.version, f"{b.device_name} {b.compute_capability}".strip(), b.first_seen.isoformat(timespec="seconds"))
        out.print(table)


def builds_replay(
    package: PackageOption,
    builds_dir: BuildsDirOption = None,
    build_dir: BuildDirOption = None,
    wheelhouse: WheelhouseOption = None,
    version: Annotated[Optional[list[str]], typer.Option("--version", help="Only these versions; repeatable.")] = None,
    rules: RulesOption = None,
    installer: InstallerOption = "auto",
    allow_missing: AllowMissingOption = False,
    backend: BackendOption = None,
    corpus: Annotated[Optional[str], typer.Option("--corpus", help="Corpus directory ('' for none).")] = "corpus",
    db_cases: Annotated[bool, typer.Option("--db-cases/--no-db-cases", help="Also replay every bucket's case.")] = True,
    db: DbOption = None,
    device: DeviceOption = "auto",
    isolation: IsolationOption = "process",
    case_timeout: CaseTimeoutOption = 120.0,
    jobs: Annotated[int, typer.Option("--jobs", help="Builds replayed at once (one child process each).")] = 1,
    as_json: JsonOption = False,
) -> None:
    """Replay the corpus and every bucket's minimised case on each build of PACKAGE, each build
    in a child process whose PYTHONPATH puts the build first; store a result (or a skip) per case
    and backend, then list the line's regressions and fixes."""
    from fuzzer.builds.envs import BuildPrepareError, select_builds
    from fuzzer.builds.replay import replay_in_build
    from service.builds.matrix import find_regressions, record_replay

    if jobs < 1:
        from service.errors import FieldValidationError

        _fail(FieldValidationError("jobs", f"must be at least 1, got {jobs}"))
    summaries = []
    try:
        selection = select_builds(
            package,
            builds_dir=_builds_dir(builds_dir),
            build_dirs=build_dir or [],
            wheelhouses=wheelhouse or [],
            rules=_rules(rules),
            installer=installer,
            versions=version or [],
            allow_missing=allow_missing,
        )
        engine = _engine(db)
        try:
            tasks, pairs = _tasks(corpus, engine, db_cases, backend)
            if not tasks:
                console.print("[yellow]nothing to replay:[/] no corpus entry or bucket for the selected backends")
            environments = []
            for v in selection.versions:
                try:
                    environments.append((v, selection.environment(v)))
                except BuildPrepareError as exc:
                    log.warning("skipping %s==%s: %s", selection.package, v, exc)
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                futures = [
                    (v, pool.submit(replay_in_build, env, tasks, pairs, device=device, isolation=isolation, case_timeout_s=case_timeout))
                    for v, env in environments
                ]
                for v, future in futures:
                    outcome = future.result()
                    record = record_replay(engine, outcome, trigger="builds")
                    reported = outcome.packages.get(selection.package)
                    summaries.append(
                        {
                            "version": v,
                            "build_id": None if record.build is None else record.build.build_id,
                            "reported_version": reported,
                            "results": record.result_count,
                            "skips": record.skip_count,
                            "wall_s": round(outcome.wall_s, 2),
                            "error": outcome.error[-500:],
                            "verdicts": _verdict_rows(outcome),
                        }
                    )
            regressions = [r.to_json() for r in find_regressions(engine, selection.package)]
        finally:
            engine.dispose()
    except AttnFuzzError as exc:
        _fail(exc)
    if as_json:
        typer.echo(json.dumps({"package": selection.package, "builds": summaries, "transitions": regressions}, default=str))
        return
    table = Table(title=f"replays of {len(tasks)} task(s) on {len(summaries)} build(s) of {selection.package}")
    for column in ("version", "build", "results", "skips", "wall s", "note"):
        table.add_column(column)
    for s in summaries:
        note = s["error"][:120]
        if s["reported_version"] not in (None, s["version"]):
            note = f"child reported {selection.package}=={s['reported_version']}! " + note
        table.add_row(s["version"], str(s["build_id"]), str(s["results"]), str(s["skips"]), f"{s['wall_s']:.1f}", note)
    out.print(table)
    _print_transitions(selection.package, regressions)


# ------------------------------------------------------------------------------------ replay
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
    from service.builds.matrix import record_replay

    try:
        engine = _engine(db)
        try:
            tasks, pairs = _tasks(corpus, engine, db_cases, backend)
            outcome = replay_here(tasks, pairs, device=device, isolation=isolation, case_timeout_s=case_timeout)
            record = record_replay(engine, outcome, trigger="cli")
        finally:
            engine.dispose()
        written = _update_corpus(corpus, outcome, record) if update_corpus and corpus else 0
    except AttnFuzzError as exc:
        _fail(exc)
    rows = _verdict_rows(outcome)
    mismatches = [r for r in rows if r["matches"] is False]
    if as_json:
        build_id = None if record.build is None else record.build.build_id
        typer.echo(json.dumps({"build_id": build_id, "verdicts": rows, "corpus_files_updated": written}))
    else:
        _print_verdicts(f"replay of {len(rows)} task(s) on build {record.build.build_id if record.build else '?'}", rows)
        if update_corpus:
            out.print(f"{written} corpus file(s) updated")
    if check and mismatches:
        console.print(f"[bold red]{len(mismatches)} verdict(s) contradict the corpus[/]")
        raise typer.Exit(EXIT_MISMATCH)


# ------------------------------------------------------------------------------------ regressions
def _print_transitions(package: str, rows: list[dict[str, Any]]) -> None:
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
    from fuzzer.builds.regressions import FIX, TRANSITION_KINDS
    from service.builds.matrix import find_regressions

    kinds = TRANSITION_KINDS if fixes else tuple(k for k in TRANSITION_KINDS if k != FIX)
    try:
        engine = _engine(db)
        try:
            _check_package(engine, package)
            rows = [r.to_json() for r in find_regressions(engine, package, backend=backend, kinds=kinds)]
        finally:
            engine.dispose()
    except AttnFuzzError as exc:
        _fail(exc)
    if as_json:
        typer.echo(json.dumps(rows, default=str))
        return
    _print_transitions(package, rows)


# ------------------------------------------------------------------------------------ bisect
def _resolve_case(spec: str, engine: Any, backend: str | None, variant: str | None, signature: str | None):
    """``(case, backend, variant, signature, origin)`` for a corpus file, ``bucket:<id>`` or a
    stored case id."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from fuzzer.builds.corpus import CorpusEntry, CorpusError
    from oracle.config import AttentionCase
    from service.errors import FieldValidationError
    from service.db.models import Bucket, Case, Result

    path = Path(spec)
    if spec.endswith(".json") or path.is_file():
        try:
            entry = CorpusEntry.from_json(json.loads(path.read_text()), origin=str(path))
        except (OSError, json.JSONDecodeError) as exc:
            raise CorpusError(f"{spec}: not a readable corpus file: {exc}") from exc
        expected = entry.expected_signature if entry.expected_status == "fail" else None
        return entry.case, backend or entry.backend, variant or entry.variant, signature or expected, "corpus"
    with Session(engine) as session:
        if spec.startswith("bucket:"):
            try:
                bucket = session.get(Bucket, int(spec.split(":", 1)[1]))
            except ValueError as exc:
                raise FieldValidationError("case", f"{spec!r}: expected bucket:<id>") from exc
            if bucket is None:
                raise FieldValidationError("case", f"no bucket {spec!r}")
            config = session.scalar(select(Case.config).where(Case.id == (bucket.minimised_case_id or bucket.first_case_id)))
            return (
                AttentionCase.from_json(config),
                backend or bucket.backend,
                variant or bucket.variant,
                signature or bucket.signature,
                "minimised",
            )
        config = session.scalar(select(Case.config).where(Case.id == spec))
        if config is None:
            raise FieldValidationError("case", f"{spec!r} is neither a corpus file, bucket:<id>, nor a stored case id")
        if backend is None or variant is None:
            failing = session.execute(
                select(Result.backend, Result.variant)
                .where(Result.case_id == spec, Result.signature.is_not(None))
                .distinct()
            ).all()
            choices = [(b, v) for b, v in failing if (backend is None or b == backend) and (variant is None or v == variant)]
            if len(choices) != 1:
                listed = ", ".join(f"{b}/{v}" for b, v in choices) or "none failing"
                raise FieldValidationError("backend", f"give --backend and --variant for case {spec} (failing on: {listed})")
            backend, variant = choices[0]
        return AttentionCase.from_json(config), backend, variant, signature, "replay"


def bisect(
    case: Annotated[str, typer.Argument(help="A corpus file, bucket:<id>, or a stored case id.")],
    package: PackageOption,
    good: Annotated[str, typer.Option("--good", help="A version known to pass.")],
    bad: Annotated[str, typer.Option("--bad", help="A version known to fail.")],
    backend: Annotated[Optional[str], typer.Option("--backend", help="Backend (default: from the case's source).")] = None,
    variant: Annotated[Optional[str], typer.Option("--variant", help="Variant (default: from the case's source).")] = None,
    signature: Annotated[
        Optional[str], typer.Option("--signature", help="The failure that counts as bad (default: the bad build's).")
    ] = None,
    plugin: Annotated[
        Optional[list[str]], typer.Option("--plugin", help="module:attr of a plugin backend; repeatable.")
    ] = None,
    builds_dir: BuildsDirOption = None,
    build_dir: BuildDirOption = None,
    wheelhouse: WheelhouseOption = None,
    rules: RulesOption = None,
    installer: InstallerOption = "auto",
    allow_missing: AllowMissingOption = False,
    reuse: Annotated[
        bool,
        typer.Option(
            "--reuse/--no-reuse",
            help="Answer a step from a replay result already stored for that build on this platform (resume a cut-short bisection).",
        ),
    ] = True,
    db: DbOption = None,
    device: DeviceOption = "auto",
    isolation: IsolationOption = "none",
    case_timeout: CaseTimeoutOption = 600.0,
    as_json: JsonOption = False,
) -> None:
    """Find the first build of PACKAGE between --good and --bad on which CASE fails: a binary
    search, each step a replay in that build's environment (a child process); a build that
    cannot run the case is skipped like `git bisect skip`. Every step is stored as it happens."""
    from fuzzer import registry
    from fuzzer.builds.bisect import bisect_builds
    from fuzzer.builds.envs import BuildPrepareError, select_builds
    from fuzzer.builds.replay import ReplayTask, Verdict, replay_in_build
    from service.builds.matrix import finish_bisect, record_bisect_step, record_replay, recorded_verdict, start_bisect

    build_ids: dict[str, int | None] = {}
    reused: set[str] = set()
    try:
        selection = select_builds(
            package,
            builds_dir=_builds_dir(builds_dir),
            build_dirs=build_dir or [],
            wheelhouses=wheelhouse or [],
            rules=_rules(rules),
            installer=installer,
            allow_missing=allow_missing,
        )
        versions = selection.between(good, bad)
        engine = _engine(db)
        try:
            attention_case, backend, variant, signature, origin = _resolve_case(case, engine, backend, variant, signature)
            known = registry.discover(plugin or [])
            if backend not in known:
                from fuzzer.backends.base import BackendError

                raise BackendError(f"unknown backend {backend!r} (known: {', '.join(sorted(known))}; plugins: --plugin module:attr)")
            pairs = [(backend, known[backend][1])]
            task = ReplayTask(attention_case, backend, variant, f"bisect:{case}")
            run_id = start_bisect(
                engine,
                case=attention_case,
                backend=backend,
                variant=variant,
                package=selection.package,
                good_version=versions[0],
                bad_version=versions[-1],
                signature=signature,
                origin=origin,
            )

            platform = _platform(device, backend, known) if reuse else None

            def test(version: str) -> Verdict:
                if platform is not None:
                    recorded = recorded_verdict(engine, selection.package, version, task, platform)
                    if recorded is not None:
                        build_ids[version] = recorded.build_id
                        reused.add(version)
                        note = f"recorded result of build {recorded.build_id} reused, not replayed"
                        return Verdict(recorded.status, recorded.signature, note)
                try:
                    env = selection.environment(version)
                except BuildPrepareError as exc:
                    build_ids[version] = None
                    return Verdict("skip", None, f"cannot prepare the build: {exc}")
                outcome = replay_in_build(env, [task], pairs, device=device, isolation=isolation, case_timeout_s=case_timeout)
                record = record_replay(engine, outcome, trigger="bisect")
                build_ids[version] = None if record.build is None else record.build.build_id
                reported = outcome.packages.get(selection.package)
                if outcome.fingerprint is not None and reported != version:
                    return Verdict("skip", None, f"the child ran {selection.package}=={reported}, not {version}: check PYTHONPATH order")
                return outcome.verdict(task)

            def on_step(step) -> None:
                record_bisect_step(engine, run_id, step, build_ids.get(step.version))
                if not as_json:
                    console.print(f"step {step.number}: {selection.package}=={step.version}: [bold]{step.verdict}[/] ({step.why[:160]})")

            try:
                result = bisect_builds(versions, test, signature=signature, on_step=on_step)
            except BaseException as exc:
                finish_bisect(engine, run_id, None, build_ids, note=f"stopped: {type(exc).__name__}: {exc}"[:2000])
                raise
            finish_bisect(engine, run_id, result, build_ids)
        finally:
            engine.dispose()
    except AttnFuzzError as exc:
        _fail(exc)
    data = {
        "bisect_run_id": run_id,
        "case_id": attention_case.case_id,
        "backend": backend,
        "variant": variant,
        "package": selection.package,
        "status": result.status,
        "signature": result.signature,
        "last_good": result.last_good,
        "first_bad": result.first_bad,
        "candidates": list(result.candidates),
        "replays": result.replays,
        "reused": len(reused),
        "builds": len(versions),
        "steps": [
            {
                "number": s.number,
                "version": s.version,
                "verdict": s.verdict,
                "status": s.observed.status,
                "signature": s.observed.signature,
                "why": s.why,
                "build_id": build_ids.get(s.version),
                "reused": s.version in reused,
                "wall_s": round(s.wall_s, 3),
            }
            for s in result.steps
        ],
    }
    if as_json:
        typer.echo(json.dumps(data))
    else:
        table = Table(title=f"bisection {run_id}: {backend}/{variant} case {attention_case.case_id} along {selection.package}")
        for column in ("step", "version", "verdict", "observed", "why", "s"):
            table.add_column(column)
        for s in result.steps:
            observed = s.observed.status + (f" {s.observed.signature}" if s.observed.signature else "")
            table.add_row(str(s.number), s.version, s.verdict, observed, s.why[:100], f"{s.wall_s:.1f}")
        out.print(table)
        if result.status == "found":
            out.print(
                f"[bold]first bad: {selection.package}=={result.first_bad}[/] (last good {result.last_good}); "
                f"{result.replays} replays over {len(versions)} builds"
                + (f" ({len(reused)} answered from stored results)" if reused else "")
            )
        elif result.status == "ambiguous":
            out.print(
                f"[bold yellow]ambiguous:[/] the first bad build is one of {', '.join(result.candidates)} "
                f"(skipped builds in between); last good {result.last_good}; {result.replays} replays"
            )
        else:
            out.print(f"[bold red]{result.status}:[/] the endpoints do not bracket the failure; {result.replays} replays")
    if result.status not in ("found", "ambiguous"):
        raise typer.Exit(EXIT_MISMATCH)


def _platform(device: str, backend: str, known: dict) -> Any:
    """This host's fingerprint (device, compute capability, torch, CUDA) for reusing results."""
    from fuzzer.builds.environment import current_fingerprint
    from fuzzer.builds.replay import resolve_device

    return current_fingerprint(resolve_device(device, [known[backend][0]]))


# ------------------------------------------------------------------------------------ corpus
def corpus_export(
    root: Annotated[str, typer.Option("--root", help="Corpus directory to write.")] = "corpus",
    backend: Annotated[Optional[list[str]], typer.Option("--backend", help="Only these backends; repeatable.")] = None,
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print {root, files: [...]} as JSON.")] = False,
) -> None:
    """Write a corpus file per bucket: its minimised case, the last verdict per build, and as
    expected the newest verdict. Existing files keep their why/source and merge verdicts."""
    from fuzzer.builds.corpus import load_corpus, save_entry
    from service.builds.matrix import corpus_entries_from_db

    try:
        existing = {e.relative_path.as_posix(): e for e in load_corpus(root)} if Path(root).is_dir() else {}
        engine = _engine(db)
        try:
            entries = corpus_entries_from_db(engine, backends=backend, existing=existing)
        finally:
            engine.dispose()
        paths = [save_entry(root, entry) for entry in entries]
    except AttnFuzzError as exc:
        _fail(exc)
    if as_json:
        typer.echo(json.dumps({"root": str(root), "files": [str(p) for p in paths]}))
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
    from service.builds.matrix import import_corpus

    try:
        entries = load_corpus(root)
        engine = _engine(db)
        try:
            stored = import_corpus(engine, entries, with_verdicts=verdicts)
        finally:
            engine.dispose()
    except AttnFuzzError as exc:
        _fail(exc)
    out.print(
        f"{len(entries)} corpus entries ({len({e.case.case_id for e in entries})} cases, {stored} verdicts) stored in {db_url(db)}"
    )


# ------------------------------------------------------------------------------------ register
def register(app: typer.Typer) -> None:
    """Add ``builds``, ``replay``, ``regressions``, ``bisect``, ``corpus export`` and
    ``corpus import`` to ``app``."""
    builds = typer.Typer(help="Build environments: one per build of a package, replays across them.", no_args_is_help=True)
    app.add_typer(builds, name="builds")
    builds.command("fetch")(builds_fetch)
    builds.command("prepare")(builds_prepare)
    builds.command("list")(builds_list)
    builds.command("replay")(builds_replay)
    app.command("replay")(replay)
    app.command("regressions")(regressions)
    app.command("bisect")(bisect)
    corpus = typer.Typer(help="The readable JSON corpus (corpus/<backend>/<variant>-<case_id>.json).", no_args_is_help=True)
    app.add_typer(corpus, name="corpus")
    corpus.command("export")(corpus_export)
    corpus.command("import")(corpus_import)


__all__ = ["register"]
