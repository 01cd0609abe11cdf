"""Workers: which are live (`is_live_worker`), worker runs and the gaps between them: each ``workers`` row as a `WorkerRun`
(`service.db.store.SqlStore.worker_runs` reads them), and `heartbeat_gaps`, the time between
one worker's last heartbeat and its successor's start on the same host and spool slot."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from service.db.models import Worker


@dataclass(frozen=True)
class WorkerRun:
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

    before: WorkerRun
    after: WorkerRun
    gap_s: float
    clean: bool


def heartbeat_gaps(runs: Iterable[WorkerRun]) -> list[HeartbeatGap]:
    """Consecutive runs of each (hostname, slot), in start order; runs without a slot are
    left out (nothing says which one restarted which)."""
    by_slot: dict[tuple[str, str], list[WorkerRun]] = {}
    for run in runs:
        if run.slot is not None:
            by_slot.setdefault((run.hostname, run.slot), []).append(run)
    gaps = []
    for slot_runs in by_slot.values():
        slot_runs.sort(key=lambda r: (r.started_at, r.worker_id))
        for before, after in zip(slot_runs, slot_runs[1:]):
            gap_s = (after.started_at - before.last_heartbeat).total_seconds()
            gaps.append(HeartbeatGap(before, after, gap_s, clean=before.status == "stopped"))
    return gaps


LIVE_WORKER_S = 300.0
"""A worker heard from within this many seconds (and still saying it runs) is live."""
# A worker is live while it says it runs and was heard from recently; one that stopped cleanly is
# not, however recent its last heartbeat.
LIVE_WORKER_STATUSES = ("running", "stopping")


def is_live_worker(now: datetime, live_within_s: float) -> Any:
    """The SQL condition "this ``workers`` row is live at ``now``": a heartbeat within
    ``live_within_s`` seconds and a status of `LIVE_WORKER_STATUSES`."""
    return (Worker.last_heartbeat >= now - timedelta(seconds=live_within_s)) & Worker.status.in_(LIVE_WORKER_STATUSES)


@dataclass(frozen=True)
class LiveWorker:
    """A worker whose last heartbeat is recent, and how long ago it was (seconds)."""

    worker: Worker
    heartbeat_age_s: float
