"""`ChildProcessExecutor`: backends run in persistent child processes, one per environment,
from the worker's side; and what asks them (`probe_backends`, `executor_runtime`).

Each backend *environment* (``Backend.environment``: backends that can share process-wide state,
e.g. TE's ``NVTE_*`` selection variables) gets one child process, started on first use and reused
across cases. The parent (the worker) generates the inputs and computes the float64 oracle once
per case and sends the inputs to the children (`fuzzer.executor.transport`); children return
outputs on the CPU.

Concurrency: with parallelism on (`ChildProcessExecutor`'s ``parallel``; by default on when the
inputs are on a CUDA device, ``$ATTNFUZZ_PARALLEL_CHILDREN`` ``1``/``0`` to force it) the
environments of a case run at the same time, one parent thread per environment driving its child,
and `ChildProcessExecutor.submit` starts them and returns at once, so the worker computes the
oracle while the children run (`fuzzer.evaluate.Evaluator.evaluate`).

A child that dies turns the call in flight into a ``crash`` (`fuzzer.executor.handle`); one that
runs past the timeout is killed and becomes ``timeout``; one whose resident memory passes
``memory_limit_bytes`` is killed and becomes ``oom``. The child is restarted and the remaining
tasks of the case run in the new one, so no result is lost.
"""

from __future__ import annotations

import collections
import concurrent.futures
import multiprocessing
import os
import tempfile
import threading
import time
from typing import Any

from fuzzer.backends.base import Backend, environment_set
from fuzzer.executor.calls import device_of, quick_availability_of
from fuzzer.executor.child import child_main
from fuzzer.executor.handle import ChildHandle, new_log_path
from fuzzer.executor.logs import ChildLog
from fuzzer.executor.outcome import BUSY, SKIPPED, ExecutorError, TaskOutcome
from fuzzer.executor.processes import kill_tree, usable_cores
from fuzzer.executor.runs import ChildRun, DeferredRun, collected_outcomes
from fuzzer.executor.transport import pack_inputs
from oracle.config import AttentionCase


PARALLEL_ENV = "ATTNFUZZ_PARALLEL_CHILDREN"
_PARALLEL_VALUES = {"1": True, "0": False}


def parallel_children_setting() -> bool | None:
    """``$ATTNFUZZ_PARALLEL_CHILDREN``: whether `ChildProcessExecutor` runs the environments of a
    case concurrently (and overlaps them with the oracle).

    Returns:
        True for ``1``, False for ``0``, None when unset or empty (the executor then decides by the
        inputs' device: on for CUDA, off for the CPU).

    Raises:
        ExecutorError: any other value (the message names the variable and the allowed values).
    """
    text = os.environ.get(PARALLEL_ENV, "").strip()
    if not text:
        return None
    if text not in _PARALLEL_VALUES:
        raise ExecutorError(f"{PARALLEL_ENV}: must be 1 (children run concurrently) or 0 (one after the other), got {text!r}")
    return _PARALLEL_VALUES[text]


def _note_parent_timing(outcome: Any, parent_ms: dict[str, float] | None, t_start: float | None) -> None:
    """Add the parent's parts to a child's ``outcome.timing`` (`TASK_TIMING_PARTS`): the
    message's send parts (``parent_ms``, on its first outcome) and the task's ``transfer``, its
    round trip from "start" to "done" less what the child measured itself."""
    timing = getattr(outcome, "timing", None)
    if not isinstance(timing, dict):  # an outcome from another build of the child: no timing
        return
    if parent_ms:
        timing.update(parent_ms)
    if t_start is not None:
        own = outcome.run_ms + outcome.compile_ms + sum(timing.get(k, 0.0) for k in ("to_device", "guard", "pack", "runtime"))
        timing["transfer"] = max((time.perf_counter() - t_start) * 1000.0 - own, 0.0)


def skipped_after_crash(
    tasks: list[tuple[str, str]], pending: list[int], left: list[int], outcomes: dict[int, TaskOutcome]
) -> list[int]:
    """``left`` less the tasks of a backend that crashed or timed out in this round (each
    then gets a `SKIPPED` outcome in ``outcomes`` naming the task that did): its other variants
    on the same case would very likely fail the same way, each costing a child restart or a
    timeout (`ChildProcessExecutor.skip_after_crash`).

    Args:
        tasks: the run's ``(backend, variant)`` tasks.
        pending: the task indices sent to the child this round.
        left: those of ``pending`` it did not finish.
        outcomes: ``{task index: outcome}`` so far; the skipped tasks are added.
    """
    broken = {
        tasks[p][0]: tasks[p][1] for p in pending if p not in left and outcomes.get(p) is not None and outcomes[p].status in ("crash", "timeout")
    }
    if not broken:
        return left
    kept = []
    for p in left:
        name, variant = tasks[p]
        if name in broken:
            detail = f"not run: variant {broken[name]!r} of {name} ended the child on this case (crash or timeout)"
            outcomes[p] = TaskOutcome(name, variant, SKIPPED, detail=detail)
        else:
            kept.append(p)
    return kept


class ChildProcessExecutor:
    """One persistent child process per backend environment; crashes and hangs are contained.

    Args:
        backends: ``(backend, spec)`` pairs; ``spec`` (``module:attr``) lets the child load the
            same backend.
        start_timeout_s: seconds a child may take to import its libraries and report ready.
        log_dir: where each child's stderr goes (a temporary directory by default).
        memory_limit_bytes: kill a child whose resident memory passes this many bytes while it
            runs a task (outcome ``oom``); None: no limit (Linux only: read from ``/proc``).
        memory_poll_s: how often that is checked, seconds.
        parallel: whether the environments of a case run concurrently (one thread of this
            process per environment drives its child; `submit` returns while they run, so the
            caller can compute the oracle meanwhile). True or False forces it; None (default):
            ``$ATTNFUZZ_PARALLEL_CHILDREN`` (``1`` on, ``0`` off) when set, else on when the
            inputs are on a CUDA device; on the CPU, on when the children and this process have a
            core each (environments + 1 <= usable cores: the README's CPU job has one child, so
            on 2 cores its kernels run while this process computes the oracle, 1.17x cases/s side
            by side, 2026-12-01), else off (more children than cores would only contend). Off:
            environments one after the other, and `submit` runs nothing before ``result()`` (the
            serial order). Per-task semantics are the same
            either way: the timeout is per task and per child, every way a call ends becomes its
            `TaskOutcome`, a dead child is restarted, outcomes come in task order.
        spare_after_restarts: once an environment's child has been restarted this many times, a
            spare child of it is started ahead in the background and kept ready; the next restart
            takes it at once (``spares_used``) and orders another. None: never (each restart
            starts a child and waits for it). Why: a CUDA child imports FA4 or TE and creates its
            context, seconds each time, and a kernel that crashes once tends to crash again; on
            the H200 (2026-12-02, cfec051;
            `benchmarks/gpu/results/2026-12-02-cfec051-default/manifest.json`) FA4 crashed 11
            times in a 600 s run and its lane ran 383 cases in 449 s of work, of which compiles
            took 120 s and kernels 82 s. The spare costs a process (host and device memory) only
            for environments that crashed.

    One run per environment at a time: `submit` waits for an environment still working on an
    earlier submitted run (or, with ``skip_busy``, leaves it out: lanes), and `run` without
    parallelism waits for every one. Children started by the pool's threads die with them
    (``PR_SET_PDEATHSIG`` is per thread): the pool lives until `close`.

    Raises:
        ExecutorError: (constructor) ``$ATTNFUZZ_PARALLEL_CHILDREN`` is neither ``1`` nor ``0``,
            ``memory_limit_bytes`` is not positive, or ``spare_after_restarts`` is neither None nor
            an integer >= 1; (from ``run``/``result()``) a child could
            not be started within ``start_timeout_s``.
    """

    def __init__(
        self,
        backends: list[tuple[Backend, str]],
        start_timeout_s: float = 300.0,
        log_dir: str | None = None,
        memory_limit_bytes: int | None = None,
        memory_poll_s: float = 0.05,
        parallel: bool | None = None,
        spare_after_restarts: int | None = 1,
    ):
        import torch.multiprocessing  # noqa: F401  (registers tensor reductions)

        if memory_limit_bytes is not None and memory_limit_bytes <= 0:
            raise ExecutorError(f"memory_limit_bytes: must be positive, got {memory_limit_bytes}")
        if spare_after_restarts is not None and (isinstance(spare_after_restarts, bool) or not isinstance(spare_after_restarts, int) or spare_after_restarts < 1):
            raise ExecutorError(f"spare_after_restarts: must be None or an integer >= 1, got {spare_after_restarts!r}")
        self.backends = {b.name: (b, spec) for b, spec in backends}
        self._environments = {b.environment for b, _ in backends}  # one child each
        self.start_timeout_s = start_timeout_s
        self.memory_limit_bytes = memory_limit_bytes
        self.memory_poll_s = memory_poll_s
        self._owns_log_dir = log_dir is None  # a temporary directory of our own: removed by close()
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="attnfuzz-children-")
        self._ctx = multiprocessing.get_context("spawn")
        #: True/False: forced; None: by the inputs' device (see the class docstring)
        self.parallel: bool | None = bool(parallel) if parallel is not None else parallel_children_setting()
        self._children: dict[str, ChildHandle] = {}
        self._ever_started: set[str] = set()
        self.restarts = 0  # children started again after a crash, a timeout or a lost pipe
        #: keep a spare child of an environment, started ahead, once it has been restarted this
        #: many times (None: never); see `_child`
        self.spare_after_restarts = spare_after_restarts
        self.spares_used = 0  # restarts served by a spare child started ahead
        self._restarts_by_env: collections.Counter = collections.Counter()
        self._spares: dict[str, concurrent.futures.Future] = {}  # environment -> its spare's start
        self._spare_pool: concurrent.futures.ThreadPoolExecutor | None = None
        # guards _children, _ever_started, restarts, runtime, log names and process starts
        # (environment_set changes os.environ around the start) across the environment threads
        self._lock = threading.RLock()
        self._send_lock = threading.Lock()  # one pickling of shared tensors at a time
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._in_flight: ChildRun | None = None  # the last run submitted, until it is collected
        self._busy: dict[str, concurrent.futures.Future] = {}  # environment -> its submitted run's future
        self.supports_lanes = True  # submit(..., skip_busy=True) (see submit_run)
        self._closing = threading.Event()
        #: after a task crashes or times out, give the backend's other tasks of the case a
        #: ``skipped`` outcome instead of running them (the evaluator sets it for fuzz cases)
        self.skip_after_crash = False
        from fuzzer.environment import child_library_env, resolve_cudnn_choice

        #: the cuDNN every child loads (`fuzzer.environment.resolve_cudnn_choice`)
        self.cudnn = resolve_cudnn_choice()
        self._library_env = child_library_env(self.cudnn)
        #: what each backend's child reported it loaded (`child_runtime`), by backend name
        self.runtime: dict[str, dict[str, str]] = {}

    def _environment(self, name: str) -> str:
        return self.backends[name][0].environment

    def _start(self, environment: str, register: bool = True) -> ChildHandle:
        """Start a child of ``environment`` and wait for its ready message; ``register``: make it
        the environment's child (False: a spare, `_start_spare`).

        Raises:
            ExecutorError: it did not report ready within ``start_timeout_s`` or died first.
        """
        members = [(spec, b.name) for b, spec in self.backends.values() if b.environment == environment]
        env_vars: dict[str, str] = {}
        if any(b.jit_compiled for b, _ in self.backends.values() if b.environment == environment):
            from fuzzer.environment import jit_cache_env

            env_vars.update(jit_cache_env())  # one FA4 compile cache for every child, kept across runs
        for b, _ in self.backends.values():
            if b.environment == environment:
                env_vars.update(b.env_vars)
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        with self._lock:  # one start at a time; the children then load their libraries concurrently
            log = ChildLog(new_log_path(self.log_dir, environment))
            process = self._ctx.Process(
                target=child_main, args=(child_conn, members, env_vars, log.child_end), daemon=True, name=f"attnfuzz-{environment}"
            )
            try:
                with environment_set(self._library_env):  # the loader reads LD_LIBRARY_PATH at exec
                    process.start()
            finally:
                log.started()
        child_conn.close()
        child = ChildHandle(process, parent_conn, log).await_ready(environment, self.start_timeout_s)
        with self._lock:
            self._note_runtime(child.runtime)
            if register:
                self._children[environment] = child
        return child

    def _start_spare(self, environment: str) -> ChildHandle | None:
        """A spare child of ``environment`` (the spare pool's thread: the child lives as long as
        that thread, see the class docstring); None when the executor is closing."""
        if self._closing.is_set():
            return None
        child = self._start(environment, register=False)
        if self._closing.is_set():  # close() began while it started: it will not be used
            child.end()
            return None
        return child

    def _take_spare(self, environment: str) -> ChildHandle | None:
        """The spare child of ``environment`` started ahead, alive and ready (waiting for its
        start if it is still starting), or None (none, or its start failed or it died)."""
        with self._lock:
            future = self._spares.pop(environment, None)
        if future is None:
            return None
        try:
            child = future.result(timeout=self.start_timeout_s)
        except Exception:  # its start failed: start one the usual way (which reports why)
            return None
        if child is None or not child.process.is_alive():
            if child is not None:
                child.end()
            return None
        return child

    def _order_spare(self, environment: str) -> None:
        """Start a spare child of ``environment`` in the background when it has been restarted
        ``spare_after_restarts`` times or more and has none (see `_child`)."""
        if self.spare_after_restarts is None or self._closing.is_set():
            return
        with self._lock:
            if self._restarts_by_env[environment] < self.spare_after_restarts or environment in self._spares:
                return
            if self._spare_pool is None:
                self._spare_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnfuzz-spare")
            self._spares[environment] = self._spare_pool.submit(self._start_spare, environment)

    def _note_runtime(self, runtime: dict[str, dict[str, str]] | None) -> None:
        """Attribute later results to what a child reported it loaded (`Backend.set_runtime`)."""
        with self._lock:
            for name, report in (runtime or {}).items():
                if name in self.backends and self.runtime.get(name) != report:
                    self.runtime[name] = dict(report)
                    self.backends[name][0].set_runtime(report)

    def _child(self, environment: str) -> ChildHandle:
        if self._closing.is_set():  # close() ends a run in flight: start nothing new
            raise ExecutorError("the executor is closing")
        with self._lock:
            child = self._children.get(environment)
        if child is None or not child.process.is_alive():
            with self._lock:
                restart = environment in self._ever_started
                if restart:
                    self.restarts += 1
                    self._restarts_by_env[environment] += 1
            spare = self._take_spare(environment) if restart else None
            if spare is not None:
                with self._lock:
                    self._children[environment] = spare
                    self.spares_used += 1
                child = spare
            else:
                child = self._start(environment)
            with self._lock:
                self._ever_started.add(environment)
            if restart:
                self._order_spare(environment)
        return child

    def _kill(self, environment: str) -> None:
        with self._lock:
            child = self._children.pop(environment, None)
        if child is not None:
            child.end()

    def availability(self) -> dict[str, str | None]:
        """Each backend's availability as its child sees it (starts the children).

        With parallelism on (or unset and some backend on CUDA) the children start side by side,
        each from a thread of the executor's pool (which lives until `close`: a child dies with the
        thread that started it, ``PR_SET_PDEATHSIG``), so the start-up costs the slowest child's
        imports, not their sum (seven GPU children import torch, TE and FA4 each)."""
        environments = list(dict.fromkeys(self._environment(n) for n in self.backends))
        parallel = self.parallel if self.parallel is not None else any(b.device != "cpu" for b, _ in self.backends.values())

        def start(environment: str) -> dict[str, str | None]:
            try:
                return dict(self._child(environment).availability)
            except ExecutorError as exc:
                return {name: str(exc) for name in self.backends if self._environment(name) == environment}

        if parallel and len(environments) > 1:
            reports = list(self._thread_pool().map(start, environments))
        else:
            reports = [start(environment) for environment in environments]
        result: dict[str, str | None] = {}
        for report in reports:
            result.update(report)
        return result

    def run(
        self, case: AttentionCase, inputs: Any, tasks: list[tuple[str, str]], timeout_s: float
    ) -> list[TaskOutcome]:
        """Run ``tasks`` (``(backend, variant)``) on ``case``; one outcome per task, in order.

        With parallelism on (see the class docstring) the environments run concurrently
        (``submit(...).result()``); off, one after the other.

        Args:
            case: the case.
            inputs: `oracle.inputs.AttentionInputs` on the worker's device.
            tasks: the calls to make.
            timeout_s: per-task wall-clock limit in seconds (measured in each child from the
                task's start).

        Raises:
            ExecutorError: a child could not be started.
        """
        if self._parallel_for(inputs):
            return self.submit(case, inputs, tasks, timeout_s).result()
        self._check_idle()
        packed = pack_inputs(case, inputs)
        outcomes: dict[int, TaskOutcome] = {}
        for environment, indices in self._by_environment(tasks).items():
            outcomes.update(self._timed_environment(environment, case, packed, tasks, indices, timeout_s))
        return collected_outcomes(tasks, outcomes)

    def submit(
        self, case: AttentionCase, inputs: Any, tasks: list[tuple[str, str]], timeout_s: float, *, skip_busy: bool = False
    ) -> Any:
        """Start ``tasks`` on ``case`` and return at once; collect with the handle's ``result()``
        (the outcomes `run` would return), ``partial(timeout_s)`` (what finished within the time,
        and a handle of the rest) or ``abandon()`` (see `submit_run`).

        With parallelism on, each environment's tasks start now in a thread of their own (the
        inputs are packed first, in this thread); off, a `DeferredRun` (nothing runs before
        ``result()``). Arguments as for `run`.

        Lanes: an environment whose child still works on an earlier run (the rest of a
        ``partial``) takes no new tasks until it is done. By default this waits for it; with
        ``skip_busy`` its tasks of this case are not run and come back as `BUSY` outcomes, so the
        fast environments go on with new cases while a slow one (a JIT compile, a long backward)
        finishes its own.
        """
        if not self._parallel_for(inputs):
            return DeferredRun(self, case, inputs, tasks, timeout_s)
        by_env = self._by_environment(tasks)
        preset: dict[int, TaskOutcome] = {}
        for environment in list(by_env):
            if not self._is_busy(environment):
                continue
            if skip_busy:
                for i in by_env.pop(environment):
                    name, variant = tasks[i]
                    preset[i] = TaskOutcome(name, variant, BUSY, detail=f"not run: environment {environment!r} busy with an earlier case")
            else:
                self._wait_idle([environment])
        packed = pack_inputs(case, inputs) if by_env else None
        pool = self._thread_pool()
        with self._lock:
            futures = {
                environment: pool.submit(self._timed_environment, environment, case, packed, tasks, indices, timeout_s)
                for environment, indices in by_env.items()
            }
            self._busy.update(futures)
            self._in_flight = run = ChildRun(self, list(tasks), futures, preset=preset, indices=by_env)
        return run

    def _is_busy(self, environment: str) -> bool:
        """Whether ``environment``'s child still works on a submitted run."""
        with self._lock:
            future = self._busy.get(environment)
        return future is not None and not future.done()

    def busy_environments(self) -> list[str]:
        """The environments whose child still works on a submitted run (lanes)."""
        with self._lock:
            return [env for env, future in self._busy.items() if not future.done()]

    def environment_of(self, backend: str) -> str:
        """The environment (child process) that runs ``backend``."""
        return self._environment(backend)

    def _wait_idle(self, environments: list[str] | None = None) -> None:
        """Wait until ``environments`` (default: all) have finished their submitted runs."""
        with self._lock:
            futures = [f for env, f in self._busy.items() if environments is None or env in environments]
        concurrent.futures.wait(futures)

    def _thread_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """The executor's pool, one thread per environment, made on first use and kept until
        `close` (a child dies with the thread that started it: ``PR_SET_PDEATHSIG``)."""
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=max(len(self._environments), 1), thread_name_prefix="attnfuzz-env"
                )
            return self._pool

    def _parallel_for(self, inputs: Any) -> bool:
        if self.parallel is not None:
            return self.parallel
        if device_of(inputs) == "cuda":
            return True
        return len(self._environments) + 1 <= usable_cores()

    def _check_idle(self) -> None:
        """Before a serial run: wait for every environment's submitted run (lanes) to finish."""
        self._wait_idle()

    def _run_finished(self, run: ChildRun) -> None:
        with self._lock:
            if self._in_flight is run:
                self._in_flight = None

    def _by_environment(self, tasks: list[tuple[str, str]]) -> dict[str, list[int]]:
        """Task indices by environment, environments in order of first appearance."""
        by_env: dict[str, list[int]] = {}
        for i, (name, _) in enumerate(tasks):
            by_env.setdefault(self._environment(name), []).append(i)
        return by_env

    def _run_environment(self, environment, case, packed, tasks, indices, timeout_s) -> dict[int, TaskOutcome]:
        """Every task of ``indices`` through the environment's child (restarted after a death):
        ``{task index: outcome}`` (outputs still packed). The unit one thread drives."""
        outcomes: dict[int, TaskOutcome] = {}
        pending = list(indices)
        stalls = 0
        while pending:
            left = self._run_in_child(environment, case, packed, tasks, pending, timeout_s, outcomes)
            if self.skip_after_crash and left:
                left = skipped_after_crash(tasks, pending, left, outcomes)
            stalls = stalls + 1 if left == pending else 0
            if stalls >= 2:  # the child died twice before starting anything: do not loop forever
                name, variant = tasks[pending[0]]
                outcomes[pending[0]] = TaskOutcome(
                    name, variant, "crash", detail="child died before starting the task, twice in a row"
                )
                left, stalls = pending[1:], 0
            pending = left
        return outcomes

    def _timed_environment(self, environment, case, packed, tasks, indices, timeout_s) -> dict[int, TaskOutcome]:
        """`_run_environment`, its wall time noted as ``env_wall`` on its first outcome."""
        t0 = time.perf_counter()
        outcomes = self._run_environment(environment, case, packed, tasks, indices, timeout_s)
        first = outcomes.get(indices[0]) if indices else None
        if first is not None:
            first.timing["env_wall"] = (time.perf_counter() - t0) * 1000.0
        return outcomes

    def _run_in_child(self, environment, case, inputs, tasks, pending, timeout_s, outcomes) -> list[int]:
        """Send ``pending`` tasks to the environment's child (``inputs`` packed by `pack_inputs`);
        return those left after a crash."""
        child = self._child(environment)
        batch = [tasks[i] for i in pending]
        t_lock = time.perf_counter()
        try:
            with self._send_lock:
                t_send = time.perf_counter()
                child.conn.send(("run", case.to_json(), inputs, batch))
        except (BrokenPipeError, OSError):
            self._kill(environment)
            return pending
        t_sent = time.perf_counter()
        parent_ms = {"send_wait": (t_send - t_lock) * 1000.0, "send": (t_sent - t_send) * 1000.0}
        t_start: float | None = None  # perf_counter of the current task's "start"
        current: int | None = None
        started_at = time.monotonic()
        while True:
            remaining = timeout_s - (time.monotonic() - started_at) if current is not None else self.start_timeout_s
            ready, rss = child.wait(max(remaining, 0.0), self.memory_limit_bytes, self.memory_poll_s)
            if rss is not None:
                if current is None:
                    current = next(k for k, p in enumerate(pending) if p not in outcomes)
                name, variant = batch[current]
                detail = (
                    f"child resident memory {rss} bytes passed memory_limit_bytes {self.memory_limit_bytes}; "
                    f"child killed\n{child.tail()}"
                )
                outcomes[pending[current]] = TaskOutcome(name, variant, "oom", detail=detail)
                self._kill(environment)
                return [p for p in pending if p not in outcomes]
            if not ready:
                if current is None:  # stuck before starting the next task
                    current = next(k for k, p in enumerate(pending) if p not in outcomes)
                name, variant = batch[current]
                detail = f"no result after {timeout_s:g} s; child killed\n{child.tail()}"
                outcomes[pending[current]] = TaskOutcome(name, variant, "timeout", detail=detail)
                self._kill(environment)
                return [p for p in pending if p not in outcomes]
            try:
                message = child.conn.recv()
            except (EOFError, ConnectionResetError, OSError):
                child.process.join(10)
                if current is not None:
                    name, variant = batch[current]
                    outcomes[pending[current]] = child.death_outcome(name, variant)
                self._kill(environment)
                return [p for p in pending if p not in outcomes]
            if message[0] == "start":
                current = message[1]
                started_at = time.monotonic()
                t_start = time.perf_counter()
                if parent_ms is not None:
                    parent_ms["deliver"] = (t_start - t_sent) * 1000.0
            elif message[0] == "done":
                outcome = message[2]
                _note_parent_timing(outcome, parent_ms, t_start)
                parent_ms = None  # the message's parts go on its first outcome
                outcomes[pending[message[1]]] = outcome
                self._note_runtime(getattr(message[2], "runtime", None))
                current = None
                if message[1] == len(batch) - 1:
                    child.log.settle(0.5)  # what the tasks printed is in their log when their outcomes are
                    return []

    def close(self) -> None:
        """Stop every child (politely, then by force) and remove the temporary stderr directory
        this executor made (one given as ``log_dir`` is kept). A run still in flight (the caller
        was interrupted while collecting it) is ended first: its children are killed and its
        threads finish. The executor can be used again after (children start anew)."""
        self._closing.set()
        try:
            run = self._in_flight
            while self.busy_environments():
                with self._lock:
                    children = list(self._children.values())
                    futures = [f for f in self._busy.values() if not f.done()]
                for child in children:
                    if child.process.is_alive():
                        kill_tree(child.process.pid)  # the thread reading its pipe sees EOF
                concurrent.futures.wait(futures, timeout=1.0)
            if run is not None:
                self._run_finished(run)
            with self._lock:
                self._busy.clear()
            with self._lock:
                children = list(self._children.items())
            for environment, child in children:
                try:
                    child.conn.send(("stop",))
                except (BrokenPipeError, OSError):
                    pass
                child.process.join(5)
                self._kill(environment)
            if self._pool is not None:  # after the children: their starting threads may end now
                self._pool.shutdown(wait=True)
                self._pool = None
            with self._lock:
                spares, self._spares = list(self._spares.values()), {}
            for future in spares:
                future.cancel()  # not started yet: never starts
                try:
                    child = future.result(timeout=self.start_timeout_s) if not future.cancelled() else None
                except Exception:
                    child = None
                if child is not None:
                    child.end()
            if self._spare_pool is not None:
                self._spare_pool.shutdown(wait=True)
                self._spare_pool = None
        finally:
            self._closing.clear()
        if self._owns_log_dir:
            import shutil

            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> ChildProcessExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def probe_backends(
    backends: list[tuple[Backend, str]], start_timeout_s: float = 300.0
) -> tuple[dict[str, str | None], dict[str, dict[str, str]]]:
    """Each backend's availability and runtime report, asked the way a worker asks: a backend
    whose `Backend.quick_availability` already says no (or a CPU backend) is answered here; the
    others are loaded in their own child processes (`ChildProcessExecutor`, the chosen cuDNN on
    their ``LD_LIBRARY_PATH``), so this process imports no GPU library.

    Returns:
        ``(availability, runtime)``: ``{name: None or reason}`` and ``{name: report}``
        (`child_runtime`; empty for backends answered here).
    """
    availability: dict[str, str | None] = {}
    in_children: list[tuple[Backend, str]] = []
    for backend, spec in backends:
        reason = quick_availability_of(backend)
        if reason is not None or backend.device != "cuda":
            availability[backend.name] = reason
        else:
            in_children.append((backend, spec))
    runtime: dict[str, dict[str, str]] = {}
    if in_children:
        executor = ChildProcessExecutor(in_children, start_timeout_s=start_timeout_s)
        try:
            availability.update(executor.availability())
            runtime = dict(executor.runtime)
        finally:
            executor.close()
    return availability, runtime


def executor_runtime(executor: Any) -> dict[str, dict[str, str]] | None:
    """What the children of ``executor`` reported they loaded, by backend name
    (`ChildProcessExecutor.runtime`; through a routing executor's ``default``); None for an
    executor that runs backends in this process (then this process is what ran)."""
    runtime = getattr(executor, "runtime", None)
    if runtime is None and getattr(executor, "default", None) is not None:
        runtime = getattr(executor.default, "runtime", None)
    return runtime if isinstance(runtime, dict) else None
