"""The corpus and the database: a corpus entry per bucket with the verdicts recorded per build
(`corpus_entries_from_db`), and corpus files imported as cases and replay results
(`import_corpus`, one transaction per file).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from fuzzer.builds.corpus import CorpusEntry, Verdict as CorpusVerdict
from fuzzer.results import FAILING_STATUSES, CaseResult, pick_result
from service.db.engine import reading, write_transaction
from service.db.models import (
    Bucket,
    Build,
    Result,
)
from service.db.build_rows import fingerprint_of, packages_of, register_build
from service.db.store import SqlStore
from service.matrix.lines import LineBuild
from service.matrix.replay_rows import replay_tasks_from_buckets


def _verdict_of(row: Any, build: LineBuild | Any, packages: Mapping[str, str]) -> CorpusVerdict:
    signature = row.signature if row.status in FAILING_STATUSES else None
    return CorpusVerdict(
        fingerprint_of(build, packages),
        row.status,
        signature,
        row.created_at.isoformat(timespec="seconds"),
        tuple(sorted(packages.items())),
        build.fingerprint_id,
    )


def corpus_entries_from_db(
    bind: Engine | Connection | Session,
    *,
    backends: Sequence[str] | None = None,
    existing: Mapping[str, CorpusEntry] | None = None,
) -> list[CorpusEntry]:
    """A corpus entry per bucket (of ``backends`` if given): its minimised case (else its first),
    on its backend variant, with the last verdict recorded per build and, as ``expected``, the
    newest judged verdict (the bucket's own failure when the case has none yet).

    Args:
        existing: entries already in the corpus by ``relative_path`` (POSIX string): their
            ``why``/``source`` are kept and their verdicts merged (one per build).
    """
    existing = existing or {}
    tasks = replay_tasks_from_buckets(bind, backends)
    with reading(bind) as connection:
        signatures = dict(connection.execute(select(Bucket.id, Bucket.signature)).all())
        case_ids = sorted({t.case.case_id for t in tasks})
        rows = []
        if case_ids:
            rows = connection.execute(
                select(
                    Result.id,
                    Result.case_id,
                    Result.build_id,
                    Result.backend,
                    Result.variant,
                    Result.status,
                    Result.signature,
                    Result.phase,
                    Result.created_at,
                ).where(Result.case_id.in_(case_ids))
            ).all()
        build_ids = sorted({r.build_id for r in rows})
        builds = {}
        if build_ids:
            builds = {
                b.id: b
                for b in connection.execute(select(*Build.__table__.c).where(Build.id.in_(build_ids)))
            }
        packages = packages_of(connection, build_ids)
    by_task: dict[tuple[str, str, str], dict[int, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row.status == "pass" or row.status in FAILING_STATUSES:
            by_task[(row.case_id, row.backend, row.variant)][row.build_id].append(row)
    entries = []
    for task in tasks:
        bucket_id = int(task.source.split(":", 1)[1])
        chosen = [pick_result(found) for found in by_task[task.key].values()]
        verdicts = [_verdict_of(r, builds[r.build_id], packages[r.build_id]) for r in chosen]
        newest = max(chosen, key=lambda r: (r.created_at, r.id), default=None)
        if newest is None:
            status, signature = "fail", signatures[bucket_id]
        elif newest.status == "pass":
            status, signature = "pass", None
        else:
            status, signature = "fail", newest.signature
        why = f"minimised case of bucket {bucket_id} ({task.backend} / {task.variant} / {signatures[bucket_id]})"
        entry = CorpusEntry(task.case, task.backend, task.variant, why, status, signature, f"bucket:{bucket_id}")
        previous = existing.get(entry.relative_path.as_posix())
        if previous is not None:
            entry = CorpusEntry(
                entry.case, entry.backend, entry.variant, previous.why, status, signature, previous.source, previous.verdicts
            )
        for verdict in sorted(verdicts, key=lambda v: v.recorded_at):
            entry = entry.with_verdict(verdict)
        entries.append(entry)
    return entries


def import_corpus(bind: Engine | Connection, entries: Sequence[CorpusEntry], *, with_verdicts: bool = True) -> int:
    """Store every entry's case (origin ``corpus``) and, with ``with_verdicts``, each recorded
    verdict as a ``replay`` result on its build (registered from the verdict's fingerprint,
    package versions and ``build_key``). Returns how many verdicts were stored.

    Each entry (one corpus file) is one transaction: a write the database refuses stores nothing
    of that file."""
    stored = 0
    for entry in entries:
        stored += write_transaction(bind, lambda connection, entry=entry: _import_entry(connection, entry, with_verdicts))
    return stored


def _import_entry(bind: Connection, entry: CorpusEntry, with_verdicts: bool) -> int:
    """`import_corpus` for one entry, on ``bind``'s open transaction; how many verdicts it stored."""
    store = SqlStore(bind)
    stored = 0
    store.record_case(entry.case.to_json(), "corpus")
    if with_verdicts:
        for verdict in entry.verdicts:
            build = register_build(bind, verdict.build, dict(verdict.packages), key=verdict.build_key or None)
            failing = verdict.status in FAILING_STATUSES
            signature = (verdict.signature or verdict.status) if failing else None
            result = CaseResult(
                entry.case.case_id,
                entry.backend,
                entry.variant,
                verdict.status,
                signature=signature,
                signatures=(signature,) if signature else (),
                detail=f"verdict imported from the corpus (recorded {verdict.recorded_at})",
                phase="replay",
            )
            store.record_result(result, build.build_id, None)
            stored += 1
    return stored
