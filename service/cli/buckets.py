"""``attnfuzz buckets``: list, filter, show and triage the failure buckets of a database.

=============================  ==================================================================
``buckets list``               buckets matching the filters (backend, variant, signature
                               substring, triage state), sorted, one page
``buckets show BUCKET_ID``     one bucket: key, counts, builds, triage, its first and minimised
                               cases and latest results
``buckets triage BUCKET_ID``   change triage state, notes, upstream URL, duplicate target
=============================  ==================================================================

Every command takes ``--json``. ``list`` and ``show`` only read (a read-only database works;
an old schema is an error naming ``attnfuzz db upgrade``); ``triage`` writes through
`service.db.repository.update_triage`, the same rules as ``PATCH /api/buckets/{id}``. Severity and
root-cause group (``defect_id``) are shown when the schema has them. Exit codes follow
`service.cli.common.EXIT_CODES` (2 bad input or unknown bucket, 5 database).
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from fuzzer.text import masked_url
from oracle.errors import AttnFuzzError
from service.cli.common import (
    DbOption,
    JsonOption,
    check_stored_name,
    describe_stored_case,
    fail,
    id_column,
    open_database,
    out,
    print_json,
    print_table,
    terminal_text,
    visible_text,
)

buckets_app = typer.Typer(help="Failure buckets: list, filter, show, triage.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add ``buckets`` to the main CLI."""
    app.add_typer(buckets_app, name="buckets")


def _bucket_json(bucket: Any) -> dict[str, Any]:
    """One bucket row as JSON-ready data (relationships are not touched: they load lazily="raise")."""
    data = {
        "id": bucket.id,
        "backend": bucket.backend,
        "variant": bucket.variant,
        "signature": bucket.signature,
        "hit_count": bucket.hit_count,
        "first_seen": bucket.first_seen.isoformat(),
        "last_seen": bucket.last_seen.isoformat(),
        "triage_state": getattr(bucket.triage_state, "value", bucket.triage_state),
        "first_case_id": bucket.first_case_id,
        "minimised_case_id": bucket.minimised_case_id,
        "minimise_note": bucket.minimise_note,
        "upstream_url": bucket.upstream_url,
        "notes": bucket.notes,
        "duplicate_of_id": bucket.duplicate_of_id,
    }
    for optional in ("severity", "defect_id"):  # SHRINK's columns, where the schema has them
        if hasattr(bucket, optional):
            data[optional] = getattr(bucket, optional)
    return data


def _findings_json(session: Any, bucket: Any, detail: Any) -> dict[str, str]:
    """What the bucket page opens with (`service.db.findings.bucket_findings`), as plain text:
    the verdict in words, why it has its severity, the design limit's mechanism, the second
    opinion and the consensus ("" where there is none; never raises: the figures are a reading
    aid, the stored rows stand)."""
    from service.db.findings import bucket_findings

    try:
        shown = getattr(detail, "failing_result", None)
        case = bucket.minimised_case or bucket.first_case
        found = bucket_findings(session, bucket, shown, case.config if case is not None else None)
        evidence = found.evidence
        return {
            "verdict": found.verdict,
            "severity_reason": found.severity_reason,
            "why": found.limit_group.why if found.limit_group is not None else "",
            "second_opinion": evidence.second_opinion.text if evidence.second_opinion is not None else "",
            "consensus": evidence.consensus.text if evidence.consensus is not None else "",
        }
    except Exception as exc:  # noqa: BLE001 - an old or partial row: the rest of the page stands
        return {"verdict": f"not available ({type(exc).__name__})"}


@buckets_app.command("list")
def buckets_list(
    db: DbOption = None,
    backend: Annotated[Optional[str], typer.Option(help="Only this backend (exact name).")] = None,
    variant: Annotated[Optional[str], typer.Option(help="Only this API variant (exact name).")] = None,
    signature: Annotated[Optional[str], typer.Option(help="Only signatures containing this text.")] = None,
    state: Annotated[
        Optional[str],
        typer.Option("--state", help="Only this triage state: new, confirmed, reported, fixed, wontfix, duplicate."),
    ] = None,
    severity: Annotated[
        Optional[str], typer.Option("--severity", help="Only this severity: wrong, crash, imprecise, error, limit (design limits).")
    ] = None,
    sort: Annotated[str, typer.Option(help="A column (severity, last_seen, first_seen, hit_count, id, ...), '-' first for descending.")] = "-severity",
    limit: Annotated[int, typer.Option(help="At most this many buckets (1-500).")] = 50,
    offset: Annotated[int, typer.Option(help="Buckets to skip.")] = 0,
    as_json: JsonOption = False,
) -> None:
    """Buckets matching every filter given: id, key, hits, triage state (and severity/group when
    stored). A --backend or --variant the database never stored is an error listing the
    stored names."""
    from sqlalchemy.orm import Session

    from service.db.repository import list_buckets

    try:
        url, engine = open_database(db)
        try:
            with Session(engine) as session:
                for field, value in (("backend", backend), ("variant", variant)):
                    if value:
                        check_stored_name(session, field, value)
                page = list_buckets(
                    session, backend=backend, variant=variant, signature=signature, triage_state=state,
                    severity=severity, sort=sort, limit=limit, offset=offset,
                )
                rows = [_bucket_json(b) for b in page.items]
        finally:
            engine.dispose()
    except AttnFuzzError as exc:
        fail(exc)
    if as_json:
        print_json({"total": page.total, "limit": limit, "offset": offset, "items": rows})
        return
    shown = masked_url(url)
    if not rows:  # not an empty table (a new-user trial): say why there is nothing
        if page.total:
            out.print(f"no buckets in {shown} after --offset {offset}: {page.total} match", soft_wrap=True)
        elif any(v is not None for v in (backend, variant, signature, state, severity)):
            out.print(f"no buckets in {shown} match these filters", soft_wrap=True)
        else:
            out.print(f"no buckets in {shown}: no failing result is stored", soft_wrap=True)
        return
    table = Table(title=f"{len(rows)} of {page.total} buckets in {shown}")
    id_column(table, "id", [r["id"] for r in rows], justify="right")
    id_column(table, "backend", [visible_text(r["backend"]) for r in rows])
    id_column(table, "variant", [visible_text(r["variant"]) for r in rows])
    id_column(table, "signature", [visible_text(r["signature"]) for r in rows])
    id_column(table, "hits", [r["hit_count"] for r in rows], justify="right")
    id_column(table, "state", [r["triage_state"] for r in rows])
    extra = [c for c in ("severity", "defect_id") if rows and c in rows[0]]
    for column in extra:
        id_column(table, "group" if column == "defect_id" else column, ["" if r[column] is None else r[column] for r in rows])
    id_column(table, "case", [r["minimised_case_id"] or r["first_case_id"] for r in rows])
    for r in rows:
        # stored names are plain text, never rich markup (a cut name ends in "...[cut N chars]") nor
        # terminal escapes (a plugin's exception class name is in the signature)
        table.add_row(
            str(r["id"]), terminal_text(r["backend"]), terminal_text(r["variant"]), terminal_text(r["signature"]), str(r["hit_count"]),
            r["triage_state"], *["" if r[c] is None else str(r[c]) for c in extra],
            r["minimised_case_id"] or r["first_case_id"],
        )
    print_table(table)


@buckets_app.command("show")
def buckets_show(
    bucket_id: Annotated[int, typer.Argument(help="The bucket's id (buckets list).")],
    db: DbOption = None,
    results: Annotated[int, typer.Option(help="Latest results to show.")] = 10,
    as_json: JsonOption = False,
) -> None:
    """One bucket: its key and counts, triage fields, first and minimised cases, latest results."""
    from sqlalchemy.orm import Session

    from service.errors import NotFoundError
    from service.db.repository import get_bucket

    try:
        url, engine = open_database(db)
        try:
            with Session(engine) as session:
                detail = get_bucket(session, bucket_id, results_limit=max(results, 1))
                if detail is None:
                    raise NotFoundError("bucket", bucket_id)
                bucket = detail.bucket
                data = _bucket_json(bucket)
                data["result_count"] = detail.result_count
                data["first_build"] = bucket.first_build.fingerprint_id
                data["last_build"] = bucket.last_build.fingerprint_id
                data["findings"] = _findings_json(session, bucket, detail)
                for key, case in (("first_case", bucket.first_case), ("minimised_case", bucket.minimised_case)):
                    if case is None:
                        data[key] = None
                        continue
                    data[key] = {"case_id": case.id, "description": describe_stored_case(case.config),
                                 "config": case.config}
                data["results"] = [
                    {
                        "case_id": r.case_id,
                        "status": r.status,
                        "signature": r.signature,
                        "error_ratio": r.error_ratio,
                        "phase": r.phase,
                        "build": r.build.fingerprint_id if r.build is not None else None,
                        "created_at": r.created_at.isoformat(),
                    }
                    for r in detail.results[:results]
                ]
        finally:
            engine.dispose()
    except AttnFuzzError as exc:
        fail(exc)
    if as_json:
        print_json(data)
        return
    out.print(f"[bold]bucket {data['id']}[/]  " + terminal_text(f"{data['backend']} / {data['variant']} / {data['signature']}"), soft_wrap=True)
    facts = [f"hits {data['hit_count']} ({data['result_count']} stored results)", f"state {data['triage_state']}"]
    facts += [f"{k} {data[k]}" for k in ("severity", "defect_id") if data.get(k) is not None]
    facts += [f"builds {data['first_build']} .. {data['last_build']}"]
    out.print("  " + "; ".join(facts), soft_wrap=True)
    for key in ("first_case", "minimised_case"):
        if data[key] is not None:
            out.print(escape(f"  {key.replace('_', ' ')}: {data[key]['case_id']}  {data[key]['description']}"), soft_wrap=True)
    for key, label in (("verdict", "verdict"), ("severity_reason", "severity"), ("why", "design limit"),
                       ("second_opinion", "second opinion"), ("consensus", "consensus")):
        if data["findings"].get(key):
            out.print(terminal_text(f"  {label}: {data['findings'][key]}"), soft_wrap=True)
    if data["minimise_note"]:
        out.print(terminal_text(f"  shrink: {data['minimise_note']}"), soft_wrap=True)
    if data["upstream_url"] or data["notes"] or data["duplicate_of_id"]:
        out.print(terminal_text(f"  upstream {data['upstream_url'] or '-'}; duplicate of {data['duplicate_of_id'] or '-'}; notes: {data['notes']}"), soft_wrap=True)
    from service.db.findings import ratio_text

    table = Table(title="latest results")
    id_column(table, "case_id", [r["case_id"] for r in data["results"]])
    for column in ("status", "error_ratio", "phase"):
        table.add_column(column, no_wrap=True)
    id_column(table, "build", [r["build"] or "" for r in data["results"]])
    for r in data["results"]:
        ratio = "" if r["error_ratio"] is None else ratio_text(r["error_ratio"])  # inf, not 1e+300
        table.add_row(r["case_id"], r["status"], ratio, r["phase"], r["build"] or "")
    print_table(table)


@buckets_app.command("triage")
def buckets_triage(
    bucket_id: Annotated[int, typer.Argument(help="The bucket's id (buckets list).")],
    state: Annotated[
        Optional[str],
        typer.Option("--state", help="new, confirmed, reported, fixed, wontfix, or duplicate (needs --duplicate-of)."),
    ] = None,
    notes: Annotated[Optional[str], typer.Option(help="Replace the notes ('' clears them).")] = None,
    upstream_url: Annotated[Optional[str], typer.Option(help="An http(s) URL of the upstream issue ('' clears it).")] = None,
    duplicate_of: Annotated[Optional[int], typer.Option(help="The bucket this one duplicates (with --state duplicate).")] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Change a bucket's triage fields (only the options given), with the rules of the API:
    the state 'duplicate' needs --duplicate-of another bucket, no cycles."""
    from sqlalchemy.orm import Session

    from service.errors import FieldValidationError
    from service.db.repository import UNSET, update_triage

    changes: dict[str, Any] = {}
    if state is not None:
        changes["triage_state"] = state
    if notes is not None:
        changes["notes"] = notes or None
    if upstream_url is not None:
        changes["upstream_url"] = upstream_url or None
    if duplicate_of is not None:
        changes["duplicate_of_id"] = duplicate_of
    try:
        if not changes:
            raise FieldValidationError("triage", "nothing to change: give --state, --notes, --upstream-url or --duplicate-of")
        url, engine = open_database(db, write=True, create=False)  # a bucket to triage is in a database that exists
        try:
            with Session(engine) as session:
                bucket = update_triage(session, bucket_id, **{k: changes.get(k, UNSET) for k in changes})
                session.commit()
                data = _bucket_json(bucket)
        finally:
            engine.dispose()
    except AttnFuzzError as exc:
        fail(exc)
    if as_json:
        print_json(data)
        return
    out.print(f"bucket {data['id']} ({data['backend']} / {data['variant']} / {data['signature']}): "
              f"state {data['triage_state']}", soft_wrap=True)
