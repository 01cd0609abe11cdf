"""Chaos soak: fuzz workers against PostgreSQL and SQLite while they are killed and the databases
are restarted and locked; then check that nothing was lost and nothing stored twice.

    python benchmarks/chaos/soak.py --duration-s 1800 --out /tmp/attnfuzz-soak

What runs (all on this machine, loopback only):

* a private PostgreSQL server (``tests/reliability/pgcluster.py``: own data directory and port)
  and a SQLite file;
* ``--pg-workers`` + ``--sqlite-workers`` worker processes (``python -m service.cli.main fuzz``) on
  torch-cpu-math, torch-cpu-flash, a crashing stand-in (a real SIGSEGV on one case in 16) and a
  stand-in with planted bugs (buckets to shrink, so minimisation leases are contended), each with a ledger (every result it handed to storage, written or spooled), restarted when they
  end (each run has a random time budget, so clean stops happen too);
* a chaos loop that, every ``--fault-every-s`` seconds on average, does one of: SIGKILL a random
  worker (restarted a few seconds later), stop PostgreSQL (``fast`` or ``immediate``) for 3-20 s,
  hold an exclusive lock on the SQLite file for 3-20 s.

At the end the workers finish, one drain worker per spool slot stores what killed workers left
(``--max-cases 0``: redo the interrupted case, flush the spool), and the check reports, per
database: cases and results stored, faults injected, **losses** (ledger results missing from the
database), **duplicates** (result keys stored more than once; buckets of one key), buckets whose
``hit_count`` differs from their results (a retried write counted twice), writes still spooled,
leases still held, and minimisation claims that overlapped (two live workers on one bucket).
Exit status 0 only when losses, duplicates and all of those are 0. ``summary.json`` in ``--out``
has every figure.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sqlalchemy import create_engine, text  # noqa: E402

from tests.reliability.pgcluster import PrivatePostgres  # noqa: E402

BACKENDS = [
    "torch-cpu-math",
    "torch-cpu-flash",
    "tests.fuzzer.standins:SometimesCrashingBackend",  # a real SIGSEGV on one case in 16
    "tests.fuzzer.standins:GateBackend",  # planted bugs: buckets to shrink, so leases are contended
    "tests.reliability.hostile:HostileTextBackend",  # a name of 80 chars, NUL and lone surrogates in its errors
]

# Poison corpus files (issue 17): each must be refused by ``corpus import`` with exit 2, nothing stored.
_SMALL_CASE = {"schema_version": 1, "batch_size": 1, "seqlen_q": 4, "seqlen_k": 4, "num_heads": 1, "head_dim": 8,
               "dtype": "float32"}


def _poison_entry(case: dict | None = None, **changes: object) -> dict:
    entry = {"schema_version": 1, "case": {**_SMALL_CASE, **(case or {})}, "backend": "torch-cpu-math",
             "variant": "bool_mask", "why": "soak poison", "source": "",
             "expected": {"status": "fail", "signature": "out:all_zero"},
             "verdicts": [{"build": {"torch": "soak-poison"}, "status": "fail", "signature": "out:all_zero",
                           "recorded_at": "2026-12-01T00:00:00+00:00"}]}
    entry.update(changes)
    return entry


POISON_FILES = {
    "window 10**40": lambda: json.dumps(_poison_entry({"window_size_left": 10**40})),
    "batch_size 10**6": lambda: json.dumps(_poison_entry({"batch_size": 10**6})),
    "huge oracle working set": lambda: json.dumps(_poison_entry({"batch_size": 60000, "seqlen_q": 2**20, "seqlen_k": 2**20})),
    "deep nesting": lambda: "[" * 100_000 + "]" * 100_000,
    "not UTF-8": lambda: b'{"why": "\xff\xfe"}',
    "verdicts 5": lambda: json.dumps(_poison_entry(verdicts=5)),
    "NUL in a verdict": lambda: json.dumps(_poison_entry(verdicts=[{**_poison_entry()["verdicts"][0], "recorded_at": "x\x00"}])),
    "package name of 200 chars": lambda: json.dumps(_poison_entry(
        verdicts=[{**_poison_entry()["verdicts"][0], "packages": {"p" * 200: "1"}}])),
    "FIFO": None,
}


@dataclass
class Slot:
    """One worker position: restarted whenever its process ends, until the soak stops."""

    name: str
    database: str  # "postgresql" or "sqlite"
    url: str
    process: subprocess.Popen | None = None
    runs: int = 0
    log: object = None
    exits: list = field(default_factory=list)  # (pid, exit time, returncode)


class Soak:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "logs").mkdir(exist_ok=True)
        (self.out / "ledgers").mkdir(exist_ok=True)
        self.rng = random.Random(args.seed)
        self.faults: Counter = Counter()
        self.fault_log: list[dict] = []
        self.pg = PrivatePostgres(self.out / "pg")
        self.pg.start()
        self.pg_url = self.pg.url
        self.sqlite_path = self.out / "soak.db"
        self.sqlite_url = f"sqlite:///{self.sqlite_path}"
        self.slots = [Slot(f"pg{i}", "postgresql", self.pg_url) for i in range(args.pg_workers)] + [
            Slot(f"sqlite{i}", "sqlite", self.sqlite_url) for i in range(args.sqlite_workers)
        ]
        # a SQLite database whose directory the chaos loop removes (rm -rf) under a running worker
        self.vanish_dir = self.out / "vanish" / "db"
        self.vanish_url = f"sqlite:///{self.vanish_dir / 'soak.db'}"
        self.vanish_slot = Slot("vanish0", "vanish", self.vanish_url) if args.vanish_worker else None
        if self.vanish_slot is not None:
            self.slots.append(self.vanish_slot)
        self.vanished_pids: set[int] = set()  # workers whose database directory was removed under them
        self.vanish_exits: Counter = Counter()  # "loud (exit N)" / "silent (exit 0)"
        self.poison_exits: Counter = Counter()
        self.migration_exits: Counter = Counter()
        self.poison_case_ids: set[str] = set()
        self.deaths: dict[int, float] = {}  # pid -> time it ended (killed or exited)
        self.pg_down_until = 0.0
        self.sqlite_lock: sqlite3.Connection | None = None
        self.sqlite_lock_until = 0.0

    # ------------------------------------------------------------------ workers
    def _command(self, slot: Slot, budget_s: float | None, drain: bool = False) -> list[str]:
        ledger = self.out / "ledgers" / f"{slot.name}-{slot.runs}{'-drain' if drain else ''}.jsonl"
        command = [sys.executable, "-m", "service.cli.main", "fuzz", "--db", slot.url, "--quiet",
                   "--isolation", "process", "--spool-dir", str(self.out / "spool"), "--ledger", str(ledger),
                   "--max-seqlen", "48", "--case-timeout", "30", "--shrink-deadline", "30",
                   "--heartbeat", "2", "--db-wait", "600", "--db-timeout", "2" if slot.database == "sqlite" else "5"]
        for backend in BACKENDS:
            command += ["--backend", backend]
        if drain:
            command += ["--max-cases", "0", "--no-shrink", "--no-replay"]
        else:
            command += ["--time-budget", f"{budget_s:.0f}"]
        return command

    def start(self, slot: Slot, drain: bool = False) -> None:
        if slot.database == "vanish" and not (self.vanish_dir / "soak.db").exists():
            from service.db import migrations
            self.vanish_dir.mkdir(parents=True, exist_ok=True)  # a new, empty database in its place
            migrations.upgrade(self.vanish_url)
        budget = self.rng.uniform(self.args.min_run_s, self.args.max_run_s)
        slot.runs += 1
        log = open(self.out / "logs" / f"{slot.name}-{slot.runs}{'-drain' if drain else ''}.log", "w")
        slot.process = subprocess.Popen(self._command(slot, budget, drain), cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        slot.log = log

    def reap(self) -> None:
        for slot in self.slots:
            if slot.process is not None and slot.process.poll() is not None:
                self.deaths[slot.process.pid] = time.time()
                slot.exits.append((slot.process.pid, time.time(), slot.process.returncode))
                if slot.process.pid in self.vanished_pids and slot.process.returncode != -signal.SIGKILL:
                    code = slot.process.returncode
                    self.vanish_exits["silent (exit 0)" if code == 0 else f"loud (exit {code})"] += 1
                slot.log.close()
                slot.process = None

    def kill(self, slot: Slot) -> None:
        if slot.process is None or slot.process.poll() is not None:
            return
        slot.process.send_signal(signal.SIGKILL)
        slot.process.wait(timeout=30)
        self.faults["worker SIGKILL"] += 1
        self.fault_log.append({"t": time.time(), "fault": "kill", "slot": slot.name, "pid": slot.process.pid})
        self.reap()

    # ------------------------------------------------------------------ database faults
    def restart_postgres(self) -> None:
        mode = self.rng.choice(["fast", "immediate"])
        self.pg.stop(mode)
        self.faults[f"PostgreSQL stop ({mode})"] += 1
        down = self.rng.uniform(3, 20)
        self.fault_log.append({"t": time.time(), "fault": f"pg-stop-{mode}", "down_s": down})
        self.pg_down_until = time.monotonic() + down

    def lock_sqlite(self) -> None:
        self.sqlite_lock = sqlite3.connect(self.sqlite_path, timeout=60, isolation_level=None)
        self.sqlite_lock.execute("BEGIN EXCLUSIVE")
        hold = self.rng.uniform(3, 20)
        self.faults["SQLite exclusive lock"] += 1
        self.fault_log.append({"t": time.time(), "fault": "sqlite-lock", "hold_s": hold})
        self.sqlite_lock_until = time.monotonic() + hold

    def vanish_database(self) -> None:
        """``rm -rf`` the directory of the vanish worker's SQLite database while it runs: the
        worker must notice and stop non-zero (its spool keeps what it could not store)."""
        slot = self.vanish_slot
        if slot is None or slot.process is None or slot.process.poll() is not None:
            return
        import shutil

        shutil.rmtree(self.vanish_dir, ignore_errors=True)
        self.vanished_pids.add(slot.process.pid)
        self.faults["SQLite database directory removed (rm -rf)"] += 1
        self.fault_log.append({"t": time.time(), "fault": "vanish", "pid": slot.process.pid})

    def poison_corpus(self) -> None:
        """``corpus import`` of one poison file into a live database: exit 2, nothing stored."""
        kind = self.rng.choice(sorted(POISON_FILES))
        root = self.out / "poison" / f"{len(self.fault_log)}" / "torch-cpu-math"
        root.mkdir(parents=True)
        path = root / "bool_mask-poison.json"
        if POISON_FILES[kind] is None:
            import os

            os.mkfifo(path)
        else:
            content = POISON_FILES[kind]()
            path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
        url = self.sqlite_url if self.pg_down_until or self.rng.random() < 0.5 else self.pg_url
        run = subprocess.run([sys.executable, "-m", "service.cli.main", "corpus", "import", str(root.parent), "--db", url],
                             cwd=REPO, capture_output=True, text=True, timeout=300)
        self.poison_exits[f"exit {run.returncode}"] += 1
        self.faults[f"poison corpus file ({kind})"] += 1
        self.fault_log.append({"t": time.time(), "fault": "poison-corpus", "kind": kind, "exit": run.returncode,
                               "output": run.stdout[-300:] + run.stderr[-300:]})

    def concurrent_first_migrations(self) -> None:
        """A fresh PostgreSQL database migrated by 4 ``db upgrade`` at once: all must exit 0."""
        if self.pg_down_until:
            return
        name = f"fresh{len(self.fault_log)}"
        admin = create_engine(self.pg_url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as c:
                c.execute(text(f'CREATE DATABASE "{name}"'))
        finally:
            admin.dispose()
        url = self.pg_url.rsplit("/", 1)[0] + f"/{name}"
        runs = [subprocess.Popen([sys.executable, "-m", "service.cli.main", "db", "upgrade", "--db", url], cwd=REPO,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(4)]
        codes = [run.wait(timeout=300) for run in runs]
        outputs = [run.stdout.read()[-300:] for run in runs]
        for code in codes:
            self.migration_exits[f"exit {code}"] += 1
        self.faults["4 concurrent first migrations (PostgreSQL)"] += 1
        self.fault_log.append({"t": time.time(), "fault": "concurrent-migrations", "exits": codes,
                               "outputs": [o for o, c in zip(outputs, codes) if c != 0]})

    def heal(self, now: float) -> None:
        if self.pg_down_until and now >= self.pg_down_until:
            self.pg.start()
            self.pg_down_until = 0.0
        if self.sqlite_lock is not None and now >= self.sqlite_lock_until:
            self.sqlite_lock.execute("COMMIT")
            self.sqlite_lock.close()
            self.sqlite_lock = None

    # ------------------------------------------------------------------ run
    def run(self) -> dict:
        from service.db import migrations
        migrations.upgrade(self.pg_url)
        migrations.upgrade(self.sqlite_url)
        started = time.monotonic()
        end = started + self.args.duration_s
        next_fault = started + self.rng.expovariate(1 / self.args.fault_every_s)
        restart_at: dict[str, float] = {}
        while time.monotonic() < end:
            now = time.monotonic()
            self.heal(now)
            self.reap()
            for slot in self.slots:
                if slot.process is None and now >= restart_at.get(slot.name, 0.0):
                    self.start(slot)
            if now >= next_fault:
                choice = self.rng.random()
                alive = [s for s in self.slots if s.process is not None]
                if choice < 0.35 and alive:
                    victim = self.rng.choice(alive)
                    self.kill(victim)
                    restart_at[victim.name] = now + self.rng.uniform(0, 5)
                elif choice < 0.5 and not self.pg_down_until:
                    self.restart_postgres()
                elif choice < 0.65 and self.sqlite_lock is None:
                    self.lock_sqlite()
                elif choice < 0.75 and self.vanish_slot is not None:
                    self.vanish_database()
                elif choice < 0.9:
                    self.poison_corpus()
                else:
                    self.concurrent_first_migrations()
                next_fault = now + self.rng.expovariate(1 / self.args.fault_every_s)
            time.sleep(0.2)  # the chaos loop's tick
        # stop faults, let the databases come back, let running workers finish their budgets
        self.pg_down_until = min(self.pg_down_until, time.monotonic()) if self.pg_down_until else 0.0
        self.sqlite_lock_until = 0.0
        self.heal(time.monotonic() + 1e9)
        for slot in self.slots:
            if slot.process is not None:
                slot.process.wait(timeout=self.args.max_run_s + 600)
        self.reap()
        self.drain()
        elapsed = time.monotonic() - started
        return self.check(elapsed)

    def drain(self) -> None:
        """One drain worker per spool slot of each database, all at once (each takes a slot).
        The vanish database is not drained: what its spool holds belongs to a removed database."""
        for database, url in (("postgresql", self.pg_url), ("sqlite", self.sqlite_url)):
            from fuzzer.spool import database_key

            group = self.out / "spool" / database_key(url)
            slots = len(list(group.glob("slot-*"))) if group.exists() else 0
            drains = [Slot(f"drain-{database}{i}", database, url) for i in range(slots)]
            for slot in drains:
                self.start(slot, drain=True)
            for slot in drains:
                code = slot.process.wait(timeout=600)
                slot.log.close()
                if code != 0:
                    raise SystemExit(f"drain worker {slot.name} exited with {code}; see {self.out / 'logs'}")

    # ------------------------------------------------------------------ check
    def _ledger(self) -> tuple[dict[str, set], dict[str, int], list[dict]]:
        keys: dict[str, set] = defaultdict(set)
        reported: dict[str, int] = Counter()
        claims = []
        for path in sorted((self.out / "ledgers").glob("*.jsonl")):
            if path.name.startswith("vanish"):  # its database is removed on purpose: checked by exit codes
                continue
            database = "postgresql" if path.name.startswith(("pg", "drain-postgresql")) else "sqlite"
            for line in path.read_text().splitlines():
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:  # a line cut by SIGKILL mid-write: that result was not reported
                    continue
                if event["event"] == "result":
                    keys[database].add(
                        (event["case_id"], event["build_id"], event["backend"], event["variant"], event["phase"])
                    )
                    reported[database] += 1
                elif event["event"] in ("claim", "minimised", "released"):
                    claims.append({**event, "database": database})
        return keys, reported, claims

    def _overlapping_claims(self, claims: list[dict], database: str) -> int:
        """Claims of one bucket whose holders were alive and working at the same time."""
        by_bucket = defaultdict(list)
        for event in claims:
            if event["database"] == database:
                by_bucket[event["bucket_id"]].append(event)
        overlaps = 0
        for events in by_bucket.values():
            events.sort(key=lambda e: e["t"])
            held: dict[int, float] = {}  # pid -> claim time
            for event in events:
                for pid in [p for p in held if self.deaths.get(p, float("inf")) <= event["t"]]:
                    del held[pid]
                if event["event"] == "claim":
                    if held:
                        overlaps += 1
                    held[event["pid"]] = event["t"]
                else:
                    held.pop(event["pid"], None)
        return overlaps

    def check(self, elapsed_s: float) -> dict:
        ledger_keys, reported, claims = self._ledger()
        summary = {"duration_s": round(elapsed_s), "faults": dict(self.faults), "databases": {}}
        for database, url in (("postgresql", self.pg_url), ("sqlite", self.sqlite_url)):
            engine = create_engine(url.replace("postgresql+psycopg", "postgresql+psycopg"))
            with engine.connect() as c:
                stored = {tuple(r) for r in c.execute(text("SELECT case_id, build_id, backend, variant, phase FROM results"))}
                figures = {
                    "cases": c.scalar(text("SELECT COUNT(*) FROM cases")),
                    "cases_run (workers' counters)": c.scalar(text("SELECT COALESCE(SUM(cases_run), 0) FROM workers")),
                    "results stored": c.scalar(text("SELECT COUNT(*) FROM results")),
                    "results by status": dict(c.execute(text("SELECT status, COUNT(*) FROM results GROUP BY status")).all()),
                    "results reported in ledgers": reported[database],
                    "distinct result keys reported": len(ledger_keys[database]),
                    "losses": len(ledger_keys[database] - stored),
                    "duplicate result keys": c.scalar(text(
                        "SELECT COUNT(*) FROM (SELECT 1 FROM results GROUP BY case_id, build_id, backend, variant, phase"
                        " HAVING COUNT(*) > 1) d")),
                    "buckets": c.scalar(text("SELECT COUNT(*) FROM buckets")),
                    "duplicate buckets": c.scalar(text(
                        "SELECT COUNT(*) FROM (SELECT 1 FROM buckets GROUP BY backend, variant, signature"
                        " HAVING COUNT(*) > 1) d")),
                    "buckets whose hit_count differs from their results": c.scalar(text(
                        "SELECT COUNT(*) FROM buckets b WHERE b.hit_count != (SELECT COUNT(*) FROM results r"
                        " WHERE r.backend = b.backend AND r.variant = b.variant AND r.signature = b.signature)")),
                    "buckets minimised": c.scalar(text("SELECT COUNT(*) FROM buckets WHERE minimised_case_id IS NOT NULL")),
                    "leases still held": c.scalar(text("SELECT COUNT(*) FROM buckets WHERE minimise_owner_id IS NOT NULL")),
                    "workers": dict(c.execute(text("SELECT status, COUNT(*) FROM workers GROUP BY status")).all()),
                    "overlapping minimisation claims": self._overlapping_claims(claims, database),
                }
            engine.dispose()
            figures["writes left in spools"], figures["writes rejected by spools"] = self._spool_left(url)
            summary["databases"][database] = figures
        summary["ok"] = all(
            f["losses"] == 0 and f["duplicate result keys"] == 0 and f["duplicate buckets"] == 0
            and f["buckets whose hit_count differs from their results"] == 0 and f["writes left in spools"] == 0
            and f["writes rejected by spools"] == 0 and f["leases still held"] == 0
            and f["overlapping minimisation claims"] == 0
            for f in summary["databases"].values()
        )
        summary["worker runs"] = sum(s.runs for s in self.slots)
        summary["worker exit codes"] = dict(Counter(str(code) for s in self.slots for _, _, code in s.exits))
        killed = {e["pid"] for e in self.fault_log if e["fault"] == "kill"}
        summary["workers that died unintentionally"] = sum(
            1 for s in self.slots for pid, _, code in s.exits
            if code != 0 and pid not in killed and pid not in self.vanished_pids
        )
        summary["vanished database: worker exits after the removal"] = dict(self.vanish_exits)
        summary["poison corpus imports: exits"] = dict(self.poison_exits)
        summary["concurrent first migrations: exits"] = dict(self.migration_exits)
        with create_engine(self.pg_url).connect() as c:
            pg_poison = c.scalar(text("SELECT COUNT(*) FROM builds WHERE torch = 'soak-poison'"))
        with create_engine(self.sqlite_url).connect() as c:
            sqlite_poison = c.scalar(text("SELECT COUNT(*) FROM builds WHERE torch = 'soak-poison'"))
        summary["rows stored from poison files"] = pg_poison + sqlite_poison
        summary["ok"] = (
            summary["ok"]
            and summary["workers that died unintentionally"] == 0
            and self.vanish_exits.get("silent (exit 0)", 0) == 0
            and set(self.poison_exits) <= {"exit 2"}
            and set(self.migration_exits) <= {"exit 0"}
            and summary["rows stored from poison files"] == 0
        )
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        (self.out / "faults.json").write_text(json.dumps(self.fault_log, indent=1))
        return summary

    def _spool_left(self, url: str) -> tuple[int, int]:
        from fuzzer.spool import SPOOL_FILE, database_key

        left = rejected = 0
        for path in (self.out / "spool" / database_key(url)).glob(f"slot-*/{SPOOL_FILE}"):
            with sqlite3.connect(path) as db:
                left += db.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
                rejected += db.execute("SELECT COUNT(*) FROM rejected").fetchone()[0]
        return left, rejected

    def close(self) -> None:
        for slot in self.slots:
            if slot.process is not None and slot.process.poll() is None:
                slot.process.kill()
                slot.process.wait(timeout=30)
        if self.sqlite_lock is not None:
            self.sqlite_lock.close()
        if self.args.keep_postgres:
            return
        self.pg.stop("fast") if self.pg.is_running() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=1800.0, help="seconds of chaos (then drain and check)")
    parser.add_argument("--out", default="/tmp/attnfuzz-soak", help="working directory (logs, ledgers, spools, summary)")
    parser.add_argument("--pg-workers", type=int, default=2)
    parser.add_argument("--sqlite-workers", type=int, default=2)
    parser.add_argument("--fault-every-s", type=float, default=30.0, help="mean seconds between faults")
    parser.add_argument("--min-run-s", type=float, default=60.0, help="shortest worker time budget, seconds")
    parser.add_argument("--max-run-s", type=float, default=300.0, help="longest worker time budget, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep-postgres", action="store_true", help="leave the private server running")
    parser.add_argument("--vanish-worker", type=int, default=1, help="1: a worker on a SQLite database whose directory is removed")
    args = parser.parse_args()
    soak = Soak(args)
    try:
        summary = soak.run()
    finally:
        soak.close()
    print(json.dumps(summary, indent=2, default=str))
    sys.exit(0 if summary["ok"] else 1)


if __name__ == "__main__":
    main()
