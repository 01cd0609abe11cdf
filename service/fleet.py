"""A fleet of ``attnfuzz fuzz`` workers on a Ray cluster (``attnfuzz fleet up/status/down``).

One Ray actor per worker: ``num_gpus=1`` for a GPU campaign (so one per GPU of every node), or
``num_cpus=cpus_per_worker`` for a CPU one; ``scheduling_strategy="SPREAD"`` over the nodes.
Each actor runs one ``attnfuzz fuzz --workers 1`` process (`fuzz_command`) and keeps it: the
worker's own signal, spool and process handling stays as it is (``docs/reliability.md``):

* the worker takes the first free spool slot of its host, so an actor restarted on the host of
  one that died takes over its slot: it stores what the dead worker spooled, redoes its
  interrupted evaluation, marks it ``lost`` and ends its minimisation leases; on another host
  the leases expire (``--minimise-lease``) and any worker claims the bucket again;
* the fuzz process gets SIGTERM when its actor's process dies, however it dies
  (``PR_SET_PDEATHSIG``), and a scheduler's SIGTERM (Slurm preemption, Kubernetes eviction)
  sent to it directly: either way it flushes and stops within ``STOP_GRACE_S`` (20 s);
* a fuzz process that dies of a signal it was not sent by `FuzzActor.drain` (``kill -9``, the
  OOM killer) ends its actor (exit code `ACTOR_RESTART_EXIT`), and Ray restarts the actor
  (``max_restarts``), which starts a new fuzz process; an exit code (0 at the end of the
  budget, 2 for a bad option, 5 for an unreachable database, ...) is final and shown by
  ``fleet status``.

Actors are detached and named (namespace `namespace` of the campaign, names ``worker-<i>``), so
``fleet status`` and ``fleet down`` find them from any driver; ``down`` drains each (SIGTERM to
its fuzz process, which flushes and stops within 30 s) and then kills it without restart.

Where the workers store: `TARGET_OPTIONS` maps the ``fuzz`` option that names it (``--server``
for the service's URL, ``--db`` for a database) to the environment variable that carries its value
to the process (a URL with a password never appears on a command line); `target_option_for` picks
it from the target when none is given. The writer token passes with ``fleet up --env
ATTNFUZZ_WRITER_TOKEN``, so a fleet that writes through the service holds no database credentials.

Ray is imported only by the functions that need it (the ``fleet`` extra: ``pip install
'attnfuzz[fleet]'``); without it they raise `FleetError` saying so.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from oracle.errors import AttnFuzzError
from service.errors import FieldValidationError

log = logging.getLogger(__name__)

DEFAULT_TARGET_OPTION = "--db"
"""The ``fuzz`` option that tells a fleet's workers where to store (``fleet up --target-option``)
when the target is not an HTTP URL (`target_option_for`)."""
TARGET_OPTIONS: dict[str, str | None] = {"--db": "ATTNFUZZ_DATABASE_URL", "--server": "ATTNFUZZ_SERVER"}
"""``fuzz`` option -> the environment variable ``fuzz`` reads it from (None: passed on the command
line). An option not listed here is passed on the command line."""


def target_option_for(target: str | None) -> str:
    """The ``fuzz`` option a fleet's target goes by: ``--server`` for an ``http://`` or
    ``https://`` URL (the service: workers write over HTTP with the writer token and hold no
    database credentials), else `DEFAULT_TARGET_OPTION` (a database URL)."""
    if target is not None and target.strip().lower().startswith(("http://", "https://")):
        return "--server"
    return DEFAULT_TARGET_OPTION


NAMESPACE_PREFIX = "attnfuzz-fleet-"
ACTOR_PREFIX = "worker-"
ACTOR_RESTART_EXIT = 70
"""The exit code of an actor process whose fuzz process died of a signal: Ray restarts it."""
DRAIN_TIMEOUT_S = 30.0
"""How long `FuzzActor.drain` waits for the fuzz process after SIGTERM before SIGKILL."""
FINAL_STATES = ("done", "failed", "drained")


class FleetError(AttnFuzzError):
    """The fleet cannot be started, found or stopped: why (Ray missing, no cluster, no campaign)."""


def namespace(campaign: str) -> str:
    """The Ray namespace of ``campaign``'s actors."""
    return NAMESPACE_PREFIX + campaign


@dataclass
class FleetSpec:
    """What ``fleet up`` starts.

    Raises `FieldValidationError` naming the field for a bad value.

    Attributes:
        campaign: the campaign's name (letters, digits, ``-``, ``_``): its Ray namespace.
        workers: the number of actors (one ``fuzz`` process each).
        device: ``cuda`` (one GPU per actor), ``cpu``, or ``auto`` (`up` makes it ``cuda`` on a
            cluster with GPUs, else ``cpu``).
        cpus_per_worker: Ray's logical CPUs per actor (a CPU worker keeps about 1.2 cores busy).
        target_option / target: where the workers store (``--db`` and a URL); target None: the
            workers' own default (``$ATTNFUZZ_DATABASE_URL``, else ``attnfuzz.db`` in ``workdir``).
        ends_at: the campaign's end, seconds since the epoch (None: until ``fleet down``); each
            (re)started fuzz process gets the time left as ``--time-budget``.
        fuzz_args: further ``fuzz`` options; ``{worker}`` in them is the actor's index.
        env: environment variables set in every fuzz process (a writer token).
        workdir: the fuzz processes' working directory (plugins given as ``module:attr`` are
            imported from it); log_dir: where each actor writes ``worker-<i>.log``.
        max_restarts: how often Ray restarts an actor whose process died (-1: without bound).
    """

    campaign: str
    workers: int
    device: str = "cpu"
    cpus_per_worker: float = 1.0
    target_option: str = DEFAULT_TARGET_OPTION
    target: str | None = None
    ends_at: float | None = None
    fuzz_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "."
    log_dir: str = "."
    max_restarts: int = -1

    def __post_init__(self) -> None:
        if not self.campaign or not all(c.isalnum() or c in "-_" for c in self.campaign):
            raise FieldValidationError("campaign", f"{self.campaign!r} is not a name of letters, digits, '-' and '_'")
        if self.workers < 1:
            raise FieldValidationError("workers", f"must be >= 1, got {self.workers}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise FieldValidationError("device", f"{self.device!r}; allowed: auto, cpu, cuda")
        if not self.cpus_per_worker > 0:
            raise FieldValidationError("cpus_per_worker", f"must be > 0, got {self.cpus_per_worker}")
        if not self.target_option.startswith("--"):
            raise FieldValidationError("target_option", f"{self.target_option!r} is not a long option like --db")


def fuzz_command(spec: FleetSpec, index: int, now: float | None = None) -> tuple[list[str], dict[str, str]] | None:
    """The command line and extra environment of actor ``index``'s fuzz process, or None when the
    campaign's end has passed (nothing to start).

    The command is ``python -m attnfuzz fuzz --quiet --workers 1 --device DEVICE
    [--time-budget S] [TARGET] FUZZ_ARGS`` with ``{worker}`` in ``FUZZ_ARGS`` replaced by
    ``index``; the target goes by environment where `TARGET_OPTIONS` names a variable.
    """
    now = time.time() if now is None else now
    argv = [sys.executable, "-m", "attnfuzz", "fuzz", "--quiet", "--workers", "1", "--device", spec.device]
    if spec.ends_at is not None:
        left = spec.ends_at - now
        if left < 1:
            return None
        argv += ["--time-budget", f"{left:.0f}"]
    env = dict(spec.env)
    if spec.target is not None:
        variable = TARGET_OPTIONS.get(spec.target_option)
        if variable:
            env[variable] = spec.target
        else:
            argv += [spec.target_option, spec.target]
    argv += [a.replace("{worker}", str(index)) for a in spec.fuzz_args]
    return argv, env


def _terminate_with_parent_thread() -> None:
    """``preexec_fn`` of a fuzz process: SIGTERM to it when the thread that started it ends (its
    actor's monitor thread, which lives as long as the process, or the whole actor process);
    Linux ``prctl(PR_SET_PDEATHSIG)``, nothing elsewhere."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


class FuzzActor:
    """The body of one fleet actor (made a Ray actor by `actor_class`): one fuzz process.

    State (`info`): ``starting``, ``running``, ``draining``, ``done`` (exit 0), ``failed`` (another
    exit code, or the process could not be started: ``error``; final), ``drained`` (stopped by
    `drain`); ``exit_code`` the fuzz process's. `info` holds the campaign's spec as given (its
    target and ``env`` unmasked: the CLI masks them before it prints).
    """

    def __init__(self, spec: dict[str, Any], index: int) -> None:
        self.spec = FleetSpec(**spec)
        self.index = index
        self.host = socket.gethostname()
        self.state = "starting"
        self.exit_code: int | None = None
        self.error = ""
        self.fuzz_pid: int | None = None
        self.started_at = time.time()
        self.reconstructed, self.node_id = False, ""
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():  # else outside Ray (the unit tests): starting one is not ours to do
            import warnings

            context = ray.get_runtime_context()
            with warnings.catch_warnings():  # Ray's own use of a deprecated accessor inside the property
                warnings.simplefilter("ignore")
                self.reconstructed = bool(context.was_current_actor_reconstructed)
            self.node_id = context.get_node_id()
        self._draining = threading.Event()
        self._process: subprocess.Popen | None = None
        self._started = threading.Event()
        self._lock = threading.Lock()
        self.log_path = str(Path(self.spec.log_dir) / f"worker-{index}.log")
        threading.Thread(target=self._run, name=f"fleet-worker-{index}", daemon=True).start()
        self._started.wait(60)

    def _run(self) -> None:
        """Start the fuzz process and wait for it (this thread lives as long as the process, so
        its parent-death signal fires only when the process is no longer watched)."""
        command = fuzz_command(self.spec, self.index)
        if command is None:
            self.state, self.exit_code = "done", 0
            self._started.set()
            return
        argv, extra_env = command
        Path(self.spec.log_dir).mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as out:
            out.write(f"--- fleet actor {self.index} on {self.host}: {' '.join(argv)}\n")
            out.flush()
            with self._lock:
                if self._draining.is_set():
                    self.state = "drained"
                    self._started.set()
                    return
                try:
                    self._process = subprocess.Popen(
                        argv, cwd=self.spec.workdir, env={**os.environ, **extra_env}, stdout=out,
                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_terminate_with_parent_thread,
                    )
                except OSError as exc:  # a workdir missing on this node: final, said in the log and the state
                    out.write(f"--- cannot start the fuzz process: {exc}\n")
                    out.flush()  # in the log before the state says so (a reader of both sees both)
                    self.state, self.exit_code = "failed", None
                    self.error = f"cannot start the fuzz process: {exc}"
                    self._started.set()
                    return
                self.fuzz_pid = self._process.pid
                self.state = "running"
            self._started.set()
            code = self._process.wait()
        self.exit_code = code
        if self._draining.is_set():
            self.state = "drained"
        elif code < 0:  # a signal no one here sent (kill -9, the OOM killer): Ray restarts this actor
            log.error("fleet worker %s: fuzz process %s died of signal %s; restarting the actor", self.index,
                      self.fuzz_pid, -code)
            os._exit(ACTOR_RESTART_EXIT)
        else:
            self.state = "done" if code == 0 else "failed"

    def info(self) -> dict[str, Any]:
        """This actor's state: index, host, node_id, actor pid, fuzz_pid, state, exit_code,
        started_at (epoch s), reconstructed (a restart), log path and the campaign's spec."""
        return {
            "index": self.index, "host": self.host, "node_id": self.node_id, "pid": os.getpid(),
            "fuzz_pid": self.fuzz_pid, "state": self.state, "exit_code": self.exit_code,
            "started_at": self.started_at, "reconstructed": self.reconstructed, "log": self.log_path,
            "error": self.error, "spec": asdict(self.spec),
        }

    def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> dict[str, Any]:
        """Stop the fuzz process as a scheduler would (SIGTERM: it flushes its writes and stops;
        exit 143), SIGKILL after ``timeout_s``. Returns `info` afterwards."""
        with self._lock:
            self._draining.set()
            process = self._process
        if process is not None and process.poll() is None:
            self.state = "draining"
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.error("fleet worker %s: fuzz process %s still running %g s after SIGTERM; killed", self.index,
                          process.pid, timeout_s)
                process.kill()
                process.wait()
        if process is not None:
            self.exit_code = process.returncode
        self.state = "drained" if self.state not in ("done", "failed") else self.state
        return self.info()


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise FleetError("Ray is not installed: pip install 'attnfuzz[fleet]'") from exc
    return ray


def connect(address: str | None, campaign: str) -> Any:
    """``ray.init`` on the running cluster at ``address`` (None: ``$RAY_ADDRESS``, else the
    local one) in the campaign's namespace. Returns the ``ray`` module.

    Raises:
        FleetError: Ray is not installed, or no cluster answers at ``address``.
    """
    ray = _ray()
    if ray.is_initialized():
        ray.shutdown()
    try:
        ray.init(address=address or "auto", namespace=namespace(campaign), log_to_driver=False,
                 logging_level=logging.WARNING, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise FleetError(f"no Ray cluster at {address or '$RAY_ADDRESS / this machine'}: {exc}") from exc
    return ray


def actor_class(ray: Any, spec: FleetSpec) -> Any:
    """`FuzzActor` as a Ray actor class with the campaign's resources and restart policy."""
    resources: dict[str, Any] = {"num_cpus": spec.cpus_per_worker}
    if spec.device == "cuda":
        resources["num_gpus"] = 1
    # threads: info() and drain() answer while the fuzz process runs
    return ray.remote(max_restarts=spec.max_restarts, max_concurrency=4, **resources)(FuzzActor)


def cluster_slots(ray: Any, spec: FleetSpec) -> int:
    """How many actors of ``spec``'s shape the cluster holds: its GPUs (cuda), or its CPUs divided
    by ``cpus_per_worker`` (cpu)."""
    resources = ray.cluster_resources()
    if spec.device == "cuda":
        return int(resources.get("GPU", 0))
    return int(resources.get("CPU", 0) // spec.cpus_per_worker)


def up(address: str | None, spec: FleetSpec) -> list[dict[str, Any]]:
    """Start ``spec.workers`` detached actors of ``spec.campaign`` and wait until each has started
    its fuzz process. Returns their `FuzzActor.info`.

    Raises:
        FleetError: Ray missing or no cluster; the campaign already has actors.
        FieldValidationError: the cluster has fewer slots than ``workers`` (a GPU campaign on a
            cluster without GPUs), field ``workers``.
    """
    ray = connect(address, spec.campaign)
    if spec.device == "auto":
        spec = replace(spec, device="cuda" if ray.cluster_resources().get("GPU", 0) >= 1 else "cpu")
    if _actor_names(ray, spec.campaign):
        raise FleetError(f"campaign {spec.campaign!r} is running already (attnfuzz fleet down --campaign {spec.campaign})")
    slots = cluster_slots(ray, spec)
    if slots < spec.workers:
        what = "GPUs" if spec.device == "cuda" else f"CPU slots of {spec.cpus_per_worker:g} CPUs"
        raise FieldValidationError("workers", f"the cluster has {slots} {what}, fewer than the {spec.workers} workers asked for")
    cls = actor_class(ray, spec)
    actors = [
        cls.options(name=f"{ACTOR_PREFIX}{i}", lifetime="detached", scheduling_strategy="SPREAD").remote(asdict(spec), i)
        for i in range(spec.workers)
    ]
    return ray.get([a.info.remote() for a in actors], timeout=600)


def _actor_names(ray: Any, campaign: str) -> list[str]:
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a.get("namespace") == namespace(campaign) and a["name"].startswith(ACTOR_PREFIX)]
    return sorted(names, key=lambda n: int(n[len(ACTOR_PREFIX):]))


def status(address: str | None, campaign: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Each actor of ``campaign``: ``index``, ``actor_state`` (Ray's: ALIVE, RESTARTING, DEAD,
    ...), ``restarts`` and ``node_id`` (Ray's state API), and the `FuzzActor.info` of a live one
    (``state``, ``host``, ``fuzz_pid``, ...; ``error`` when it did not answer in ``timeout_s``).

    Raises:
        FleetError: Ray missing, no cluster, or no actor of ``campaign``.
    """
    ray = connect(address, campaign)
    from ray.util.state import list_actors

    records = {}
    for actor in list_actors(filters=[("ray_namespace", "=", namespace(campaign))], detail=True, limit=10_000,
                             raise_on_missing_output=False):
        name = actor.name or ""
        if not name.startswith(ACTOR_PREFIX):
            continue
        index = int(name[len(ACTOR_PREFIX):])
        # a restarted actor keeps its id; an actor killed and started again (fleet up after down) is
        # a new one: the live record wins
        if index in records and records[index]["actor_state"] != "DEAD" and actor.state == "DEAD":
            continue
        records[index] = {"index": index, "actor_state": actor.state, "restarts": actor.num_restarts or 0,
                          "node_id": actor.node_id, "actor_id": actor.actor_id}
    if not records:
        raise FleetError(f"no actors of campaign {campaign!r} on this cluster")
    pending = {}
    for index, record in records.items():
        if record["actor_state"] == "ALIVE":
            try:
                pending[index] = ray.get_actor(f"{ACTOR_PREFIX}{index}").info.remote()
            except ValueError:
                record["error"] = "not found by name"
    for index, ref in pending.items():
        try:
            records[index].update(ray.get(ref, timeout=timeout_s))
        except Exception as exc:  # noqa: BLE001 - a dying actor: its Ray state says enough
            records[index]["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return [records[i] for i in sorted(records)]


def down(address: str | None, campaign: str, timeout_s: float = DRAIN_TIMEOUT_S) -> list[dict[str, Any]]:
    """Drain every actor of ``campaign`` at once (`FuzzActor.drain`: SIGTERM to its fuzz process,
    SIGKILL after ``timeout_s``), then kill it without restart. Returns each drained actor's
    `FuzzActor.info` (``error`` for one that did not answer).

    Raises:
        FleetError: Ray missing, no cluster, or no actor of ``campaign``.
    """
    ray = connect(address, campaign)
    names = _actor_names(ray, campaign)
    if not names:
        raise FleetError(f"no actors of campaign {campaign!r} on this cluster")
    actors = {name: ray.get_actor(name) for name in names}
    refs = {name: actor.drain.remote(timeout_s) for name, actor in actors.items()}
    results = []
    for name, ref in refs.items():
        try:
            results.append(ray.get(ref, timeout=timeout_s + 30))
        except Exception as exc:  # noqa: BLE001 - killed below all the same
            results.append({"index": int(name[len(ACTOR_PREFIX):]), "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
    for actor in actors.values():
        ray.kill(actor, no_restart=True)
    return results


def wait_for_end(address: str | None, campaign: str, poll_s: float = 30.0,
                 on_poll: Any = None) -> list[dict[str, Any]]:
    """Block until every actor of ``campaign`` is in a final state (`FINAL_STATES`: its fuzz
    process ended by itself, at the end of the campaign's budget or with an error), polling
    `status` every ``poll_s`` seconds (``on_poll(records)`` after each). Returns the last records.
    A restarting or dead actor is not final: a node lost near the end is waited for.

    Raises:
        FleetError: as `status`.
    """
    while True:
        records = status(address, campaign)
        if on_poll is not None:
            on_poll(records)
        if all(r.get("state") in FINAL_STATES for r in records):
            return records
        time.sleep(poll_s)  # the campaign's own pace: minutes to hours


def heartbeats_from_db(url: str, keys: list[tuple[str, int]]) -> dict[tuple[str, int], dict[str, Any]]:
    """The worker rows of ``(hostname, pid)`` ``keys`` in the database at ``url``: each one's
    ``worker_id``, ``status``, ``cases_run``, ``last_heartbeat`` (ISO 8601, UTC) and ``slot``."""
    if not keys:
        return {}
    from sqlalchemy import select, tuple_
    from sqlalchemy.orm import Session

    from service.db.engine import make_engine
    from service.db.models import Worker

    engine = make_engine(url)
    try:
        with Session(engine) as session:
            rows = session.scalars(select(Worker).where(tuple_(Worker.hostname, Worker.pid).in_(keys))).all()
            found = {}
            for w in sorted(rows, key=lambda w: w.id):  # a pid reused on a host: the newest row wins
                found[(w.hostname, w.pid)] = {"worker_id": w.id, "status": w.status, "cases_run": w.cases_run,
                                              "last_heartbeat": w.last_heartbeat.isoformat(), "slot": w.slot}
            return found
    finally:
        engine.dispose()


def heartbeats_from_service(base_url: str, keys: list[tuple[str, int]], timeout_s: float = 10.0,
                            client: Any = None) -> dict[tuple[str, int], dict[str, Any]]:
    """The same as `heartbeats_from_db` from an ``attnfuzz serve`` (``GET /api/workers``, newest
    heartbeat first, read until every key is found or the list ends). ``client``: an
    ``httpx.Client`` to use (its ``base_url`` set) instead of one for ``base_url``."""
    import contextlib

    import httpx

    wanted, found, offset = set(keys), {}, 0
    with contextlib.nullcontext(client) if client is not None else httpx.Client(
            base_url=base_url.rstrip("/"), timeout=timeout_s) as client:
        while wanted - set(found):
            response = client.get("/api/workers", params={"limit": 200, "offset": offset})
            response.raise_for_status()
            page = response.json()
            items = page.get("items", page) if isinstance(page, dict) else page
            if not items:
                break
            for w in items:
                key = (w["hostname"], w["pid"])
                if key in wanted and key not in found:
                    found[key] = {"worker_id": w["id"], "status": w["status"], "cases_run": w["cases_run"],
                                  "last_heartbeat": w["last_heartbeat"], "slot": w.get("slot")}
            offset += len(items)
    return found
