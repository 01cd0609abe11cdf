"""``attnfuzz builds fetch`` / ``prepare`` / ``list`` / ``replay``: build environments, one per
build of a package line, and replays across them (each build in its own child process). Exit 8
(`EXIT_BUILD`) when a build cannot be prepared.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Optional

import typer
from rich.table import Table

from oracle.errors import AttnFuzzError
from service.cli.matrix.options import (
    AllowMissingOption,
    BackendOption,
    BuildDirOption,
    BuildsDirOption,
    CaseTimeoutOption,
    DeviceOption,
    InstallerOption,
    IsolationOption,
    PackageOption,
    RulesOption,
    WheelhouseOption,
    builds_dir_path,
    check_package,
    load_rules,
    open_engine,
)
from service.cli.matrix.replay_command import print_transitions, replay_tasks, verdict_rows
from service.cli.common import EXIT_BUILD, DbOption, JsonOption, console, fail, log, out, print_json


def builds_fetch(
    requirements: Annotated[list[str], typer.Argument(help="Requirements, e.g. flash-attn-4==4.0.0b11.")],
    wheelhouse: Annotated[str, typer.Option("--wheelhouse", help="Where the wheels go.")],
    pip_arg: Annotated[
        Optional[list[str]], typer.Option("--pip-arg", help="Extra pip download argument (e.g. --platform=manylinux_2_28_x86_64); repeatable.")
    ] = None,
) -> None:
    """Download wheels (no dependencies, pre-releases allowed) where the package index is
    reachable; on an air-gapped GPU host, bring the wheelhouse instead."""
    from fuzzer.builds.wheels import fetch_wheels

    try:
        fetch_wheels(requirements, wheelhouse, pip_arg or [])
    except AttnFuzzError as exc:
        fail(exc)
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
    from fuzzer.builds.envs import adopt_build_dir, prepare_from_wheelhouse
    from fuzzer.builds.versions import BuildPrepareError, normalise_package
    from fuzzer.builds.wheels import wheelhouse_versions

    from service.errors import FieldValidationError

    failures = 0
    prepared = []
    try:
        if not wheelhouse and not build_dir:
            raise FieldValidationError("wheelhouse", "nothing to prepare: give --wheelhouse DIR and/or --build-dir DIR")
        name = normalise_package(package)
        rule_list = load_rules(rules)
        root = builds_dir_path(builds_dir)
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
        fail(exc)
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
    from service.matrix.lines import line_builds, package_lines

    try:
        envs = load_environments(builds_dir_path(builds_dir), package)
        engine = open_engine(db)
        try:
            if not envs:
                check_package(engine, package)
            lines = [package] if package else [name for name, _count in package_lines(engine)]
            known = {line: line_builds(engine, line) for line in lines}
        finally:
            engine.dispose()
    except AttnFuzzError as exc:
        fail(exc)
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
        print_json(data)
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
    from fuzzer.builds.selection import select_builds
    from fuzzer.builds.versions import BuildPrepareError
    from fuzzer.builds.replay import replay_in_build
    from service.matrix.grid import find_regressions
    from service.matrix.replay_rows import record_replay

    if jobs < 1:
        from service.errors import FieldValidationError

        fail(FieldValidationError("jobs", f"must be at least 1, got {jobs}"))
    summaries = []
    try:
        selection = select_builds(
            package,
            builds_dir=builds_dir_path(builds_dir),
            build_dirs=build_dir or [],
            wheelhouses=wheelhouse or [],
            rules=load_rules(rules),
            installer=installer,
            versions=version or [],
            allow_missing=allow_missing,
        )
        engine = open_engine(db)
        try:
            tasks, pairs = replay_tasks(corpus, engine, db_cases, backend)
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
                            "verdicts": verdict_rows(outcome),
                        }
                    )
            regressions = [r.to_json() for r in find_regressions(engine, selection.package)]
        finally:
            engine.dispose()
    except AttnFuzzError as exc:
        fail(exc)
    if as_json:
        print_json({"package": selection.package, "builds": summaries, "transitions": regressions})
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
    print_transitions(selection.package, regressions)
