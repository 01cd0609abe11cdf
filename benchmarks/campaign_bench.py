"""Campaign benchmark: what a fuzz campaign yields per hour, this tree against another commit, side by side.

Usage::

    python benchmarks/campaign_bench.py [--time-budget 30] [--repeats 2] [--compare 992da02]
                                        [--device cpu|cuda] [--backend NAME ...] [--seed N]
                                        [--shrink] [--this REV] [--json OUT] [-- EXTRA FUZZ ARGS]

Each run is the README's main job, ``attnfuzz fuzz --time-budget T --corpus ''`` (plus the
``--backend``/``--device``/``--seed`` given, ``--no-shrink`` unless ``--shrink``), started as a fresh
process on an empty SQLite database, with its own spool directory and no corpus, from one working
directory shared by the invocation's runs (as a user runs the job from one project directory;
Hypothesis caches the constants it reads from source files there). Each tree first gets one
unreported ``--warmup`` run (default 5 s), so both start with the same warm caches. With ``--compare REV`` the same job also runs from ``git archive REV`` unpacked in a
temporary directory (``PYTHONPATH`` pointing at it, same virtual environment, so the same torch and
libraries), interleaved with this tree's runs (``--this REV`` runs a commit instead of the working
tree) (ABBA order over ``--repeats`` rounds, so a load
change on the machine hits both alike), and the ratio of the mean cases/s is printed.

Per run it reports, from the job's own summary line (``N cases in W s``, ``oracle``, ``kernels``,
``JIT``, ``shrinking``, ``attnfuzz's own work``, each read on its own) and from the database it
wrote:

* cases/s and cases/hour;
* the time split: oracle, kernels, JIT, shrinking, and attnfuzz's own work (the rest of the wall
  time: inputs, comparison, storage, processes) with its share of the wall time;
* per backend: results of the ``fuzz`` phase and the runnable share (not ``unsupported``);
* each bucket ``backend / variant / signature`` with its time to first hit (the bucket's
  ``first_seen`` minus the worker's ``started_at``, seconds).

Timings are only compared with each other inside one invocation (ratios side by side), never with
fixed numbers. ``--device cuda`` runs the same on a GPU host.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# each figure of the job's summary line, found on its own (the line's wording around them varies
# between versions)
FIGURES = {
    "cases": re.compile(r"(\d+) cases in [\d.]+ s"),
    "wall": re.compile(r"\d+ cases in ([\d.]+) s"),
    "oracle": re.compile(r"oracle ([\d.]+) s"),
    "kernels": re.compile(r"kernels ([\d.]+) s"),
    "jit": re.compile(r"JIT ([\d.]+) s"),
    "shrink": re.compile(r"shrinking ([\d.]+) s"),
    "own": re.compile(r"own work \([^)]*\) ([\d.]+) s"),
}
# With several worker processes (``fuzz --workers``, this tree's CPU default) the split above is of
# their wall times added up, printed as "their time together X s"; one worker prints none (its wall).
WORKER_TIME = re.compile(r"their time together ([\d.]+) s")
WORKERS = re.compile(r"with (\d+) worker processes")
# The console entry point of the tree on PYTHONPATH: attnfuzz.cli.main, which every tree since issue 18
# has (whatever module holds the typer app behind it); before it, the typer app service.cli:app
# (992da02). Chosen by what the tree holds: an older tree on PYTHONPATH would otherwise import this
# tree's attnfuzz package through the editable install and fail on its own service package.
RUNNER = "import sys; from attnfuzz.cli import main; sys.argv[0] = 'attnfuzz'; main()"
LEGACY_RUNNER = "import sys; from service.cli import app; sys.argv[0] = 'attnfuzz'; app()"


def runner_for(path: Path) -> str:
    """The ``python -c`` program that runs the CLI of the tree at ``path``."""
    return RUNNER if (path / "attnfuzz" / "cli.py").exists() else LEGACY_RUNNER


class BenchError(RuntimeError):
    """A run did not produce what the benchmark reads (its output is in the message)."""


@dataclass
class RunResult:
    """One campaign run. Times in seconds."""

    tree: str
    repeat: int
    cases: int
    wall_s: float
    oracle_s: float
    kernel_s: float
    jit_s: float
    shrink_s: float
    own_s: float
    process_s: float  # wall time of the whole process, start-up included
    worker_s: float = 0.0  # the workers' walls added up (the split's base), 0: one worker (wall_s)
    workers: int = 1
    backends: dict[str, dict[str, float]] = field(default_factory=dict)
    buckets: list[dict[str, object]] = field(default_factory=list)

    @property
    def cases_per_s(self) -> float:
        return self.cases / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def split_s(self) -> float:
        """The seconds the time split adds up to: the workers' walls together, or the one wall."""
        return self.worker_s if self.worker_s > 0 else self.wall_s

    @property
    def own_share(self) -> float:
        return self.own_s / self.split_s if self.split_s > 0 else 0.0


def export_tree(rev: str, dest: Path) -> Path:
    """``git archive rev`` of this repository unpacked under ``dest``; the directory.

    Raises:
        BenchError: ``rev`` is not a commit of this repository.
    """
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True)
    if archive.returncode != 0:
        raise BenchError(f"--compare: git archive {rev!r} failed: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def _parse_time(value: object) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(float(value), tz=timezone.utc)
    text = str(value).replace("Z", "+00:00")
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def read_database(path: Path) -> tuple[dict[str, dict[str, float]], list[dict[str, object]]]:
    """Per-backend fuzz-phase counts and the buckets with their time to first hit, from a run's
    SQLite file (the tables every attnfuzz version has: results, buckets, workers)."""
    db = sqlite3.connect(path)
    try:
        backends: dict[str, dict[str, float]] = {}
        rows = db.execute(
            "SELECT backend, SUM(status != 'unsupported'), COUNT(*) FROM results WHERE phase = 'fuzz' GROUP BY backend"
        ).fetchall()
        for backend, runnable, total in rows:
            backends[backend] = {"results": total, "runnable": runnable, "runnable_share": runnable / total if total else 0.0}
        started = [_parse_time(r[0]) for r in db.execute("SELECT started_at FROM workers").fetchall()]
        start = min((s for s in started if s is not None), default=None)
        buckets = []
        for backend, variant, signature, first_seen, hits in db.execute(
            "SELECT backend, variant, signature, first_seen, hit_count FROM buckets ORDER BY first_seen"
        ).fetchall():
            seen = _parse_time(first_seen)
            buckets.append(
                {
                    "bucket": f"{backend} / {variant} / {signature}",
                    "first_hit_s": None if seen is None or start is None else (seen - start).total_seconds(),
                    "hits": hits,
                }
            )
    finally:
        db.close()
    return backends, buckets


def run_once(
    tree: str, path: Path, args: argparse.Namespace, repeat: int, extra: list[str], cwd: Path, budget: float | None = None
) -> RunResult:
    """One ``attnfuzz fuzz`` run of the tree at ``path`` on a fresh database, started in ``cwd``
    (shared by every run of one invocation, like a user's project directory: Hypothesis keeps its
    per-source-file constants cache there, ``.hypothesis/constants``).

    Raises:
        BenchError: the run failed or printed no summary line.
    """
    budget = args.time_budget if budget is None else budget
    work = Path(tempfile.mkdtemp(prefix=f"attnfuzz-bench-{tree}-", dir=cwd))
    try:
        db = work / "bench.db"
        command = [sys.executable, "-c", runner_for(Path(path)), "fuzz", "--time-budget", str(budget), "--db",
                   f"sqlite:///{db}", "--corpus", "", "--quiet", "--device", args.device]
        command += [] if args.shrink else ["--no-shrink"]
        for name in args.backend or []:
            command += ["--backend", name]
        if args.seed is not None:
            command += ["--seed", str(args.seed)]
        command += extra
        env = dict(os.environ)
        env["PYTHONPATH"] = str(path) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["ATTNFUZZ_SPOOL_DIR"] = str(work / "spool")
        env["COLUMNS"] = "400"  # one summary line, not wrapped by rich
        env.pop("ATTNFUZZ_DATABASE_URL", None)
        started = time.monotonic()
        proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=budget * 3 + 300)
        process_s = time.monotonic() - started
        text = re.sub(r"\s+", " ", proc.stdout + "\n" + proc.stderr)
        found = {name: pattern.search(text) for name, pattern in FIGURES.items()}
        if proc.returncode != 0 or not all(found.values()):
            missing = [name for name, m in found.items() if m is None]
            raise BenchError(
                f"{tree}: run failed (exit {proc.returncode}; figures not found: {missing}):\n"
                f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        backends, buckets = read_database(db)
        g = {name: float(m.group(1)) for name, m in found.items()}
        worker_time, workers = WORKER_TIME.search(text), WORKERS.search(text)
        return RunResult(
            worker_s=float(worker_time.group(1)) if worker_time else 0.0, workers=int(workers.group(1)) if workers else 1,
            tree=tree, repeat=repeat, cases=int(g["cases"]), wall_s=g["wall"], oracle_s=g["oracle"],
            kernel_s=g["kernels"], jit_s=g["jit"], shrink_s=g["shrink"], own_s=g["own"], process_s=process_s,
            backends=backends, buckets=buckets,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def report(runs: list[RunResult], trees: list[str]) -> str:
    """The text report: one block per tree (means over its runs), then the ratio."""
    lines = []
    for tree in trees:
        mine = [r for r in runs if r.tree == tree]
        if not mine:
            continue
        wall = _mean([r.split_s for r in mine])
        rate = _mean([r.cases_per_s for r in mine])
        workers = sorted({r.workers for r in mine})
        lines.append(f"== {tree}: {len(mine)} run(s), {'/'.join(map(str, workers))} worker process(es)")
        lines.append(
            f"  cases/s {rate:.2f} (runs: {', '.join(f'{r.cases_per_s:.2f}' for r in mine)}), cases/hour {rate * 3600:.0f}"
        )
        parts = [("oracle", "oracle_s"), ("kernels", "kernel_s"), ("JIT", "jit_s"), ("shrinking", "shrink_s"),
                 ("attnfuzz's own work", "own_s")]
        split = ", ".join(
            f"{label} {_mean([getattr(r, attr) for r in mine]):.1f} s "
            f"({_mean([getattr(r, attr) for r in mine]) / wall * 100 if wall else 0:.0f}%)"
            for label, attr in parts
        )
        lines.append(f"  {'worker time' if any(r.worker_s for r in mine) else 'wall'} {wall:.1f} s: {split}")
        names = sorted({b for r in mine for b in r.backends})
        for name in names:
            total = sum(r.backends.get(name, {}).get("results", 0) for r in mine)
            runnable = sum(r.backends.get(name, {}).get("runnable", 0) for r in mine)
            share = runnable / total * 100 if total else 0.0
            lines.append(f"  {name:28} {int(runnable):6} runnable of {int(total):6} results ({share:.0f}%)")
        first: dict[str, float | None] = {}
        for r in mine:
            for b in r.buckets:
                t = b["first_hit_s"]
                key = str(b["bucket"])
                if key not in first or (t is not None and (first[key] is None or t < first[key])):
                    first[key] = t  # type: ignore[assignment]
        if first:
            lines.append(f"  buckets ({len(first)}), earliest first hit over the runs:")
            for key, t in sorted(first.items(), key=lambda kv: (kv[1] is None, kv[1] or 0.0)):
                lines.append(f"    {'?' if t is None else f'{t:7.1f} s'}  {key}")
        else:
            lines.append("  no buckets")
    if len(trees) == 2 and all(any(r.tree == t for r in runs) for t in trees):
        a = _mean([r.cases_per_s for r in runs if r.tree == trees[0]])
        b = _mean([r.cases_per_s for r in runs if r.tree == trees[1]])
        own = _mean([r.own_share for r in runs if r.tree == trees[0]])
        own_b = _mean([r.own_share for r in runs if r.tree == trees[1]])
        ratio = a / b if b > 0 else float("inf")
        lines.append(
            f"== ratio cases/s {trees[0]} / {trees[1]}: {ratio:.2f}x; attnfuzz's own share {own * 100:.0f}% "
            f"({trees[1]}: {own_b * 100:.0f}%)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring). Exit 0, or 2 when a run failed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[: argv.index("--")]
    parser = argparse.ArgumentParser(prog="python benchmarks/campaign_bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-budget", type=float, default=30.0, help="seconds per run (default 30)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per tree (default 2)")
    parser.add_argument("--compare", metavar="REV", help="also run this commit, interleaved (e.g. 992da02)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    parser.add_argument("--backend", action="append", help="repeatable; default: what the job selects")
    parser.add_argument("--seed", type=int, help="--seed of every run")
    parser.add_argument("--shrink", action="store_true", help="shrink new buckets (default --no-shrink)")
    parser.add_argument("--warmup", type=float, default=5.0,
                        help="seconds of one unreported run per tree first (caches warm for both alike); 0: none")
    parser.add_argument("--this", metavar="REV", help="run this commit instead of the working tree")
    parser.add_argument("--json", metavar="OUT", help="write every run's figures to this JSON file")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats: must be at least 1, got {args.repeats}")
    if not args.time_budget > 0:
        parser.error(f"--time-budget: must be positive, got {args.time_budget}")
    trees = [("this", ROOT)]
    scratch = Path(tempfile.mkdtemp(prefix="attnfuzz-bench-trees-"))
    try:
        if args.this:
            trees = [(args.this, export_tree(args.this, scratch / "this"))]
        if args.compare:
            trees.append((args.compare, export_tree(args.compare, scratch / "base")))
        runs: list[RunResult] = []
        if args.warmup > 0:
            for name, path in trees:
                run_once(name, path, args, -1, extra, scratch, budget=args.warmup)
        for repeat in range(args.repeats):
            order = trees if repeat % 2 == 0 else list(reversed(trees))
            for name, path in order:
                result = run_once(name, path, args, repeat, extra, scratch)
                print(f"run {repeat} {name}: {result.cases} cases in {result.wall_s:.1f} s ({result.cases_per_s:.2f}/s), "
                      f"own work {result.own_share * 100:.0f}%", flush=True)
                runs.append(result)
    except BenchError as exc:
        print(exc, file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(report(runs, [name for name, _ in trees]))
    if args.json:
        payload = [asdict(r) | {"cases_per_s": r.cases_per_s, "own_share": r.own_share} for r in runs]
        Path(args.json).write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
