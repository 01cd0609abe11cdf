"""What ``attnfuzz fuzz`` shows: the live progress display while it runs (`RichReporter`) and the
summary after it stops, as a table (`print_summary`) or as one JSON object (`summary_data`,
``--json``). Counts are of this run's evaluations (`COUNTS_NOTE`); times are in seconds.

Imports neither the worker nor torch: `fuzzer.worker.WorkerStats` is only a type here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fuzzer.text import masked_url
from service.cli.common import console, id_column, log, out, terminal_text, visible_text

if TYPE_CHECKING:
    from fuzzer.results import CaseResult
    from fuzzer.worker import Worker, WorkerStats


class RichReporter:
    """Live progress: a time/case bar, cases/s, per-backend counts and new buckets (implements
    `fuzzer.worker.Reporter`'s callbacks; not a subclass, so importing this module does not
    import the worker)."""

    def __init__(self, budget_s: float | None, max_cases: int | None, others: Callable[[], tuple[int, int, int]] | None = None):
        """Args:
            budget_s, max_cases: the run's bounds (the bar follows the time budget if given).
            others: with ``fuzz --workers N``, what the other worker processes did so far:
                ``(processes, cases, new buckets)`` (`service.cli.fuzz_workers.ExtraWorkers.progress`);
                the bar then counts every worker's cases and buckets, the tables stay this process's.
        """
        self.others = others
        self.progress = Progress(
            TextColumn("[bold]fuzzing"), BarColumn(), TextColumn("{task.description}"), TimeElapsedColumn()
        )
        total = budget_s if budget_s is not None else (max_cases or 1)
        self.by_time = budget_s is not None
        self.task = self.progress.add_task("", total=total)
        self.buckets: list[str] = []
        self.caption: str | None = None  # with other workers: what the table counts (on_case)
        self.live: Live | None = None
        self.started = time.monotonic()

    def _render(self, stats: WorkerStats | None) -> Group:
        table = Table(title=None, expand=False, caption=self.caption)
        id_column(table, "backend", [b for b, _ in (stats.per_backend if stats is not None else ())])
        for status in ("pass", "fail", "unsupported", "error", "crash", "timeout", "oom"):
            table.add_column(status, justify="right")
        # per backend: fuzz cases it ran (at least one variant), cases drawn for it (targeted
        # draws), and its most frequent unsupported reasons (fuzzer.coverage)
        table.add_column("cases run", justify="right")
        table.add_column("drawn for", justify="right")
        table.add_column("JIT s / kernels", justify="right")  # JIT backends: compile seconds, distinct kernel keys
        table.add_column("top unsupported reasons")
        if stats is not None:
            from fuzzer.coverage import format_reasons, top_reasons

            names = sorted({b for b, _ in stats.per_backend})
            for name in names:
                table.add_row(
                    terminal_text(name),
                    *[
                        str(stats.per_backend.get((name, s), 0))
                        for s in ("pass", "fail", "unsupported", "error", "crash", "timeout", "oom")
                    ],
                    str(stats.runnable.get(name, 0)),
                    str(stats.targeted.get(name, 0)),
                    _jit_cell(stats, name),
                    terminal_text(format_reasons(top_reasons(stats.unsupported, name, 2))),
                )
        lines = [self.progress, table]
        if self.buckets:
            bucket_table = Table("new buckets (backend / variant / signature)")
            for line in self.buckets[-8:]:
                bucket_table.add_row(line)
            lines.append(bucket_table)
        return Group(*lines)

    def on_start(self, worker: Worker) -> None:
        self.live = Live(self._render(None), console=console, refresh_per_second=4, transient=False)
        self.live.start()
        if worker.unavailable:
            for name, reason in worker.unavailable.items():
                log.warning("skipping %s: %s", name, reason)

    def on_case(self, case, results: list[CaseResult], stats: WorkerStats) -> None:
        elapsed = time.monotonic() - self.started
        processes, other_cases, other_buckets = self.others() if self.others is not None else (0, 0, 0)
        cases = stats.cases + other_cases
        rate = cases / elapsed if elapsed > 0 else 0.0
        workers = f" ({processes + 1} workers)" if processes else ""
        self.caption = (
            f"this table: this process's worker only; the cases and buckets above: all {processes + 1} workers"
            if processes else None
        )
        self.progress.update(
            self.task,
            completed=elapsed if self.by_time else cases,
            description=f"{cases} cases{workers}, {rate:.2f} cases/s, {len(self.buckets) + other_buckets} new bucket(s), "
            f"{_known_cell(stats)}, JIT {_share(stats.compile_s, getattr(stats, 'fuzz_s', 0.0))} of wall",
        )
        if self.live is not None:
            self.live.update(self._render(stats))

    def on_new_bucket(self, key, case) -> None:
        self.buckets.append(terminal_text(" / ".join(key) + f"  (case {case.case_id})"))

    def on_minimised(self, key, outcome) -> None:
        console.print(f"[cyan]shrunk[/] {escape(' / '.join(key))}: {outcome.status}: {escape(outcome.case.describe())}")

    def on_stop(self, stats: WorkerStats) -> None:
        if self.live is not None:
            self.live.update(self._render(stats))
            self.live.stop()
            console.line()  # the summary goes to stdout: do not glue it to the live display's last line


COUNTS_NOTE = (
    "These counts are of evaluations this run made: a replayed known bucket and a redone case count every "
    "time; a case Hypothesis draws again is answered from its first run where it can be (counted apart, "
    "not as a case; with lanes on a GPU it runs again and counts again), but counts in 'drawn for'. The "
    "database keeps each case once (by case_id) and one result per case, backend, variant and build, so "
    "its counts (attnfuzz report) can be lower."
)


def _known_cell(stats: WorkerStats) -> str:
    """``"known 4%"``: the share of this process's fuzz evaluations that failed in a bucket
    already known (`fuzzer.worker.WorkerStats.known_share`)."""
    evaluations = getattr(stats, "evaluations", 0)
    return f"known {_share(getattr(stats, 'known_hits', 0), evaluations)}"


def _known_data(stats: WorkerStats) -> dict:
    """The known-bucket figures of ``fuzz --json`` (`fuzzer.known`): evaluations, known hits and
    their share, the buckets past their hit budget, the targets' extra load and the input
    families drawn below their default share (their weights out of `fuzzer.known.FULL_WEIGHT`)."""
    return {
        "evaluations": getattr(stats, "evaluations", 0),
        "known_hits": getattr(stats, "known_hits", 0),
        "known_share": getattr(stats, "known_share", 0.0),
        "spent_buckets": [" / ".join(key) for key in getattr(stats, "spent", [])],
        "target_load": dict(sorted(getattr(stats, "known_load", {}).items())),
        "family_weights": dict(getattr(stats, "family_weights", {})),
    }


def _jit_cell(stats: WorkerStats, name: str) -> str:
    """``"12.5 s / 7"``: compile seconds and distinct kernel keys of JIT backend ``name``; ``"-"``
    for a backend that built none."""
    keys = getattr(stats, "kernel_keys", {}).get(name)
    if not keys:
        return "-"
    return f"{getattr(stats, 'compile_by_backend', {}).get(name, 0.0):.1f} s / {len(keys)}"


def _coverage_data(stats: WorkerStats, top: int = 3) -> dict:
    """Per backend: fuzz cases it ran (``cases_run``: at least one variant not unsupported), cases
    drawn for it (``drawn_for``, targeted draws), for JIT backends the distinct kernel keys run
    (``kernel_keys``, `fuzzer.backends.base.Backend.kernel_key`) and compile seconds
    (``compile_s``), and its ``top`` unsupported reasons with counts of results
    (`fuzzer.coverage.reason_keys`)."""
    from fuzzer.coverage import top_reasons

    names = sorted({b for b, _ in stats.per_backend} | set(stats.runnable) | set(stats.targeted))
    return {
        name: {
            "cases_run": stats.runnable.get(name, 0),
            "drawn_for": stats.targeted.get(name, 0),
            **(
                {"kernel_keys": len(stats.kernel_keys[name]), "compile_s": stats.compile_by_backend.get(name, 0.0)}
                if name in getattr(stats, "kernel_keys", {})
                else {}
            ),
            "top_unsupported": [{"reason": r, "results": n} for r, n in top_reasons(stats.unsupported, name, top)],
        }
        for name in names
    }


def _children_data(stats: WorkerStats) -> dict:
    """Per backend, where its fuzz tasks' time went (seconds, `fuzzer.executor.TASK_TIMING_PARTS`
    plus ``run``/``compile``; ``tasks`` a count) and how often its environment was the case's
    slowest (``slowest_cases``, ``slowest_s``: the wall seconds of those). Backends that share a
    child process (one environment, e.g. the two CPU SDPA backends) carry the parts of a whole
    message (``send``, ``deliver``, ``unpack``, ``env_wall``) and the slowest counts on the
    environment's first backend only."""
    names = sorted(set(stats.task_timing_s) | set(stats.slowest_cases))
    return {
        name: {
            **{
                part: int(v) if part == "tasks" else round(v, 4)
                for part, v in sorted(stats.task_timing_s.get(name, {}).items())
            },
            "slowest_cases": stats.slowest_cases.get(name, 0),
            "slowest_s": round(stats.slowest_s.get(name, 0.0), 4),
        }
        for name in names
    }


OWN_PART_LABELS = {
    "drawing": "drawing cases (Hypothesis)",
    "running": "sending to and receiving from the backends",
    "storing": "storing results",
    "between_chunks": "between chunks (background results, shrink claims)",
    "start": "before the first case",
    "other": "other",
}
"""How the summary names each part of `own_parts_data` (``fuzz --json`` keeps the keys)."""


def own_parts_data(stats: WorkerStats) -> dict[str, float]:
    """`WorkerStats.own_split`: the measured parts of attnfuzz's own work besides inputs and
    comparison, and ``other``; wall seconds ({} for figures without it)."""
    split = getattr(stats, "own_split", None)
    return dict(split) if split is not None else {}


def summary_data(stats: WorkerStats, url: str, *, interrupted: bool = False, spool: dict | None = None) -> dict:
    """The fuzz summary as JSON-ready data (``attnfuzz fuzz --json``); times in seconds."""
    shrunk = dict(stats.minimised)
    buckets = []
    for key in stats.new_buckets:
        outcome = shrunk.get(key)
        attached_to = stats.attached_to.get(key)
        buckets.append(
            {
                "backend": key[0],
                "variant": key[1],
                "signature": key[2],
                "first_case_id": stats.first_cases.get(key),
                "minimised": None
                if outcome is None
                else {"status": outcome.status, "case_id": outcome.case.case_id, "case": outcome.case.describe()},
                # the bucket whose minimised case this one fails on too (one root cause, not shrunk on its own)
                "attached_to": None if attached_to is None else " / ".join(attached_to),
            }
        )
    return {
        "database": masked_url(url),
        "interrupted": interrupted,
        "cases": stats.cases,
        "wall_s": stats.wall_s,
        "cases_per_s": stats.cases_per_s,
        "workers": getattr(stats, "workers", 1),  # worker processes side by side (fuzz --workers)
        "worker_s": stats.split_wall_s,  # their wall seconds summed: the base of time_s's wall-clock split
        "evaluations_by_status": dict(sorted(stats.results.items())),
        "evaluations_by_backend": {
            name: {status: n for (b, status), n in sorted(stats.per_backend.items()) if b == name}
            for name in sorted({b for b, _ in stats.per_backend})
        },
        "counts_note": COUNTS_NOTE,
        "coverage": _coverage_data(stats),
        "time_s": {
            "oracle": stats.oracle_s,
            "kernels": stats.kernel_s,
            "jit": stats.compile_s,
            "shrinking": stats.shrink_s,
            # wall-clock split (kernels and jit above are summed over children running side by side)
            "wait_for_children": stats.wait_s,
            "inputs": stats.inputs_s,
            "comparison": stats.judge_s,
            "own_work": stats.own_s,
            # the own work's parts on the worker's thread besides inputs and comparison (fuzzer.worker.OWN_PARTS)
            "own_parts": own_parts_data(stats),
            # not in the split: comparison on the judge thread, beside the worker's (background judging)
            "comparison_background": getattr(stats, "judge_background_s", 0.0),
        },
        "jit_share": stats.compile_share,  # measured: compile time / fuzzing wall time (the compile budget's measure)
        "compile_share": stats.compile_share,  # the same figure under a name that is not the option's
        "budget_chunks": dict(sorted(stats.template_chunks.items())),  # chunks over / under / without the budget
        "untargeted_busy_chunks": dict(sorted(stats.untargeted_busy.items())),  # chunks drawn for others: it was busy
        # JIT tasks left out while over the budget (a new kernel to build), by backend
        "compile_gated": dict(sorted(stats.compile_gated.items())),
        # JIT tasks run all the same while over the budget: the first kernel of their mask class, by backend
        "compile_novel": dict(sorted(stats.compile_novel.items())),
        # variants not run because they send no distinct call for the case (no result), by backend
        "not_applicable": dict(sorted(stats.not_applicable.items())),
        # fuzz tasks not run: their backend crashed or timed out at that kernel key before / on this case
        "crash_quarantined": dict(sorted(stats.crash_quarantined.items())),
        # backends dropped mid-run: a method of theirs hung in the worker's process (fuzzer.guard), with why
        "backends_quarantined": dict(sorted(getattr(stats, "backends_quarantined", {}).items())),
        "skipped_after_crash": dict(sorted(stats.skipped_after_crash.items())),
        # lanes: fuzz tasks not run because their environment was busy with an earlier case; tasks
        # that finished in the background (stored later); background tasks stopped at the end
        "busy": dict(sorted(getattr(stats, "busy", {}).items())),
        "late": dict(sorted(getattr(stats, "late", {}).items())),
        "late_dropped": dict(sorted(getattr(stats, "late_dropped", {}).items())),
        "repeated_cases": getattr(stats, "repeated", 0),  # drawn again, answered from their first run: not in "cases"
        "all_busy_cases": getattr(stats, "all_busy", 0),  # drawn, but every backend that runs them was busy: not in "cases"
        # backend children started again after a crash, a timeout or a lost pipe; of them, taken from a spare started ahead
        "child_restarts": getattr(stats, "child_restarts", 0),
        "spare_children_used": getattr(stats, "spares_used", 0),
        "children": _children_data(stats),
        "new_buckets": buckets,
        # fuzz evaluations (results that ran) and those that failed in a bucket known before them
        "evaluations": getattr(stats, "evaluations", 0),
        "known_hits": getattr(stats, "known_hits", 0),
        "known_share": getattr(stats, "known_share", 0.0),
        "known_buckets": _known_data(stats),
        "spool": spool or {},
    }


def print_summary(
    stats: WorkerStats,
    url: str,
    *,
    interrupted: bool = False,
    stored: dict | None = None,
    specs: dict[str, str] | None = None,
    server: bool = False,
) -> None:
    """Print the fuzz summary (tables, the time split, new buckets, hints).

    Args:
        stats: the run's figures (several workers' merged, `fuzzer.worker.merge_stats`).
        url: the database URL (named in the hints, its password masked: `fuzzer.text.masked_url`),
            or with ``server`` the service's ``http(s)://host:port`` (``fuzz --server``).
        interrupted: the run stopped on Ctrl-C.
        stored: with several workers, `service.db.repository.bucket_states` of the new buckets: what
            the database says of a bucket another worker shrunk or attached after this one found it.
        specs: the ``module:attr`` of each plugin backend given so (``fuzz --backend localk:LocalBackend``),
            by backend name: the hints name a plugin's backend by its spec, so they run as printed
            (by name, ``export`` and ``fuzz`` know only the built-in and entry-point backends).
        server: the run stored through the service at ``url``: the hints name what works with
            it (its dashboard pages, its repro downloads, ``fuzz --server``), never ``--db URL``
            (``report``, ``serve`` and ``export`` take a database URL, not the service's).
    """
    shown = masked_url(url)  # the hints show user:***@: type the password where the run had it
    specs = specs or {}
    target = f"--server {shown}" if server else f"--db {shown}"  # where a later fuzz run stores
    if interrupted:
        out.print("[bold yellow]interrupted (Ctrl-C):[/] what this run stored before it stopped:")
    table = Table(title="evaluations this run, by status")
    table.add_column("status", no_wrap=True)
    table.add_column("count", justify="right")
    for status, count in sorted(stats.results.items()):
        table.add_row(status, str(count))
    out.print(table)
    coverage = Table(
        title="per backend: cases run, cases drawn for it, JIT compile s / kernel keys, top unsupported reasons (results)"
    )
    numeric = ("cases run", "drawn for", "JIT s / kernels")
    for column in ("backend", *numeric, "top unsupported reasons"):
        coverage.add_column(column, justify="right" if column in numeric else "left")
    for name, row in _coverage_data(stats).items():
        reasons = "; ".join(f"{r['reason']} ({r['results']})" for r in row["top_unsupported"])
        coverage.add_row(terminal_text(name), str(row["cases_run"]), str(row["drawn_for"]), _jit_cell(stats, name),
                         terminal_text(reasons))
    out.print(coverage)
    out.print(COUNTS_NOTE, style="dim")
    from fuzzer.environment import jit_cache_description

    wall = stats.split_wall_s
    workers = getattr(stats, "workers", 1)
    side_by_side = (
        f" with {workers} worker processes side by side (--workers); their time together {wall:.1f} s, split"
        if workers > 1 else ". Wall"
    )
    out.print(
        f"{stats.cases} cases in {stats.wall_s:.1f} s ({stats.cases_per_s:.2f} cases/s){side_by_side}: "
        f"oracle {stats.oracle_s:.1f} s ({_share(stats.oracle_s, wall)}), waiting for the backends "
        f"{stats.wait_s:.1f} s ({_share(stats.wait_s, wall)}), shrinking {stats.shrink_s:.1f} s "
        f"({_share(stats.shrink_s, wall)}), attnfuzz's own work (inputs, comparison and the parts below) "
        f"{stats.own_s:.1f} s ({_share(stats.own_s, wall)}). In the backends' children "
        f"(summed over the children, which may run side by side): kernels {stats.kernel_s:.1f} s, JIT {stats.compile_s:.1f} s "
        f"({_share(stats.compile_s, wall)} of wall, {_share(stats.compile_s, stats.fuzz_s)} of fuzzing; "
        f"{sum(len(k) for k in stats.kernel_keys.values())} kernel keys"
        + (f"; FA4 compile cache: {jit_cache_description()})" if stats.kernel_keys or stats.compile_s else ")")
    )
    if stats.own_s > 0:
        parts = ", ".join(
            f"{OWN_PART_LABELS.get(name, name)} {seconds:.1f} s" for name, seconds in own_parts_data(stats).items()
        )
        out.print(f"Own work besides inputs ({stats.inputs_s:.1f} s) and comparison ({stats.judge_s:.1f} s): {parts}.")
    if getattr(stats, "judged_background", 0):
        out.print(
            f"Judged on the judge thread, beside the worker's (--judge background): {stats.judged_background} results, "
            f"{stats.judge_background_s:.1f} s of comparison not in the split above."
        )
    if getattr(stats, "evaluations", 0):
        known = _known_data(stats)
        line = (
            f"Spent on known buckets: {known['known_hits']} of {known['evaluations']} fuzz evaluations "
            f"({_share(known['known_hits'], known['evaluations'])}) failed in a bucket already known"
        )
        if known["spent_buckets"]:
            line += f"; past their hit budget, drawn away from: {', '.join(known['spent_buckets'])}"
        if known["family_weights"]:
            from fuzzer.known import FULL_WEIGHT

            weights = ", ".join(f"{name} {w}/{FULL_WEIGHT}" for name, w in known["family_weights"].items())
            line += f" (input families drawn less: {weights} of their share)"
        out.print(escape(line), soft_wrap=True)
    if getattr(stats, "repeated", 0):
        out.print(
            f"Drawn again by Hypothesis and answered from their first run in this run (not run, not counted as cases): "
            f"{stats.repeated}"
        )
    if stats.slowest_cases:
        slowest = ", ".join(
            f"{name} {n} ({stats.slowest_s[name]:.1f} s)" for name, n in stats.slowest_cases.most_common(4)
        )
        out.print(f"Slowest backend of a case (the case waits for it), cases (its seconds on them): {slowest}")
    skipped = {
        "variants with no distinct call for the case": stats.not_applicable,
        "tasks at a kernel key that crashed or timed out before": stats.crash_quarantined,
        "tasks after another variant crashed on the case": stats.skipped_after_crash,
        "lanes: tasks whose backend was busy with an earlier case": getattr(stats, "busy", {}),
        "lanes: background tasks still running at the end": getattr(stats, "late_dropped", {}),
    }
    for what, counts in skipped.items():
        if counts:
            out.print(f"Not run, no result ({what}): " + ", ".join(f"{n} {c}" for n, c in sorted(counts.items())))
    for name, reason in sorted(getattr(stats, "backends_quarantined", {}).items()):
        out.print(f"Quarantined (not run after this, its method hung in the worker's process): {name}: {reason}")
    if getattr(stats, "child_restarts", 0):
        out.print(
            f"Backend children started again (after a crash, a timeout or a lost pipe): {stats.child_restarts}, "
            f"{stats.spares_used} of them by taking a spare child started ahead"
        )
    if getattr(stats, "all_busy", 0):
        out.print(
            f"Lanes: {stats.all_busy} drawn case(s) ran nowhere (every backend that runs them was busy with an "
            "earlier case); not counted as cases"
        )
    if getattr(stats, "late", None):
        out.print("Lanes: tasks finished in the background after their case (stored): " + ", ".join(f"{n} {c}" for n, c in sorted(stats.late.items())))
    if stats.compile_gated:
        gated = ", ".join(f"{name} {n}" for name, n in sorted(stats.compile_gated.items()))
        out.print(f"JIT tasks not run because they needed a new kernel while compilation was over its budget (--jit-share): {gated}")
    if stats.compile_novel:
        novel = ", ".join(f"{name} {n}" for name, n in sorted(stats.compile_novel.items()))
        out.print(f"JIT tasks run over the compile budget as the first kernel of their mask class (causal, windows, softcap, backward): {novel}")
    if stats.new_buckets:
        out.print(f"[bold red]{len(stats.new_buckets)} new bucket(s):[/]")
        shrunk = dict(stats.minimised)
        first_cases, attached_to = stats.first_cases, stats.attached_to
        for key in stats.new_buckets:
            outcome = shrunk.get(key)
            stored_case, stored_note = (stored or {}).get(key, (None, ""))  # what another worker did with it
            line = f"  {visible_text(' / '.join(key))}"
            if key in first_cases:
                line += f"  [first seen on case {first_cases[key]}]"
            if outcome is not None:
                line += f"\n      {outcome.status}: {outcome.case.describe()}  [case {outcome.case.case_id}]"
            elif key in attached_to:
                line += f"\n      fails on the minimised case of {' / '.join(attached_to[key])} too: one root cause, not shrunk on its own"
            elif stored_note.startswith("attached"):
                line += f"\n      {stored_note} (by another worker)"
            elif stored_case:
                line += f"\n      minimised by another worker: case {stored_case}"
            elif stats.minimised or stats.shrink_s:
                line += (
                    f"\n      not minimised in this run: a later fuzz run shrinks it (only shrinking: "
                    f"{command_name()} fuzz --max-cases 0 {target} --backend {specs.get(key[0], key[0])}, with this run's --device"
                    + (" and writer token)" if server else ")")
                )
            out.print(escape(line), soft_wrap=True)  # plain text: rich would take "[case ...]" for markup and drop it
    elif stats.results.get("fail", 0) or stats.results.get("error", 0):
        failing = stats.results.get("fail", 0) + stats.results.get("error", 0)
        listed = f"the service's {shown}/buckets" if server else f"{command_name()} buckets list --db {shown}"
        out.print(
            f"no new bucket: {failing} failing result(s), all in buckets already known "
            f"(replayed or drawn again; see {listed})", soft_wrap=True,
        )
    else:
        out.print("[green]no failures found[/]")
    earlier = [(key, outcome) for key, outcome in stats.minimised if key not in set(stats.new_buckets)]
    if earlier:  # a shrink-only run (--max-cases 0), or buckets queued by earlier runs or other workers
        out.print(f"{len(earlier)} bucket(s) found earlier, shrunk in this run:")
        for key, outcome in earlier:
            out.print(escape(f"  {visible_text(' / '.join(key))}\n      {outcome.status}: {outcome.case.describe()}  [case {outcome.case.case_id}]"), soft_wrap=True)
    prog = command_name()
    if server:
        _print_service_hints(stats, shown, specs, prog)
        return
    out.print(f"stored in {shown}; see them with: {prog} report --db {shown}  (dashboard: {prog} serve --db {shown})", soft_wrap=True)
    if stats.new_buckets:
        chosen = _repro_case(stats)
        if chosen is not None:
            key, case_id, what = chosen
            out.print(escape(f"a standalone pytest repro of {what}: {prog} export {case_id}{_plugin(specs, key)} --db {shown}"),
                      soft_wrap=True)
        else:
            out.print(f"a standalone pytest repro of a case: {prog} export CASE_ID --db {shown}", soft_wrap=True)


def _repro_case(stats: WorkerStats) -> tuple[tuple[str, str, str], str, str] | None:
    """The case the summary names for a repro: ``(bucket key, case id, words for it)`` of the
    minimised case of the first new bucket that has one (the smaller case), else of the first
    case of the first new bucket that has one; None when no new bucket has either. (A new-user
    trial did not know which of a bucket's two case ids to export.)"""
    shrunk = dict(stats.minimised)
    minimised = next((key for key in stats.new_buckets if key in shrunk), None)
    if minimised is not None:
        return (minimised, shrunk[minimised].case.case_id,
                "a bucket's minimised case (the [case ...] on its second line), the first one's")
    first = next((key for key in stats.new_buckets if key in stats.first_cases), None)
    if first is not None:
        return first, stats.first_cases[first], "the first bucket's case"
    return None


def _print_service_hints(stats: WorkerStats, base: str, specs: dict[str, str], prog: str) -> None:
    """The summary's last lines after ``fuzz --server``: where the results are (the service's
    dashboard at ``base``: its bucket list, a bucket's page, a case's page) and a repro of the
    first new bucket as the service's download (``GET /api/cases/{case_id}/repro.py`` with the
    bucket's backend and variant, `service.api.routes.cases.get_repro`). A plugin given as
    ``module:attr`` is one the service cannot import (it knows the built-in and entry-point
    backends only): its repro is ``attnfuzz export`` with the spec, on the service's database."""
    from urllib.parse import urlencode

    chosen = _repro_case(stats)
    case_page = f"{base}/cases/{chosen[1]}" if chosen is not None else f"{base}/cases/<case id>"
    out.print(
        f"stored through the service at {base}; see them on its dashboard: {base}/buckets (a bucket's page has "
        f"its repro download and issue report; a case's page: {case_page})", soft_wrap=True,
    )
    if chosen is None:
        return
    key, case_id, what = chosen
    spec = specs.get(key[0])
    if spec is not None:
        out.print(escape(
            f"a standalone pytest repro of {what}: {key[0]} is a plugin ({spec}) the service cannot import, so it "
            f"has no download there; export it where the plugin imports and the service's database is reachable: "
            f"{prog} export {case_id}{_plugin(specs, key)} --db DATABASE_URL (the database the service at {base} serves)"
        ), soft_wrap=True)
        return
    query = urlencode({"backend": key[0], "variant": key[1]})
    out.print(escape(
        f"a standalone pytest repro of {what}: {base}/api/cases/{case_id}/repro.py?{query} (the case's page: "
        f"{base}/cases/{case_id})"
    ), soft_wrap=True)


def _plugin(specs: dict[str, str], key: tuple[str, str, str]) -> str:
    """`` --backend module:attr --variant V`` for the bucket ``key`` of a plugin backend (its spec in
    ``specs``), else ``""``: ``export`` finds a plugin only by its spec."""
    spec = specs.get(key[0])
    return f" --backend {spec} --variant {key[1]}" if spec else ""


def command_name() -> str:
    """How this process was started, to repeat in a hint: ``sys.argv[0]`` when it is a path to the
    ``attnfuzz`` script (``.venv/bin/attnfuzz``: a user who ran it so has no ``attnfuzz`` on
    ``PATH``), else ``attnfuzz``."""
    import os
    import shlex
    import sys

    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "attnfuzz" and os.sep in argv0:
        return shlex.quote(argv0)
    return "attnfuzz"


def _share(part_s: float, wall_s: float) -> str:
    """``part_s`` as a percentage of ``wall_s`` (``"12%"``; ``"-"`` for an empty run)."""
    return f"{100.0 * part_s / wall_s:.0f}%" if wall_s > 0 else "-"

