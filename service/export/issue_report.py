"""An issue-ready Markdown report of one bucket (``attnfuzz report --bucket ID --format markdown``,
``GET /api/buckets/{id}/issue.md``, the bucket page's "copy as issue").

Everything comes from the store, nothing is recomputed (no oracle, no kernel): the bucket, its
minimised case (else its first case), the stored result of the bucket's backend variant on that
case (signatures and figures), every other stored result on the same case (the differential
evidence: what passed), the first and last builds the bucket was seen on, a finished bisection of
the case if there is one, and the repro file (`service.export.target.export_target` from the stored
allowances). Sections:

1. title in the library's terms: the package (``flash-attn-4``), the library call the variant makes
   (from the adapter's `fuzzer.backends.base.Backend.repro` values) and what is wrong; a design
   limit (severity ``limit``) is marked ``[design limit]`` and says first that it is no defect;
2. before the sections, the verdict in words (`service.db.findings.verdict_words`: at the worst
   element the float64 and the kernel's value, the headroom to the dtype's max, the tile's scale
   against the tensor's), the severity's reason, and the second opinion (the emulation of the
   backend's design on the case, FlashAttention's rule against it);
3. build fingerprint: every package version of the build (``Build`` row and the result's
   ``backend_version``), device, compute capability, driver;
4. the minimised case as JSON and as the library call;
5. signature and error figures per tensor (error ratio, error, allowed, worst index, worst tile);
6. what else ran on the same case, with status and signature, and the consensus in a line; the
   results that fail as a design limit folded apart;
7. first and last seen builds, first bad build if bisected;
8. the repro file and the command to run it.

Text from the store (a plugin's backend or variant name, an exception's class name in a
signature, a detail, a note) is never Markdown of its own: `_cell` keeps a plain name (letters,
digits, ``_ . : , = + / ( ) -`` and spaces) as it is and writes anything else as a code span, in
which no heading, emphasis, link, autolink, HTML, ``@mention`` or ``#123`` reference works; every
value is one line (newlines and control characters, terminal escapes included, are gone:
`_plain`), and inside a code span or code block (`_code_text`, the repro command) nothing can
close it.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import unicodedata
from dataclasses import dataclass
from typing import Any

from fuzzer.severity import LIMIT_KINDS, signature_kind
from oracle.compare import TILE_ROWS
from oracle.signatures import phrase

_BUILD_FIELDS = (
    "torch", "cuda", "cudnn", "flash_attn_4", "flash_attn", "transformer_engine", "nvidia_cutlass_dsl", "triton",
    "python", "device_name", "compute_capability", "driver",
)


@dataclass(frozen=True)
class IssueReport:
    """A bucket written up for the library's issue tracker.

    Attributes:
        bucket_id: the bucket.
        title: one line, in the library's terms.
        markdown: the whole report (starts with ``# title``).
    """

    bucket_id: int
    title: str
    markdown: str


def signature_meaning(signature: str | None) -> str:
    """``out:all_zero`` -> ``returns an all-zero out``, ``crash`` -> ``crashes the process``,
    ``error:ValueError`` -> ``raises ValueError``: the kind's phrase (`oracle.signatures.KINDS`); a
    kind not declared there, the signature itself; None or empty: ``passes``."""
    if not signature:
        return "passes"
    return phrase(signature, tile_rows=TILE_ROWS)


_PLAIN_NAME = re.compile(r"[A-Za-z0-9 _.:,=+/()\-]*")
"""Text `_cell` writes as it is: no character Markdown (or GitHub: ``@``, ``#``) gives a meaning."""


def _plain(value: Any, limit: int = 300) -> str:
    """``value`` as one line of at most ``limit`` characters: control and format characters
    (newlines, ``ESC`` of a terminal escape, bidirectional overrides, zero-width characters)
    dropped, runs of whitespace one space."""
    text = "".join(ch if not unicodedata.category(ch).startswith("C") else " " for ch in str(value))
    return " ".join(text.split())[:limit]


def _code_text(value: Any, limit: int = 300) -> str:
    """A stored value to write inside a code span (or a table cell's): `_plain` (at most ``limit``
    characters), no backtick that would close the span, no pipe that would end the cell."""
    return _plain(value, limit).replace("`", "'").replace("|", "/")


def _cell(value: Any, limit: int = 300) -> str:
    """A stored value as Markdown text (a table cell, a sentence, the title): a plain name as it is
    (``fa4``, ``out:all_zero, out:mismatch``), anything else as a code span (see the module
    docstring), so it cannot add headings, links, HTML or mentions; at most ``limit`` characters
    (300; the sentences of `service.db.findings`, which name stored values, `PROSE`)."""
    text = _code_text(value, limit)
    lowered = text.lower()
    if _PLAIN_NAME.fullmatch(text) and "://" not in text and "www." not in lowered:
        return text
    return f"`{text}`" if text else text


PROSE = 3000
"""The longest sentence of the findings (verdict, severity, second opinion, consensus) written in full."""


def _num(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "-"
    if isinstance(value, (int, float)):
        return f"{float(value):.4g}" if math.isfinite(float(value)) else str(value)
    return _cell(value)


def _fence(text: str, language: str = "") -> str:
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}{language}\n{text.rstrip()}\n{fence}"


def _worst_tile(case: Any, name: str, index: Any) -> str:
    """The tile holding ``worst_index`` of tensor ``name`` (canonical layout), as text: its batch and
    head, and its rows, the last tile cut at the tensor's rows (`oracle.tolerance.TILE_ROWS` rows a
    tile, as `oracle.portable` reports them)."""
    if not isinstance(index, list) or not all(type(i) is int for i in index):
        return "-"
    if case.is_varlen:
        row_dim = 1 if name == "lse" else 0
        head = index[0] if name == "lse" else (index[1] if len(index) > 1 else 0)
        where = f"head {head}"
    else:
        row_dim = 2 if name == "lse" else 1
        head = index[1] if name == "lse" else (index[2] if len(index) > 2 else 0)
        where = f"batch {index[0]}, {'kv head' if name in ('dk', 'dv') else 'head'} {head}"
    if len(index) <= row_dim:
        return "-"
    tile = index[row_dim] // TILE_ROWS
    by_query = name in ("out", "lse", "dq")  # their rows are the queries; dk and dv's the keys
    rows = (case.total_q if by_query else case.total_k) if case.is_varlen else (case.seqlen_q if by_query else case.seqlen_k)
    last = min((tile + 1) * TILE_ROWS, rows) - 1  # the last tile of a tensor may be short (5 rows: 0..4)
    return f"{where}, rows {tile * TILE_ROWS}..{max(last, tile * TILE_ROWS)}"


def _first_unexpected(figures: dict[str, Any]) -> str:
    """What the stored worst index of a tensor's ``figures`` points at when the tensor holds an
    entry the oracle flags whatever its size (``oracle.verdict``: the first NaN, +inf, -inf or
    finite lse on a row that sees no key, the first the oracle found), as words ("NaN or +inf"); ""
    when it holds none (then the index is the largest error's, in the figures' tile)."""
    from service.db.findings import nonfinite_counts

    kinds = [label for _, label in nonfinite_counts(figures)]
    if any(str(sig).endswith(":finite_on_masked") for sig in figures.get("signatures") or []):
        kinds.append("finite value on a row that sees no key")
    return " or ".join(kinds)


def _build_line(build: Any) -> str:
    if build is None:
        return "-"
    parts = [f"{field}={getattr(build, field)}" for field in _BUILD_FIELDS if getattr(build, field, "")]
    return f"build {build.id} (`{build.fingerprint_id}`): " + _cell(", ".join(parts) or "no versions recorded")


def _library_call(case: Any, backend: Any, variant: str) -> tuple[str, str]:
    """(short call text for the title, the call as code) from the adapter's repro call, its slots
    filled with their literals (`service.export.safety.fill_template`)."""
    import textwrap

    from service.export.backend import repro_call
    from service.export.safety import ExportError, fill_template, literal

    try:
        call = repro_call(backend, case, variant)
        code = fill_template(textwrap.dedent(call.source), call.values)
    except ExportError as exc:
        return variant, f"# no repro call: {exc}"
    import ast

    tree = ast.parse(code)  # the constants and call_backend only (helpers are in the repro file)
    keep = [n for n in tree.body if isinstance(n, ast.Assign) or (isinstance(n, ast.FunctionDef) and n.name == "call_backend")]
    code = "\n\n".join(ast.get_source_segment(code, n) for n in keep) or code
    kwargs = next((v for v in call.values.values() if isinstance(v, dict) and v), None)
    if kwargs:
        short = ", ".join(f"{k}={literal(v)}" for k, v in kwargs.items() if k != "softmax_scale")
        return f"{variant} ({short})", code.strip()
    return variant, code.strip()


def _export_command(case_id: str, bucket: Any, filename: str, *, plugin: bool = False) -> str:
    """The report's ``attnfuzz export`` line (an indented code block): one line, each stored name
    shell-quoted. For a ``plugin`` (a backend this process cannot import by name: `fuzz` loaded it
    as ``--backend module:attr``, which the database does not keep) ``--backend MODULE:ATTR``
    (`service.export.backend.plugin_export_command`; `_plugin_note` says what goes there): its name
    alone fails (no installed backend has it)."""
    from service.export.backend import plugin_export_command

    if plugin:
        return "    " + plugin_export_command(case_id, _plain(bucket.variant), tail=f"-o {filename}")
    return (f"    attnfuzz export {case_id} --backend {shlex.quote(_plain(bucket.backend))} "
            f"--variant {shlex.quote(_plain(bucket.variant))} -o {filename}")


def _plugin_note(bucket: Any) -> str:
    """The sentence before a plugin's export command: the database does not keep its spec."""
    return (f"The backend {_cell(bucket.backend)} is no built-in or installed backend: a plugin that `attnfuzz fuzz` "
            "loaded as `--backend module:attr`, and the database keeps its name, not that `module:attr`. Export "
            "the file with the plugin's `module:attr` in place of `MODULE:ATTR`, where its module imports:")


def bucket_issue(session: Any, bucket_id: int, *, compute_missing: bool = False) -> IssueReport:
    """The issue report of bucket ``bucket_id`` from stored data only.

    ``compute_missing``: for results stored without allowances (an older attnfuzz), compute the
    repro's allowances with the CPU oracle (the CLI; never in a web request).

    Raises:
        NotFoundError: no such bucket.
    """
    from sqlalchemy import select
    from sqlalchemy.orm import selectinload

    from service.db import findings, repository
    from service.errors import NotFoundError
    from service.export.backend import importable_backends, resolve_backend
    from service.export.repro import repro_filename
    from service.export.safety import ExportError, validated_case
    from service.export.target import export_target
    from service.db.models import BisectRun, Bucket, Build, Result

    bucket = session.scalar(
        select(Bucket).where(Bucket.id == bucket_id).options(
            selectinload(Bucket.first_case), selectinload(Bucket.minimised_case),
            selectinload(Bucket.first_build), selectinload(Bucket.last_build),
        )
    )
    if bucket is None:
        raise NotFoundError("bucket", bucket_id)
    target = repository.bucket_repro_target(session, bucket_id)
    case_row = target.case
    case = validated_case(case_row.config)
    results = session.execute(
        select(Result, Build).join(Build, Build.id == Result.build_id).where(Result.case_id == case_row.id)
        .order_by(Result.created_at.desc(), Result.id.desc())
    ).all()
    mine = next(
        (r for r, _ in results if r.backend == bucket.backend and r.variant == bucket.variant and r.signature == bucket.signature),
        None,
    ) or next((r for r, _ in results if r.backend == bucket.backend and r.variant == bucket.variant), None)
    build = next((b for r, b in results if mine is not None and r.id == mine.id), None) or bucket.last_build
    try:
        adapter = resolve_backend(bucket.backend)
        package = adapter.packages[0] if adapter.packages else bucket.backend
        short_call, call_code = _library_call(case, adapter, bucket.variant)
    except ExportError as exc:
        package, short_call, call_code = bucket.backend, bucket.variant, f"# {_plain(exc, 2000)}"
    meaning = signature_meaning(bucket.signature)
    is_limit = bucket.severity == "limit"
    if is_limit and mine is not None:  # in the oracle's terms: "returns +inf in dk ..., as its design's limit"
        tensor = bucket.signature.partition(":")[0]
        figures = (mine.metrics or {}).get(tensor)
        raw = next(iter(figures.get("signatures") or []), None) if isinstance(figures, dict) else None
        if isinstance(raw, str):
            meaning = f"{signature_meaning(raw)}, the limit of its design"
    title = f"{'[design limit] ' if is_limit else ''}{_cell(package)}, {_cell(short_call)}: {_cell(meaning)} ({_cell(case.describe())})"
    minimised = bucket.minimised_case_id is not None
    opinion = findings.second_opinion(mine)
    consensus = findings.consensus_from_rows(bucket, case_row.id, [r for r, _ in results])
    out: list[str] = [f"# {title}", ""]
    if is_limit:
        design = f" ('{_cell(opinion.design)}')" if opinion is not None and opinion.design else ""
        why = f": {_cell(opinion.why, PROSE)}" if opinion is not None and opinion.why else ""
        out += [f"> **Design limit, not a kernel defect.** A correct float32 emulation of the backend's design{design} "
                f"fails this case the same way{why}. attnfuzz lists it apart from the defects; it is a limitation of "
                "the design to document, not a bug to fix in the kernel.", ""]
    out.append(
        f"attnfuzz bucket {bucket.id}: **{_cell(bucket.backend)} / {_cell(bucket.variant)} / "
        f"{_cell(bucket.signature)}**, seen {bucket.hit_count} times, triage `{bucket.triage_state.value}`. "
        f"The case below is {'the minimised case' if minimised else 'the first failing case (not minimised)'}"
        f" (`{case_row.id}`); {_cell(bucket.minimise_note) if bucket.minimise_note else ''}"
    )
    # the verdict first, before the sections (its sentences name stored values: code spans, `_cell`)
    out += ["", f"**Verdict** ({_cell(bucket.severity)}): {_cell(findings.verdict_words(bucket.signature, mine, case_row.config), PROSE)}."]
    out += ["", f"Severity: {_cell(findings.severity_reason(bucket, findings.severity_result(session, bucket, mine)), PROSE)}."]
    if opinion is None:
        out += ["", "Second opinion: none stored with this result (a crash, an error, or an older attnfuzz)."]
    else:
        out += ["", f"Second opinion: {_cell(opinion.text, PROSE)}."
                + (f" Source of the design's claim: {_cell(opinion.source)}." if opinion.source else "")]
        if opinion.rule:
            out += ["", "FlashAttention's test rule against the emulation (kernel error / (2 x the emulation's error + "
                    "the allowance); at most 1 holds):", "", "| tensor | ratio | holds |", "|---|---|---|"]
            out += [f"| {_cell(t)} | {findings.ratio_text(r.get('ratio'))} | {'yes' if r.get('holds') else 'no'} |"
                    for t, r in opinion.rule.items()]
    out += ["", "## Build", ""]
    out.append(f"- {_build_line(build)}")
    if mine is not None and mine.backend_version:
        out.append(f"- versions the backend reported: `{_code_text(mine.backend_version)}`")
    if mine is not None and mine.selected_kernel:
        out.append(f"- kernel the library selected: `{_code_text(mine.selected_kernel)}`")
    out += ["", "## Case", "", _cell(case.describe()), "", _fence(json.dumps(case.to_json(), indent=2), "json"), ""]
    out += ["The library call of the variant (values as the exported repro passes them):", "",
            _fence(call_code, "python"), ""]
    out += ["## What is wrong", ""]
    if mine is None:
        out.append("No stored result of this backend variant on the case (figures unavailable).")
    else:
        out.append(f"Status `{mine.status}`, signatures: {_cell(', '.join(mine.signatures or []) or '-')}."
                   + (f" Detail: `{_code_text(mine.detail)}`" if mine.detail else ""))
        out += ["", "| tensor | signatures | error ratio | L2 error | allowed | worst index | worst tile |",
                "|---|---|---|---|---|---|---|"]
        # a tensor the second opinion explained carries the result's signature (``out:limit``), the
        # oracle's own (``out:mismatch``) in brackets: the status line and the table say the same
        explained = {sig.partition(":")[0]: sig for sig in (mine.signatures or []) if signature_kind(sig) in LIMIT_KINDS}
        for name in ("out", "lse", "dq", "dk", "dv"):
            figures = (mine.metrics or {}).get(name)
            if not isinstance(figures, dict):
                continue
            oracle_words = ", ".join(figures.get("signatures") or []) or "passed"
            words = f"{explained[name]} (oracle: {oracle_words})" if name in explained else oracle_words
            first_bad = _first_unexpected(figures)
            index, tile = _cell(figures.get("worst_index")), _worst_tile(case, name, figures.get("worst_index"))
            if first_bad and figures.get("worst_index") is not None:
                index, tile = f"{index} (first {first_bad})", f"of the first {first_bad}: {tile}"
            out.append(
                f"| {name} | {_cell(words)} | "
                f"{findings.ratio_text(figures.get('error_ratio'))} | {_num(figures.get('err_backend'))} | "
                f"{_num(figures.get('allowed'))} | {index} | {tile} |"
            )
        out += ["", "Error ratio = L2 error / allowed error of attnfuzz's float64 oracle (> 1 fails), at the worst "
                f"place (whole tensor or a tile of {TILE_ROWS} rows of one batch and head). A tensor with a NaN, "
                "an infinity or a finite lse where none belongs: the worst index is the first such entry found, and the "
                "L2 error and allowed are those of its finite entries (the worst such tile, which may be another)."]
    out += ["", "## Same case, other backends and variants", ""]
    out += [f"Consensus: {_cell(consensus.text, PROSE)}.", ""]
    others = [(r, b) for r, b in results if mine is None or r.id != mine.id]
    limits = [(r, b) for r, b in others if r.signature and signature_kind(r.signature) in LIMIT_KINDS]
    others = [(r, b) for r, b in others if (r, b) not in limits]
    header = ["| backend | variant | status | signature | build |", "|---|---|---|---|---|"]
    if not others and not limits:
        out.append("Nothing else ran on this case.")
    elif others:
        out += header
        for r, b in others[:60]:
            out.append(f"| {_cell(r.backend)} | {_cell(r.variant)} | {_cell(r.status)} | {_cell(r.signature or '-')} | {b.id} |")
    if limits:
        out += ["", f"<details><summary>{len(limits)} result(s) on this case that fail as the limit of their backend's "
                "design (no claim against those kernels)</summary>", "", *header]
        for r, b in limits[:60]:
            out.append(f"| {_cell(r.backend)} | {_cell(r.variant)} | {_cell(r.status)} | {_cell(r.signature or '-')} | {b.id} |")
        out += ["", "</details>"]
    out += ["", "## Builds", ""]
    out.append(f"- first seen: {bucket.first_seen:%Y-%m-%d %H:%M} UTC on {_build_line(bucket.first_build)}")
    out.append(f"- last seen: {bucket.last_seen:%Y-%m-%d %H:%M} UTC on {_build_line(bucket.last_build)}")
    bisect = session.scalar(
        select(BisectRun).where(BisectRun.case_id == case_row.id, BisectRun.backend == bucket.backend,
                                BisectRun.variant == bucket.variant, BisectRun.first_bad_version.is_not(None))
        .order_by(BisectRun.started_at.desc()).limit(1)
    )
    if bisect is not None:
        first_bad = session.get(Build, bisect.first_bad_build_id) if bisect.first_bad_build_id else None
        out.append(f"- bisected ({_cell(bisect.package)}, {bisect.replays} replays): last good "
                   f"{_cell(bisect.last_good_version)}, **first bad {_cell(bisect.first_bad_version)}**"
                   + (f" on {_build_line(first_bad)}" if first_bad is not None else ""))
    else:
        out.append("- not bisected")
    out += ["", "## Repro", ""]
    filename = repro_filename(bucket.backend, bucket.variant, case_row.id)
    plugin = bucket.backend not in importable_backends()
    try:
        repro = export_target(session, target, force=True, compute_missing=compute_missing)
        filename = repro.filename
        out += [f"A standalone pytest file (torch and pytest only, plus the library); it fails while the kernel "
                f"still shows `{_code_text(bucket.signature)}`:", "",
                _export_command(case_row.id, bucket, filename), f"    pytest {filename}", "",
                f"<details><summary>{filename}</summary>", "",
                _fence(repro.source, "python"), "", "</details>"]
    except ExportError as exc:
        if plugin:  # the command as printed would fail by the backend's name: say what the database lacks
            out += [_plugin_note(bucket), ""]
        why = "attnfuzz cannot import the plugin here" if plugin else _cell(exc)
        out += [_export_command(case_row.id, bucket, filename, plugin=plugin), f"    pytest {filename}", "",
                f"(The file is not inlined here: {why})"]
    out.append("")
    return IssueReport(bucket_id=bucket.id, title=title, markdown="\n".join(out))


__all__ = ["IssueReport", "bucket_issue", "signature_meaning"]
