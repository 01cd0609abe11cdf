"""``attnfuzz bisect``: the first build of a package line on which a case fails, by binary search
over the prepared builds, each step a replay in that build's environment (a child process); a
build that cannot run the case is skipped like ``git bisect skip``, and every step is stored as it
happens (`service.matrix.bisection_rows.record_bisect_step`). Exit 9 (`EXIT_MISMATCH`) when the endpoints
do not bracket the failure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from oracle.errors import AttnFuzzError
from service.cli.matrix.options import (
    AllowMissingOption,
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
    load_rules,
    open_engine,
)
from service.cli.common import EXIT_MISMATCH, DbOption, JsonOption, console, fail, out, print_json


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
    from fuzzer.builds.selection import select_builds

    try:
        selection = select_builds(
            package,
            builds_dir=builds_dir_path(builds_dir),
            build_dirs=build_dir or [],
            wheelhouses=wheelhouse or [],
            rules=load_rules(rules),
            installer=installer,
            allow_missing=allow_missing,
        )
        versions = selection.between(good, bad)
        engine = open_engine(db)
        try:
            run = _Bisection(engine, selection, versions)
            run.start(case, backend, variant, signature, plugin or [])
            run.search(reuse=reuse, device=device, isolation=isolation, case_timeout_s=case_timeout, quiet=as_json)
        finally:
            engine.dispose()
    except AttnFuzzError as exc:
        fail(exc)
    data = run.to_json()
    if as_json:
        print_json(data)
    else:
        _print_bisection(data, run.result, selection.package)
    if run.result.status not in ("found", "ambiguous"):
        raise typer.Exit(EXIT_MISMATCH)


class _Bisection:
    """One ``attnfuzz bisect`` run: the case and backend variant it bisects (`start`), the binary
    search with every step stored (`search`), and what it found (`to_json`)."""

    def __init__(self, engine: Any, selection: Any, versions: list[str]):
        self.engine, self.selection, self.versions = engine, selection, versions
        self.build_ids: dict[str, int | None] = {}  # version -> the build its step ran on (None: not prepared)
        self.reused: set[str] = set()  # versions answered from a stored result
        self.result: Any = None

    def start(self, case: str, backend: str | None, variant: str | None, signature: str | None, plugins: list[str]) -> None:
        """Resolve CASE (`_resolve_case`) and its backend, and store the ``bisect_runs`` row.

        Raises:
            BackendError: the backend is not known (``--plugin module:attr`` for a plugin).
            FieldValidationError, CorpusError: CASE names nothing usable.
        """
        from fuzzer import registry
        from fuzzer.results import ReplayTask
        from service.matrix.bisection_rows import start_bisect

        self.case, self.backend, self.variant, self.signature, origin = _resolve_case(
            case, self.engine, backend, variant, signature
        )
        self.known = registry.discover(plugins)
        if self.backend not in self.known:
            from fuzzer.backends.base import BackendError

            raise BackendError(f"unknown backend {self.backend!r} (known: {', '.join(sorted(self.known))}; plugins: --plugin module:attr)")
        self.pairs = [(self.backend, self.known[self.backend][1])]
        self.task = ReplayTask(self.case, self.backend, self.variant, f"bisect:{case}")
        self.run_id = start_bisect(
            self.engine,
            case=self.case,
            backend=self.backend,
            variant=self.variant,
            package=self.selection.package,
            good_version=self.versions[0],
            bad_version=self.versions[-1],
            signature=self.signature,
            origin=origin,
        )

    def search(self, *, reuse: bool, device: str, isolation: str, case_timeout_s: float, quiet: bool) -> None:
        """Bisect `versions`, storing every step; a stopped search is finished with a note."""
        from fuzzer.builds.bisect import bisect_builds
        from service.matrix.bisection_rows import finish_bisect, record_bisect_step

        platform = _platform(device, self.backend, self.known) if reuse else None

        def test(version: str):
            return self._verdict(version, platform, device=device, isolation=isolation, case_timeout_s=case_timeout_s)

        def on_step(step) -> None:
            record_bisect_step(self.engine, self.run_id, step, self.build_ids.get(step.version))
            if not quiet:
                console.print(f"step {step.number}: {self.selection.package}=={step.version}: [bold]{step.verdict}[/] ({step.why[:160]})")

        try:
            self.result = bisect_builds(self.versions, test, signature=self.signature, on_step=on_step)
        except BaseException as exc:
            finish_bisect(self.engine, self.run_id, None, self.build_ids, note=f"stopped: {type(exc).__name__}: {exc}"[:2000])
            raise
        finish_bisect(self.engine, self.run_id, self.result, self.build_ids)

    def _verdict(self, version: str, platform: Any, *, device: str, isolation: str, case_timeout_s: float):
        """The case's `fuzzer.results.Verdict` on ``version``: a result already stored for
        that build on this ``platform`` (None: always replay), else a replay in the build's
        environment, stored; ``skip`` when the build cannot be prepared or the child ran another
        version."""
        from fuzzer.builds.versions import BuildPrepareError
        from fuzzer.builds.replay import replay_in_build
        from fuzzer.results import Verdict
        from service.matrix.replay_rows import record_replay
        from service.matrix.bisection_rows import recorded_verdict

        package = self.selection.package
        if platform is not None:
            recorded = recorded_verdict(self.engine, package, version, self.task, platform)
            if recorded is not None:
                self.build_ids[version] = recorded.build_id
                self.reused.add(version)
                note = f"recorded result of build {recorded.build_id} reused, not replayed"
                return Verdict(recorded.status, recorded.signature, note)
        try:
            env = self.selection.environment(version)
        except BuildPrepareError as exc:
            self.build_ids[version] = None
            return Verdict("skip", None, f"cannot prepare the build: {exc}")
        outcome = replay_in_build(env, [self.task], self.pairs, device=device, isolation=isolation, case_timeout_s=case_timeout_s)
        record = record_replay(self.engine, outcome, trigger="bisect")
        self.build_ids[version] = None if record.build is None else record.build.build_id
        reported = outcome.packages.get(package)
        if outcome.fingerprint is not None and reported != version:
            return Verdict("skip", None, f"the child ran {package}=={reported}, not {version}: check PYTHONPATH order")
        return outcome.verdict(self.task)

    def to_json(self) -> dict[str, Any]:
        """The ``bisect --json`` object: the run, what it found and every step (times in s)."""
        result = self.result
        return {
            "bisect_run_id": self.run_id,
            "case_id": self.case.case_id,
            "backend": self.backend,
            "variant": self.variant,
            "package": self.selection.package,
            "status": result.status,
            "signature": result.signature,
            "last_good": result.last_good,
            "first_bad": result.first_bad,
            "candidates": list(result.candidates),
            "replays": result.replays,
            "reused": len(self.reused),
            "builds": len(self.versions),
            "steps": [
                {
                    "number": s.number,
                    "version": s.version,
                    "verdict": s.verdict,
                    "status": s.observed.status,
                    "signature": s.observed.signature,
                    "why": s.why,
                    "build_id": self.build_ids.get(s.version),
                    "reused": s.version in self.reused,
                    "wall_s": round(s.wall_s, 3),
                }
                for s in result.steps
            ],
        }


def _print_bisection(data: dict[str, Any], result: Any, package: str) -> None:
    """The steps as a table and the finding in one line (``attnfuzz bisect`` without ``--json``)."""
    table = Table(title=f"bisection {data['bisect_run_id']}: {data['backend']}/{data['variant']} case {data['case_id']} along {package}")
    for column in ("step", "version", "verdict", "observed", "why", "s"):
        table.add_column(column)
    for s in result.steps:
        observed = s.observed.status + (f" {s.observed.signature}" if s.observed.signature else "")
        table.add_row(str(s.number), s.version, s.verdict, observed, s.why[:100], f"{s.wall_s:.1f}")
    out.print(table)
    if result.status == "found":
        out.print(
            f"[bold]first bad: {package}=={result.first_bad}[/] (last good {result.last_good}); "
            f"{result.replays} replays over {data['builds']} builds"
            + (f" ({data['reused']} answered from stored results)" if data["reused"] else "")
        )
    elif result.status == "ambiguous":
        out.print(
            f"[bold yellow]ambiguous:[/] the first bad build is one of {', '.join(result.candidates)} "
            f"(skipped builds in between); last good {result.last_good}; {result.replays} replays"
        )
    else:
        out.print(f"[bold red]{result.status}:[/] the endpoints do not bracket the failure; {result.replays} replays")


def _platform(device: str, backend: str, known: dict) -> Any:
    """This host's fingerprint (device, compute capability, torch, CUDA) for reusing results."""
    from fuzzer.environment import current_fingerprint
    from fuzzer.builds.replay import resolve_device

    return current_fingerprint(resolve_device(device, [known[backend][0]]))
