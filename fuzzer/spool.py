"""A worker's local spool: its unsaved writes and its in-flight case, on local disk.

One idea (the module is over 600 lines): keeping a worker's writes and its in-flight case safe on
local disk until the store has them.

Fuzz workers run for days while the database restarts, is locked by another writer or is
unreachable for a while. `SpoolingSink` wraps the real `ResultSink` (``service.db.store.SqlStore``):

* a write (``record_case``, ``record_result``, ``record_case_results``, ``record_minimised``, ``release_minimisation``, a
  final heartbeat) that fails with `SinkUnavailableError` is appended to the `Spool` instead, and
  so is every write after it while the spool is not empty, so the database receives them in the
  order the worker made them;
* the spool is flushed, oldest first, at the next write after a backoff delay (0.5 s doubling to
  30 s, with jitter); each entry is removed once the database has it. Writes are idempotent per
  ``(case_id, build, backend, variant, phase)``, so an entry written just before a crash and
  written again after it is stored once;
* `SinkFatalError` (disk full, read-only database) is raised at once, the refused write kept in
  the spool for a later run: retrying now cannot help, and the worker must stop;
* reads that steer the worker (``known_failures``, ``claim_minimisation``) answer "nothing" while
  the database is away; heartbeats while it is away are dropped (the gap shows on the dashboard).
* batching (``batch_cases`` > 0, with an inner sink that has ``record_batch``, the HTTP sink
  `fuzzer.http_sink.HttpSink`): a case whose results hold no failure is appended to the spool
  (on disk: a killed worker loses none of it) and the spool is flushed when it holds
  ``batch_cases`` writes or its oldest batched write is ``batch_age_s`` old (checked at each
  write, heartbeat and read, and at `SpoolingSink.close`); consecutive case writes go to the
  database in one ``record_batch`` call. A case with a failure is written at once (after what is
  batched), so the worker learns of a new bucket at once, unless every bucket it hits was
  answered by a direct write in the last ``settle_s`` seconds (then it is batched too: a GPU
  campaign's cases nearly all fail, most on buckets seen before).

The `Spool` is one *slot* directory, ``<root>/<database hash>/slot-<n>``, held with an exclusive
``flock`` while a worker uses it (the kernel releases it when the worker dies, even by SIGKILL).
A worker takes the first free slot. The slot also keeps the worker's *in-flight evaluation*
(`Spool.begin_evaluation`): the case being run and how, written before it runs and removed when
its results are stored, so a worker that takes over the slot of a killed one redoes that case,
flushes its spool and marks it lost (`ResultSink.mark_worker_lost`, which ends its leases).

Storage is one SQLite file per slot (the stdlib ``sqlite3``; WAL, ``synchronous=NORMAL``: a
committed entry survives the process being killed). Its size is bounded (``max_bytes``):
`SpoolFullError` says so, naming the slot, and nothing is dropped.

An optional `Ledger` (JSON lines) lists every result the sink accepted, written or spooled, and
every minimisation claim: the soak test's record of what must end up in the database.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import random
import sqlite3
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from hypothesis.database import ExampleDatabase

from fuzzer.results import (
    BucketUpdate,
    BuildFingerprint,
    CaseResult,
    MinimiseClaim,
    ResultSink,
    SinkFatalError,
    SinkStayedUnavailableError,
    SinkUnavailableError,
    stops_deferred,
)
from fuzzer.text import masked_url
from oracle.errors import AttnFuzzError

SPOOL_FORMAT_VERSION = 1
SPOOL_FILE = "spool.sqlite3"
LOCK_FILE = "lock"
DEFAULT_MAX_BYTES = 256 * 2**20
DEFAULT_MAX_SLOTS = 256
WRITE_OPS = (
    "record_case", "record_result", "record_case_results", "record_minimised", "release_minimisation", "heartbeat"
)
HEARTBEAT_FIGURES = ("evaluations", "known_hits")
"""The optional counts of a spooled heartbeat (`fuzzer.results.ResultSink.heartbeat`); entries
spooled before they existed have none."""


class SpoolError(AttnFuzzError):
    """The spool cannot be used (unreadable, another format version, its disk full)."""

    exit_code = 7


class SpoolFullError(SpoolError):
    """The spool reached its size limit; the write that did not fit was not spooled."""


def default_spool_root() -> Path:
    """``$ATTNFUZZ_SPOOL_DIR`` if set, else ``$XDG_CACHE_HOME/attnfuzz/spool`` (``~/.cache/...``)."""
    if os.environ.get("ATTNFUZZ_SPOOL_DIR"):
        return Path(os.environ["ATTNFUZZ_SPOOL_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "attnfuzz" / "spool"


def canonical_database_url(url: str) -> str:
    """``url`` with a relative SQLite file path made absolute (against the working directory), so
    that ``sqlite:///attnfuzz.db`` run from two directories names two databases, not one; any
    other URL unchanged."""
    scheme, sep, rest = url.partition(":///")
    if not sep or scheme.split("+")[0] != "sqlite":
        return url
    path, question, query = rest.partition("?")
    if not path or path.startswith("/") or path == ":memory:" or path.startswith("file:"):
        return url
    return f"{scheme}:///{os.path.abspath(path)}{question}{query}"


def database_key(url: str) -> str:
    """The slot-group name of a database URL: 16 hex digits of the SHA-256 of its
    `canonical_database_url`."""
    return hashlib.sha256(canonical_database_url(url).encode()).hexdigest()[:16]


class Spool:
    """One spool slot (see the module docstring); use `Spool.acquire` to take a free one.

    Args:
        path: the slot directory (created if missing).
        max_bytes: bound on the spooled payloads, bytes.

    Raises:
        BlockingIOError: another process holds the slot.
        SpoolError: the slot cannot be created, or its file is unreadable or of another format
            version.
    """

    def __init__(self, path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES):
        if max_bytes <= 0:
            raise SpoolError(f"max_bytes: must be positive, got {max_bytes}")
        self.path = Path(path)
        self.max_bytes = max_bytes
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise SpoolError(f"{self.path}: cannot create the spool slot: {exc}") from exc
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise
        try:
            self._db = sqlite3.connect(self.path / SPOOL_FILE, isolation_level=None, timeout=5.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                self._db.execute(
                    "CREATE TABLE IF NOT EXISTS entries (seq INTEGER PRIMARY KEY AUTOINCREMENT, op TEXT NOT NULL,"
                    " payload TEXT NOT NULL, size_bytes INTEGER NOT NULL)"
                )
                self._db.execute(
                    "CREATE TABLE IF NOT EXISTS rejected (seq INTEGER PRIMARY KEY, op TEXT NOT NULL,"
                    " payload TEXT NOT NULL, error TEXT NOT NULL)"
                )
                self._db.execute("CREATE TABLE IF NOT EXISTS inflight (id INTEGER PRIMARY KEY CHECK (id = 1), payload TEXT NOT NULL)")
                row = self._db.execute("SELECT value FROM meta WHERE key = 'format_version'").fetchone()
                if row is None:
                    self._db.execute("INSERT INTO meta VALUES ('format_version', ?)", (str(SPOOL_FORMAT_VERSION),))
                elif row[0] != str(SPOOL_FORMAT_VERSION):
                    raise SpoolError(
                        f"{self.path / SPOOL_FILE}: format_version {row[0]!r} is not supported "
                        f"(allowed: {SPOOL_FORMAT_VERSION}); flush it with the attnfuzz version that wrote it"
                    )
            # kept up to date by append/remove (the slot's lock makes this process the only writer)
            self._count, self._size_bytes = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(size_bytes), 0) FROM entries"
            ).fetchone()
        except sqlite3.DatabaseError as exc:
            self._release_lock()
            raise SpoolError(f"{self.path / SPOOL_FILE}: cannot open the spool: {exc}") from exc
        except SpoolError:
            self._release_lock()
            raise

    @classmethod
    def acquire(
        cls, root: str | Path, database_url: str, max_bytes: int = DEFAULT_MAX_BYTES, max_slots: int = DEFAULT_MAX_SLOTS
    ) -> Spool:
        """The first free slot under ``root`` for ``database_url`` (slot-0, slot-1, ...).

        Raises:
            SpoolError: all ``max_slots`` slots are held, or a slot cannot be opened.
        """
        group = Path(root) / database_key(database_url)
        for index in range(max_slots):
            try:
                spool = cls(group / f"slot-{index}", max_bytes)
            except BlockingIOError:
                continue
            spool.set_meta("database", masked_url(canonical_database_url(database_url)))  # no password on disk
            return spool
        raise SpoolError(f"{group}: all {max_slots} spool slots are held by running workers")

    # ------------------------------------------------------------------ basics
    @property
    def slot(self) -> str:
        """The slot's name (``slot-<n>``), recorded with the worker."""
        return self.path.name

    @property
    def size_bytes(self) -> int:
        """Bytes of spooled payloads."""
        return self._size_bytes

    def __len__(self) -> int:
        return self._count

    def _execute(self, sql: str, params: Iterable[Any] = ()) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, tuple(params))
        except sqlite3.OperationalError as exc:
            raise SpoolError(f"{self.path / SPOOL_FILE}: {exc}") from exc

    def meta(self, key: str) -> str | None:
        row = self._execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta(self, key: str, value: str) -> None:
        self._execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))

    # ------------------------------------------------------------------ entries
    def append(self, op: str, payload: dict[str, Any]) -> int:
        """Spool one write; its sequence number.

        Raises:
            SpoolFullError: it would take the spool past ``max_bytes``.
            SpoolError: the spool file cannot be written (its disk is full).
        """
        if op not in WRITE_OPS:
            raise SpoolError(f"op: unknown value {op!r} (allowed: {', '.join(WRITE_OPS)})")
        text = json.dumps(payload, separators=(",", ":"), allow_nan=True)
        size = len(text.encode())
        if self._size_bytes + size > self.max_bytes:
            raise SpoolFullError(
                f"spool {self.path} is full: {self._size_bytes} + {size} bytes > max_bytes {self.max_bytes} "
                f"({len(self)} writes waiting for the database); nothing was dropped"
            )
        seq = self._execute("INSERT INTO entries (op, payload, size_bytes) VALUES (?, ?, ?)", (op, text, size)).lastrowid
        self._size_bytes += size
        self._count += 1
        return seq

    def entries(self, limit: int = 100) -> list[tuple[int, str, dict[str, Any]]]:
        """The oldest ``limit`` spooled writes as ``(seq, op, payload)``."""
        rows = self._execute("SELECT seq, op, payload FROM entries ORDER BY seq LIMIT ?", (limit,)).fetchall()
        return [(seq, op, json.loads(payload)) for seq, op, payload in rows]

    def remove(self, seq: int) -> None:
        """Drop a write the database now has."""
        row = self._execute("SELECT size_bytes FROM entries WHERE seq = ?", (seq,)).fetchone()
        if row is not None:
            self._execute("DELETE FROM entries WHERE seq = ?", (seq,))
            self._size_bytes -= row[0]
            self._count -= 1

    def remove_many(self, seqs: list[int]) -> None:
        """Drop writes the database now has (one statement)."""
        if not seqs:
            return
        marks = ",".join("?" * len(seqs))
        with self._db:
            self._execute("BEGIN IMMEDIATE")
            size, count = self._execute(
                f"SELECT COALESCE(SUM(size_bytes), 0), COUNT(*) FROM entries WHERE seq IN ({marks})", seqs
            ).fetchone()
            self._execute(f"DELETE FROM entries WHERE seq IN ({marks})", seqs)
        self._size_bytes -= size
        self._count -= count

    def reject(self, seq: int, error: str) -> None:
        """Move a write the database refuses for a reason of its own (not an outage) aside,
        with the error: kept, reported, never retried."""
        with self._db:
            self._execute("BEGIN IMMEDIATE")
            self._execute(
                "INSERT OR REPLACE INTO rejected SELECT seq, op, payload, ? FROM entries WHERE seq = ?", (error, seq)
            )
        self.remove(seq)

    def rejected(self) -> list[tuple[int, str, dict[str, Any], str]]:
        """Writes set aside by `reject`, as ``(seq, op, payload, error)``."""
        rows = self._execute("SELECT seq, op, payload, error FROM rejected ORDER BY seq").fetchall()
        return [(seq, op, json.loads(payload), error) for seq, op, payload, error in rows]

    # ------------------------------------------------------------------ in-flight evaluation
    def begin_evaluation(self, case_json: dict[str, Any], phase: str, tasks: list[tuple[str, str]] | None) -> None:
        """Record the case about to run (replacing any previous record)."""
        payload = json.dumps({"case": case_json, "phase": phase, "tasks": tasks}, allow_nan=True)
        self._execute("INSERT OR REPLACE INTO inflight (id, payload) VALUES (1, ?)", (payload,))

    def end_evaluation(self) -> None:
        """The case's results are stored (or spooled): forget it."""
        self._execute("DELETE FROM inflight")

    def interrupted_evaluation(self) -> dict[str, Any] | None:
        """The evaluation a killed worker left in this slot: ``{"case", "phase", "tasks"}``."""
        row = self._execute("SELECT payload FROM inflight").fetchone()
        return None if row is None else json.loads(row[0])

    def _release_lock(self) -> None:
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        finally:
            os.close(self._lock_fd)

    def close(self) -> None:
        """Close the file and free the slot (what is spooled stays for the next worker)."""
        if self._db is not None:
            self._db.close()
            self._db = None
            self._release_lock()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Ledger:
    """An append-only JSON-lines record of what a worker handed to its sink (for audits and the
    soak test). Each line is flushed to the kernel at once, so it survives SIGKILL."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1)

    def write(self, event: str, **fields: Any) -> None:
        self._file.write(json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), **fields}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class SpoolingSink:
    """A `ResultSink` that keeps writes in a `Spool` while ``inner`` is unavailable.

    Args:
        inner: the real sink.
        spool: this worker's spool slot.
        ledger: optional record of every accepted result and every claim.
        backoff_initial_s, backoff_max_s: flush retry delay, seconds (doubling, +-20 % jitter).
        startup_timeout_s: how long ``register_build``/``register_worker`` keep retrying, seconds.
        batch_cases: batch case writes without failures, flushed at this many spooled writes
            (0: no batching; needs an ``inner`` with ``record_batch``).
        batch_age_s: ... or when the oldest batched write is this old, seconds.
        settle_s: a case with failures is batched when each of its buckets was answered by a
            direct write less than this many seconds ago (its minimised state is that fresh).
        clock, sleep: injectable time (tests).
        log: where one-line notices go (default stderr).

    Raises:
        SinkFatalError: (from any method) the database refuses writes; nothing was lost.
        SpoolFullError: (from writes) the database is away and the spool is full.
        SinkUnavailableError: (from the register methods) the database stayed away past
            ``startup_timeout_s``.
    """

    def __init__(
        self,
        inner: ResultSink,
        spool: Spool,
        *,
        ledger: Ledger | None = None,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        startup_timeout_s: float = 300.0,
        batch_cases: int = 0,
        batch_age_s: float = 2.0,
        settle_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        log: Callable[[str], None] | None = None,
    ):
        self.inner = inner
        self.spool = spool
        self.ledger = ledger
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.startup_timeout_s = startup_timeout_s
        self._clock = clock
        self._sleep = sleep
        self._log = log or (lambda line: logging.getLogger("attnfuzz.spool").warning("%s", line))
        self._delay_s = 0.0
        self._next_try = 0.0
        self.outages = 0  # times the database went away
        self.spooled = 0  # writes that went through the spool
        self.flushed = 0  # spooled writes later stored
        self.taken_over_worker_id: int | None = None
        self.batch_cases = batch_cases if hasattr(inner, "record_batch") else 0
        self.batch_age_s = batch_age_s
        self._batched_since: float | None = None  # when the oldest write batched in the spool was
        self.batched = 0  # case writes that went through the spool as batches
        self.settle_s = settle_s
        self._answered: dict[tuple[str, str, str], float] = {}  # bucket key -> when a direct write last answered for it

    # ------------------------------------------------------------------ backoff
    def _unavailable(self, exc: Exception) -> None:
        if self._delay_s == 0.0:
            self.outages += 1
            self._log(f"database unavailable ({exc}); spooling to {self.spool.path}")
        self._delay_s = min(max(self._delay_s * 2, self.backoff_initial_s), self.backoff_max_s)
        self._next_try = self._clock() + self._delay_s * random.uniform(0.8, 1.2)

    def _available(self) -> None:
        if self._delay_s:
            self._log(f"database back; {len(self.spool)} spooled writes left")
        self._delay_s = 0.0

    def _due(self) -> bool:
        return self._clock() >= self._next_try

    @property
    def pending(self) -> int:
        """Writes in the spool, not yet in the database."""
        return len(self.spool)

    # ------------------------------------------------------------------ applying writes
    def _apply(self, op: str, payload: dict[str, Any]) -> Any:
        if op == "record_case":
            return self.inner.record_case(payload["case_json"], payload["origin"])
        if op == "record_result":
            return self.inner.record_result(
                CaseResult.from_json(payload["result"]), payload["build_id"], payload["worker_id"]
            )
        if op == "record_case_results":
            results = [CaseResult.from_json(r) for r in payload["results"]]
            return self._record_case_results(
                payload["case_json"], payload["origin"], results, payload["build_id"], payload["worker_id"]
            )
        if op == "record_minimised":
            extra = {}  # entries spooled before attach/worker_id/lease existed have none of them
            if payload.get("worker_id") is not None or payload.get("attach"):
                extra = {"worker_id": payload.get("worker_id"), "attach": [tuple(a) for a in payload.get("attach", [])]}
            if payload.get("lease") is not None:  # fenced: refused (set aside, LeaseLostError) once another worker took it
                extra["lease"] = payload["lease"]
            return self.inner.record_minimised(
                payload["bucket_id"], payload["minimised_case_json"], payload["original_case_id"], payload["note"], **extra
            )
        if op == "release_minimisation":
            return self.inner.release_minimisation(payload["bucket_id"], payload["worker_id"], payload["outcome"])
        if op == "heartbeat":
            figures = {k: payload[k] for k in HEARTBEAT_FIGURES if payload.get(k) is not None}  # none in older entries
            return self.inner.heartbeat(payload["worker_id"], payload["cases_run"], payload["status"], **figures)
        raise SpoolError(f"op: unknown value {op!r}")

    def flush(self) -> bool:
        """Write spooled entries, oldest first, until the spool is empty or the database fails.

        Returns:
            True when the spool is empty.

        Raises:
            SinkFatalError: the database refuses writes (the entry stays spooled).
        """
        while True:
            batch = self.spool.entries(limit=max(100, self.batch_cases))
            if not batch:
                self._batched_since = None
                self._available()
                return True
            if self.batch_cases:
                stored = self._flush_batched(batch)
                if stored is None:
                    return False
                if stored:
                    continue
            for seq, op, payload in batch:
                try:
                    self._apply(op, payload)
                except SinkUnavailableError as exc:
                    self._unavailable(exc)
                    return False
                except AttnFuzzError as exc:
                    if _is_fatal(exc):
                        raise
                    # the database answered and refuses this one entry (e.g. its worker row is gone)
                    self.spool.reject(seq, f"{type(exc).__name__}: {exc}")
                    self._log(f"spooled {op} #{seq} rejected by the database and set aside: {exc}")
                    continue
                self.spool.remove(seq)
                self.flushed += 1

    def _flush_batched(self, batch: list[tuple[int, str, dict[str, Any]]]) -> int | None:
        """Write the case writes at the start of ``batch`` with one ``inner.record_batch``; how
        many were stored (0: ``batch`` does not start with one, or the database refuses the run:
        then they go one by one, so that only the refused entry is set aside), None when the
        database is away.

        Raises:
            SinkFatalError: the database refuses writes (the entries stay spooled).
        """
        run = []
        for seq, op, payload in batch:
            if op != "record_case_results":
                break
            run.append((seq, payload))
        if not run:
            return 0
        try:
            self.inner.record_batch([payload for _, payload in run])  # type: ignore[attr-defined]
        except SinkUnavailableError as exc:
            self._unavailable(exc)
            return None
        except AttnFuzzError as exc:
            if _is_fatal(exc):
                raise
            return 0
        self.spool.remove_many([seq for seq, _ in run])
        self.flushed += len(run)
        return len(run)

    def _batchable(self, results: list[CaseResult]) -> bool:
        """No failure among ``results``, or each failure's bucket answered within ``settle_s``."""
        now = self._clock()
        return all(
            r.bucket_key is None or now - self._answered.get(r.bucket_key, -float("inf")) < self.settle_s for r in results
        )

    def _append_batched(self, op: str, payload: dict[str, Any]) -> None:
        """Append a case write to the spool as part of a batch (`SpoolFullError`: not spooled)."""
        self.spool.append(op, payload)
        self.spooled += 1
        self.batched += 1
        if self._batched_since is None:
            self._batched_since = self._clock()

    def _flush_if_batch_due(self) -> None:
        """Flush when the batch is full or its oldest write ``batch_age_s`` old (and the database
        is not known to be away).

        Raises:
            SinkFatalError: the database refuses writes (everything stays spooled).
        """
        full = len(self.spool) >= self.batch_cases
        old = self._batched_since is not None and self._clock() - self._batched_since >= self.batch_age_s
        if (full or old) and self._due():
            self.flush()

    def _write(self, op: str, payload: dict[str, Any]) -> tuple[bool, Any]:
        """Write now if nothing is spooled and the database is not known to be away, else spool.
        Returns ``(written, value)``."""
        if len(self.spool) and self._due():
            try:
                self.flush()
            except SinkFatalError:
                # the database refuses an older entry: this write waits behind it, kept (a final
                # "failed" heartbeat included, so the worker row ends failed, not lost)
                self.spool.append(op, payload)
                self.spooled += 1
                raise
        if not len(self.spool) and self._due():
            try:
                value = self._apply(op, payload)
            except SinkUnavailableError as exc:
                self._unavailable(exc)
            except SinkFatalError:
                self.spool.append(op, payload)  # kept for a later run; the worker stops
                self.spooled += 1
                raise
            else:
                self._available()
                return True, value
        self.spool.append(op, payload)
        self.spooled += 1
        return False, None

    @property
    def _what(self) -> str:
        """What ``inner`` writes to, for messages: ``inner.target`` ("the service" for
        `fuzzer.http_sink.HttpSink`), else "the database"."""
        target = getattr(self.inner, "target", None)
        return target if isinstance(target, str) and target else "the database"

    def _retry_until_available(self, what: str, fn: Callable[[], Any]) -> Any:
        deadline = self._clock() + self.startup_timeout_s
        delay = self.backoff_initial_s
        while True:
            try:
                value = fn()
            except SinkUnavailableError as exc:
                if self._clock() + delay > deadline:
                    raise SinkStayedUnavailableError(
                        f"{what}: {self._what} stayed unavailable for {self.startup_timeout_s:g} s: {exc}"
                    ) from exc
                self._log(f"{what}: {self._what.removeprefix('the ')} unavailable ({exc}); retrying in {delay:.1f} s")
                self._sleep(delay)  # backoff before the next attempt, not a synchronisation
                delay = min(delay * 2, self.backoff_max_s)
            else:
                return value

    # ------------------------------------------------------------------ ResultSink
    def register_build(self, fingerprint: BuildFingerprint) -> int:
        return self._retry_until_available("register_build", lambda: self.inner.register_build(fingerprint))

    def register_worker(self, build_id: int, hostname: str, pid: int, device: str, slot: str | None = None) -> int:
        """Register the worker under this spool's slot, then take the slot over: flush what a
        previous worker left, and mark that worker lost (ending its leases)."""
        slot = self.spool.slot if slot is None else slot
        worker_id = self._retry_until_available(
            "register_worker", lambda: self.inner.register_worker(build_id, hostname, pid, device, slot)
        )
        previous = self.spool.meta("worker_id")
        self._retry_until_available("flush", lambda: self.flush() or self._raise_unavailable())
        if previous is not None and int(previous) != worker_id:
            known = self._retry_until_available("mark_worker_lost", lambda: self.inner.mark_worker_lost(int(previous)))
            if known and self.spool.meta("stopped_worker_id") == previous:
                # it said it stopped (its final heartbeat): nothing was taken over, nothing to warn of
                self.taken_over_worker_id = None
            elif known:
                self.taken_over_worker_id = int(previous)
                self._log(f"{self.spool.slot} was last used by worker {previous}: its spool is flushed, its leases ended")
            else:  # the slot outlived its database (deleted and created again at the same path)
                self._log(f"{self.spool.slot} was last used by worker {previous}, which this database does not know")
        self.spool.set_meta("worker_id", str(worker_id))
        return worker_id

    def _raise_unavailable(self) -> None:
        self._next_try = 0.0
        raise SinkUnavailableError(f"{len(self.spool)} spooled writes not yet flushed")

    def heartbeat(
        self, worker_id: int, cases_run: int, status: str = "running", *, evaluations: int | None = None,
        known_hits: int | None = None,
    ) -> None:
        """A ``running`` heartbeat while the database is away is dropped; a final one is spooled."""
        payload = {"worker_id": worker_id, "cases_run": cases_run, "status": status}
        figures = {k: v for k, v in (("evaluations", evaluations), ("known_hits", known_hits)) if v is not None}
        payload.update(figures)
        if status != "running":
            self._write("heartbeat", payload)
            if status == "stopped":  # a clean end: the next worker of this slot takes nothing over
                self.spool.set_meta("stopped_worker_id", str(worker_id))
            return
        if not self._due() or (len(self.spool) and not self.flush()):
            return
        try:
            self.inner.heartbeat(worker_id, cases_run, status, **figures)
        except SinkUnavailableError as exc:
            self._unavailable(exc)

    def record_case(self, case_json: dict[str, Any], origin: str) -> str:
        from oracle.config import AttentionCase

        case_id = AttentionCase.from_json(case_json).case_id  # bad input is refused here, never spooled
        self._write("record_case", {"case_json": case_json, "origin": origin})
        return case_id

    def record_result(self, result: CaseResult, build_id: int, worker_id: int | None) -> BucketUpdate | None:
        """Store or spool ``result``; the `BucketUpdate` when stored now, None when spooled."""
        with self._reported():
            try:
                written, value = self._write(
                    "record_result", {"result": result.to_json(), "build_id": build_id, "worker_id": worker_id}
                )
            except SinkFatalError:  # kept in the spool for a later run: reported as spooled, then the stop
                self._ledger_results([result], build_id, worker_id, written=False)
                raise
            self._ledger_results([result], build_id, worker_id, written=written)
        return value

    def _reported(self) -> Any:
        """With a ledger, hold a stop signal over a write and its ledger lines
        (`fuzzer.results.stops_deferred`): a Ctrl-C or SIGTERM raised between the commit and the
        line would leave a result stored and never reported; without one, nothing."""
        return stops_deferred() if self.ledger is not None else contextlib.nullcontext()

    def _ledger_results(self, results: list[CaseResult], build_id: int, worker_id: int | None, *, written: bool) -> None:
        """One ``result`` line per result in the ledger (if any): ``written`` False for a result
        kept in the spool, also when the write that spooled it then stops the worker (a database
        that refuses writes): a later run flushes it, and the ledger must already name it."""
        if self.ledger is None:
            return
        for result in results:
            self.ledger.write(
                "result",
                case_id=result.case_id,
                build_id=build_id,
                backend=result.backend,
                variant=result.variant,
                phase=result.phase,
                status=result.status,
                signature=result.signature,
                worker_id=worker_id,
                written=written,
            )

    def record_case_results(
        self, case_json: dict[str, Any], origin: str, results: list[CaseResult], build_id: int, worker_id: int | None
    ) -> list[BucketUpdate | None]:
        """Store or spool the case with all its results as one entry (one transaction when
        written); the `BucketUpdate` answers when stored now, all None when spooled."""
        from oracle.config import AttentionCase

        AttentionCase.from_json(case_json)  # bad input is refused here, never spooled

        def payload() -> dict[str, Any]:  # built only when the write is spooled
            return {
                "case_json": case_json,
                "origin": origin,
                "results": [r.to_json() for r in results],
                "build_id": build_id,
                "worker_id": worker_id,
            }

        with self._reported():
            if self.batch_cases and self._batchable(results):
                self._append_batched("record_case_results", payload())
                self._ledger_results(results, build_id, worker_id, written=False)  # in the spool now
                self._flush_if_batch_due()
                return [None] * len(results)
            try:
                if not len(self.spool) and self._due():  # the usual case: straight to the database
                    try:
                        value = self._record_case_results(case_json, origin, results, build_id, worker_id)
                    except SinkUnavailableError as exc:
                        self._unavailable(exc)
                        written, value = self._write("record_case_results", payload())  # spooled: not due now
                    except SinkFatalError:
                        self.spool.append("record_case_results", payload())  # kept for a later run; the worker stops
                        self.spooled += 1
                        raise
                    else:
                        self._available()
                        written = True
                else:
                    written, value = self._write("record_case_results", payload())
                if written and self.batch_cases:
                    now = self._clock()
                    for r, update in zip(results, value):
                        if update is not None and r.bucket_key is not None:
                            self._answered[r.bucket_key] = now
            except SinkFatalError:  # spooled for a later run: reported as such before the worker stops
                self._ledger_results(results, build_id, worker_id, written=False)
                raise
            self._ledger_results(results, build_id, worker_id, written=written)
        return list(value) if written else [None] * len(results)

    def _record_case_results(
        self, case_json: dict[str, Any], origin: str, results: list[CaseResult], build_id: int, worker_id: int | None
    ) -> list[BucketUpdate | None]:
        record_all = getattr(self.inner, "record_case_results", None)
        if record_all is not None:
            return record_all(case_json, origin, results, build_id, worker_id)
        self.inner.record_case(case_json, origin)
        return [self.inner.record_result(r, build_id, worker_id) for r in results]

    def record_minimised(
        self,
        bucket_id: int,
        minimised_case_json: dict[str, Any],
        original_case_id: str,
        note: str,
        *,
        worker_id: int | None = None,
        attach: Any = (),
        lease: int | None = None,
    ) -> Any:
        """Store or spool it; the attached bucket ids when stored now, None when spooled.

        Raises:
            LeaseLostError: stored now and refused by its fence (``lease``); nothing is spooled.
        """
        payload = {
            "bucket_id": bucket_id,
            "minimised_case_json": minimised_case_json,
            "original_case_id": original_case_id,
            "note": note,
            "worker_id": worker_id,
            "attach": [list(a) for a in attach],
        }
        if lease is not None:
            payload["lease"] = lease
        written, value = self._write("record_minimised", payload)
        if self.ledger is not None:
            self.ledger.write("minimised", bucket_id=bucket_id, case_id=original_case_id)
        return value

    def release_minimisation(self, bucket_id: int, worker_id: int, outcome: str) -> None:
        self._write("release_minimisation", {"bucket_id": bucket_id, "worker_id": worker_id, "outcome": outcome})
        if self.ledger is not None:
            self.ledger.write("released", bucket_id=bucket_id, worker_id=worker_id, outcome=outcome)

    def _read(self, fn: Callable[[], Any], default: Any) -> Any:
        if not self._due() or (len(self.spool) and not self.flush()):
            return default  # away, or it does not have everything yet: do not steer by it
        try:
            value = fn()
        except SinkUnavailableError as exc:
            self._unavailable(exc)
            return default
        self._available()
        return value

    def known_bucket_keys(self) -> set[tuple[str, str, str]]:
        return self._read(self.inner.known_bucket_keys, set())

    def known_failures(self, backends: list[str]) -> list[tuple[tuple[str, str, str], dict[str, Any]]]:
        return self._read(lambda: self.inner.known_failures(backends), [])

    def claim_minimisation(
        self, worker_id: int, backends: list[str], lease_s: float, max_attempts: int = 3
    ) -> MinimiseClaim | None:
        claim = self._read(lambda: self.inner.claim_minimisation(worker_id, backends, lease_s, max_attempts), None)
        if claim is not None and self.ledger is not None:
            self.ledger.write("claim", bucket_id=claim.bucket_id, worker_id=worker_id, lease_s=lease_s)
        return claim

    def renew_minimisation(self, bucket_id: int, worker_id: int, lease_s: float) -> bool:
        """True while the database is away (the lease may run out; the work stays valid)."""
        return self._read(lambda: self.inner.renew_minimisation(bucket_id, worker_id, lease_s), True)

    def mark_worker_lost(self, worker_id: int) -> bool:
        return self._retry_until_available("mark_worker_lost", lambda: self.inner.mark_worker_lost(worker_id))

    def close(self) -> int:
        """Try a last flush; the number of writes left in the spool (kept for the next worker)."""
        try:
            self._next_try = 0.0
            self.flush()
        except AttnFuzzError as exc:  # reported by the caller through `pending`
            self._log(f"last flush failed: {exc}")
        return len(self.spool)


def _is_fatal(exc: BaseException) -> bool:
    return isinstance(exc, (SinkFatalError, SpoolError))


class TolerantExampleDatabase(ExampleDatabase):
    """Hypothesis's example database, minus outages: while ``inner`` is unavailable, ``fetch``
    finds nothing and writes are dropped. It is a cache (`fuzzer.minimise` and generation work
    without it); results never go through it.

    Raises:
        SinkFatalError: (from writes) the database refuses writes.
    """

    def __init__(self, inner: ExampleDatabase):
        super().__init__()
        self.inner = inner
        self.dropped = 0

    def __repr__(self) -> str:
        return f"TolerantExampleDatabase({self.inner!r})"

    def save(self, key: bytes, value: bytes) -> None:
        try:
            self.inner.save(key, value)
        except SinkUnavailableError:
            self.dropped += 1

    def fetch(self, key: bytes) -> Iterable[bytes]:
        try:
            values = list(self.inner.fetch(key))
        except SinkUnavailableError:
            values = []
        yield from values

    def delete(self, key: bytes, value: bytes) -> None:
        try:
            self.inner.delete(key, value)
        except SinkUnavailableError:
            self.dropped += 1

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        try:
            self.inner.move(src, dest, value)
        except SinkUnavailableError:
            self.dropped += 1

    def _start_listening(self) -> None:
        pass

    def _stop_listening(self) -> None:
        pass
