"""Worker sessions and the gaps between them: each ``workers`` row as a `WorkerSession`
(`service.db.store.SqlStore.worker_sessions` reads them), and `heartbeat_gaps`, the time between
one worker's last heartbeat and its successor's start on the same host and spool slot."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class WorkerSession:
    """One ``workers`` row: a worker process from start to its last heartbeat (times UTC)."""

    worker_id: int
    hostname: str
    slot: str | None
    pid: int
    started_at: datetime
    last_heartbeat: datetime
    status: str
    cases_run: int


@dataclass(frozen=True)
class HeartbeatGap:
    """The time between a worker's last heartbeat and the start of the next worker of its host
    and slot (its restart), in seconds; ``clean`` when the first one stopped normally."""

    before: WorkerSession
    after: WorkerSession
    gap_s: float
    clean: bool


def heartbeat_gaps(sessions: Iterable[WorkerSession]) -> list[HeartbeatGap]:
    """Consecutive sessions of each (hostname, slot), in start order; sessions without a slot are
    left out (nothing says which one restarted which)."""
    by_slot: dict[tuple[str, str], list[WorkerSession]] = {}
    for session in sessions:
        if session.slot is not None:
            by_slot.setdefault((session.hostname, session.slot), []).append(session)
    gaps = []
    for runs in by_slot.values():
        runs.sort(key=lambda r: (r.started_at, r.worker_id))
        for before, after in zip(runs, runs[1:]):
            gap_s = (after.started_at - before.last_heartbeat).total_seconds()
            gaps.append(HeartbeatGap(before, after, gap_s, clean=before.status == "stopped"))
    return gaps
