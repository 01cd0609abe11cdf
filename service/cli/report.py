"""``attnfuzz report``: summarise a database (results per backend and status, times, coverage,
every bucket with its minimised case, root-cause groups), as text or JSON; with ``--bucket ID
--format markdown`` one bucket as an issue (`print_issue_report`). Reads only:
never migrates. Exit 2 for bad options or an unknown bucket, 5 for the database."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from fuzzer.severity import WRONG_RATIO
from fuzzer.text import masked_url
from oracle.errors import AttnFuzzError
from service.cli.common import DbOption, fail, id_column, open_database, out, print_json, terminal_text, visible_text


def report(
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    bucket: Annotated[
        Optional[int],
        typer.Option("--bucket", min=1, help="Report one bucket (attnfuzz buckets list; with --format markdown: as an issue)."),
    ] = None,
    format_: Annotated[str, typer.Option("--format", help="text or markdown (markdown needs --bucket).")] = "text",
) -> None:
    """Summarise a database: results per backend and status, times, and every bucket with its minimised case.

    With --bucket ID --format markdown: that bucket as an issue for the library's tracker, from
    stored data only."""
    from service.errors import FieldValidationError

    if format_ not in ("text", "markdown"):
        fail(FieldValidationError("format", f"{format_!r}; allowed: text, markdown"))
    if format_ == "markdown" or bucket is not None:
        if bucket is None:
            fail(FieldValidationError("bucket", "--format markdown reports one bucket: give --bucket ID"))
        print_issue_report(db, bucket)
        return
    from sqlalchemy.orm import Session

    try:
        url, engine = open_database(db)
    except AttnFuzzError as exc:
        fail(exc)
    try:
        with Session(engine) as session:
            data = report_data(session, url)
    finally:
        engine.dispose()
    if as_json:
        print_json(data)
        return
    print_report(data)


def report_data(session, url: str) -> dict:
    """The ``report --json`` object of the database ``url`` (open in ``session``): counts per
    status and backend, times in seconds, coverage per backend, buckets (most severe first, each
    with its minimised or first case) and root-cause groups (`_defects`)."""
    from oracle.config import AttentionCase
    from service.db import findings
    from service.db.stats import backend_coverage, campaign_report, known_hits

    rep = campaign_report(session)
    known = known_hits(session)
    defects = [b for b in rep.buckets if b.severity != "limit"]
    evidence = findings.bucket_evidence(session, defects)
    buckets = []
    for b in defects:
        case = b.minimised_case or b.first_case
        seen = evidence[b.id]
        buckets.append(
            {
                "id": b.id,
                "backend": b.backend,
                "variant": b.variant,
                "signature": b.signature,
                "hit_count": b.hit_count,
                "severity": b.severity,
                "max_error_ratio": b.max_error_ratio,
                "max_error_ratio_text": findings.ratio_text(b.max_error_ratio),
                "defect_id": b.defect_id,
                "triage_state": b.triage_state.value,
                "minimise_note": b.minimise_note,
                "case_id": case.id,
                "case": AttentionCase.from_json(case.config).describe(),
                "case_json": case.config,
                "verdict": findings.verdict_words(b.signature, seen.result, case.config),
                "second_opinion": seen.second_opinion.to_json() if seen.second_opinion is not None else None,
                "consensus": seen.consensus.to_json(),
            }
        )
    groups = findings.limit_groups(session, [b for b in rep.buckets if b.severity == "limit"])
    return {
        "database": masked_url(url),
        "cases": rep.overview.case_count,
        "results": rep.overview.result_count,
        "results_by_status": rep.overview.results_by_status,
        "results_by_backend": rep.overview.results_by_backend,
        "oracle_s": rep.oracle_ms / 1000.0,
        "timings": [
            {"backend": t.backend, "results": t.results, "run_s": t.run_ms / 1000.0, "compile_s": t.compile_ms / 1000.0}
            for t in rep.timings
        ],
        # per backend: distinct cases seen and run (>= 1 variant not unsupported), top
        # unsupported reasons counted per result (fuzzer.coverage.reason_keys)
        "coverage": [
            {
                "backend": c.backend,
                "cases": c.cases,
                "cases_run": c.cases_run,
                "top_unsupported": [{"reason": r, "results": n} for r, n in c.top_unsupported],
            }
            for c in backend_coverage(session)
        ],
        # the workers' fuzz evaluations and those that failed in a bucket already known (fuzzer.known)
        "known_buckets": {"evaluations": known.evaluations, "known_hits": known.known_hits, "known_share": known.known_share},
        "buckets": buckets,  # most severe first (fuzzer.severity); design limits apart, in limit_groups
        "defects": _defects(buckets),
        "by_class": {
            "severity": rep.overview.buckets_by_severity,
            "wrong": rep.overview.wrong_by_class,
            "limit_buckets": sum(len(g.buckets) for g in groups),
            "limit_groups": len(groups),
        },
        # design-limit buckets by (design, mechanism): one regime failing every backend of a design, once
        "limit_groups": [g.to_json() for g in groups],
    }


def print_report(data: dict) -> None:
    """Print `report_data`'s object as tables and lines (``attnfuzz report``)."""
    table = Table(
        title=f"results per backend and status ({data['cases']} cases, {data['results']} results)",
        caption="run s: seconds in the backend's calls; JIT s: its compile seconds",
    )
    id_column(table, "backend", [visible_text(b) for b in data["results_by_backend"]])  # names never cut
    for column in (*sorted(data["results_by_status"]), "run s", "JIT s"):
        table.add_column(column, justify="right")
    timing = {t["backend"]: t for t in data["timings"]}
    for backend, counts in data["results_by_backend"].items():
        t = timing.get(backend, {"run_s": 0.0, "compile_s": 0.0})
        table.add_row(
            terminal_text(backend),
            *[str(counts.get(s, 0)) for s in sorted(data["results_by_status"])],
            f"{t['run_s']:.1f}",
            f"{t['compile_s']:.1f}",
        )
    out.print(table)
    coverage = Table(
        title="coverage per backend",
        caption="cases: cases with a result of the backend; cases run: those it ran in at least one variant (not unsupported)",
    )
    for column in ("backend", "cases", "cases run", "top unsupported reasons (results)"):
        coverage.add_column(column, justify="right" if column.startswith("cases") else "left")
    for c in data["coverage"]:
        reasons = "; ".join(f"{r['reason']} ({r['results']})" for r in c["top_unsupported"])
        coverage.add_row(terminal_text(c["backend"]), str(c["cases"]), str(c["cases_run"]), terminal_text(reasons))
    out.print(coverage)
    out.print(f"oracle (the float64 reference) time in all: {data['oracle_s']:.1f} s")
    known = data["known_buckets"]
    if known["evaluations"]:
        out.print(
            f"spent on known buckets: {known['known_hits']} of the workers' {known['evaluations']} fuzz evaluations "
            f"({100.0 * known['known_share']:.1f}%) failed in a bucket already known"
        )
    limits = data["limit_groups"]
    if not data["buckets"] and not limits:
        out.print("no buckets: no failing result is stored")
    elif data["buckets"]:
        out.print(escape(f"{len(data['buckets'])} bucket(s), most severe first: {SEVERITY_LEGEND}"))  # "[bucket ID]" is no markup
        by = data["by_class"]
        counts = ", ".join(f"{name} {n}" for name, n in by["severity"].items() if name != "limit")
        wrong = ", ".join(f"{sig} {n}" for sig, n in by["wrong"].items())
        out.print(terminal_text(f"defects by class: {counts}" + (f" (wrong: {wrong})" if wrong else "")
                                + f"; design limits apart: {by['limit_buckets']} in {by['limit_groups']} group(s)"))
    for b in data["buckets"]:
        group = f"  defect {b['defect_id']}" if b["defect_id"] is not None else ""
        ratio = f" ratio {b['max_error_ratio_text']}" if b["max_error_ratio"] is not None else ""
        out.print(
            f"[bold]{b['severity']:<9}[/] [bold]{terminal_text(b['backend'])} / {terminal_text(b['variant'])} / "
            f"{terminal_text(b['signature'])}[/] x{b['hit_count']}{ratio}{group}  {terminal_text(b['minimise_note'] or '')}"
        )
        out.print(escape(f"    {b['case']}  [case {b['case_id']}] [bucket {b['id']}]"))  # rich took "[case ...]" for markup and dropped it
        if b["severity"] == "wrong":
            out.print(terminal_text(f"    verdict: {b['verdict']}"), soft_wrap=True)
            opinion = b["second_opinion"]
            out.print(terminal_text(f"    second opinion: {opinion['text'] if opinion else 'none stored'}"), soft_wrap=True)
            out.print(terminal_text(f"    other backends: {b['consensus']['text']}"), soft_wrap=True)
    for d in data["defects"]:
        if len(d["symptoms"]) > 1:
            symptoms = ", ".join(f"{v} / {sig}" for v, sig in d["symptoms"])
            out.print(f"defect {d['id']} ({d['severity']}, {terminal_text(d['backend'])}, case {d['case_id']}): "
                      f"{terminal_text(symptoms)}")
    if limits:
        out.print(escape(
            f"design limits, apart: {data['by_class']['limit_buckets']} bucket(s) in {len(limits)} group(s) by design and "
            "mechanism; a correct kernel of the design fails these cases the same way (no claim against the kernels; "
            "report --bucket ID for one):"
        ), soft_wrap=True)
        for g in limits:
            ids = ", ".join(str(i) for i in g["bucket_ids"])
            out.print(f"  {terminal_text(g['text'])} " + escape(f"[buckets {ids}]"), soft_wrap=True)


SEVERITY_LEGEND = (
    f"wrong (all-zero, non-finite, wrong shape or an error ratio of {WRONG_RATIO:g} or more), crash (died, hung or out "
    f"of memory), imprecise (error ratio 1 to {WRONG_RATIO:g}), error (raised on a case it declared supported); the error ratio is the "
    "error over the error the dtype allows (above 1 fails; inf: non-finite); xN: N failing results; defect N: buckets "
    "that fail on the same minimised case, one root cause; [bucket ID]: for report --bucket ID and buckets show ID; "
    "second opinion: the case through a correct float32 emulation of the backend's design; other backends: what they "
    "did on the same case; limit (a correct kernel of the design fails the same way) is listed apart, after the defects"
)
"""The severities' meaning (`fuzzer.severity`, its bound ``WRONG_RATIO``), printed above the buckets (a
new-user trial found them unexplained)."""


def _defects(buckets: list[dict]) -> list[dict]:
    """Root-cause groups of ``report``'s buckets (already most severe first): per defect its
    backend, minimised case, severity (its most severe bucket's) and symptoms ``(variant,
    signature)``, the most severe defect first."""
    groups: dict[int, dict] = {}
    for b in buckets:
        if b["defect_id"] is None:
            continue
        group = groups.setdefault(
            b["defect_id"],
            {"id": b["defect_id"], "backend": b["backend"], "case_id": b["case_id"], "severity": b["severity"],
             "bucket_ids": [], "symptoms": []},
        )
        group["bucket_ids"].append(b["id"])
        group["symptoms"].append((b["variant"], b["signature"]))
    return list(groups.values())


def print_issue_report(db: str | None, bucket_id: int) -> None:
    """``attnfuzz report --bucket ID --format markdown``: print the bucket's issue report
    (`service.export.issue_report.bucket_issue`) to stdout; allowances an older attnfuzz did not store are
    computed with the CPU oracle for the repro. Exit 2 for an unknown bucket, 5 when the database
    cannot be opened."""
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.orm import Session

    from service.errors import NotFoundError, ServiceError
    from service.export.issue_report import bucket_issue

    try:
        url, engine = open_database(db)  # a reading command: never migrates
    except AttnFuzzError as exc:
        fail(exc)
    try:
        with Session(engine) as session:
            issue = bucket_issue(session, bucket_id, compute_missing=True)
    except NotFoundError as exc:  # where to look, as `cases show` says for a case
        fail(NotFoundError(exc.kind, exc.key, hint=f"`attnfuzz buckets list --db {masked_url(url)}` shows the stored buckets"))
    except AttnFuzzError as exc:
        fail(exc)
    except SQLAlchemyError as exc:
        fail(ServiceError(f"database {masked_url(url)!r}: {type(exc).__name__}: {exc}"))
    finally:
        engine.dispose()
    typer.echo(issue.markdown, nl=False)


def register(app: typer.Typer) -> None:
    """Add ``report`` to ``app`` (the ``attnfuzz`` typer application)."""
    app.command()(report)
