"""Running CP cases: ``cp_size`` rank processes under ``torch.distributed``, reused across cases.

One idea (the module is over 600 lines): running CP tasks on groups of rank processes and turning
every way a rank can end into one `CPTaskOutcome`.

`CPExecutor` has the interface of `fuzzer.executor.ChildProcessExecutor` (``availability``,
``run(case, inputs, tasks, timeout_s) -> list[TaskOutcome]``, ``close``, ``restarts``) and runs the
tasks of cases with ``cp_size > 1``; `RoutingExecutor` puts it beside the worker's usual executor
and sends each case to one of them by its ``cp_size``.

Groups. One *group* per (backend environment, ``cp_size``): ``cp_size`` processes started with the
``spawn`` context, rank ``r`` on ``cuda:gpu_ids[r]`` with NCCL for CUDA backends (one GPU per rank)
or on the CPU with gloo. They rendezvous through a ``TCPStore`` the executor opens on a free port
of 127.0.0.1 (port 0, so no race for a port), create the CP group of all ranks and, for an even
``cp_size >= 4``, the two-level groups of ``a2a+p2p`` (pairs ``{2i, 2i+1}``, rings of one parity;
`fuzzer.backends.cp_layout.hierarchical_ranks`), load the backends of the environment, and serve cases until
told to stop. The ranks' environment has ``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` and ``NVSHMEM_DISABLE_NVLS=1`` (`CP_RANK_ENV`)
besides the backends' own ``env_vars``. Groups stay alive between cases; at most
``max_live_groups`` at once (the least recently used one is stopped first: on GPUs each group holds
a CUDA context and NCCL communicators on every GPU it uses).

Inputs. The executor receives the full inputs the worker built (the oracle was computed from the
same tensors), shards them in the parent with `fuzzer.cp.sharding.shard_inputs` (the layout is a pure
function, tested on its own) and sends each rank only its shard (CPU tensors through shared
memory); rank 0 also gets the full inputs for the non-CP twin. Ranks move their shard to their
device.

Per task, on every rank, in order: (rank 0 only, with ``run_non_cp_twin``) the same backend and
variant on the non-CP twin of the case (`fuzzer.backends.cp_layout.cp_twin`) with the full inputs; then
``backend.run_cp(case, shard, groups, variant)``. Each rank reports its outcome with its local
outputs on the CPU; when every rank is ``ok`` the executor gathers out, lse and the gradients
into the full canonical layout (`fuzzer.cp.sharding.gather_outputs`) and returns a `CPTaskOutcome`
(its ``non_cp`` is the twin's outcome).

Isolation, per task (``timeout_s`` covers the twin and the CP run):

* a rank that does not answer in time: ``timeout``, naming the rank(s) that did not answer and
  their stderr tails; the group is killed and restarted for the next task or case;
* a rank that dies: ``crash`` with that rank's exit signal and stderr tail (SIGKILL that the
  executor did not send: ``oom``); group killed;
* a rank that raises while others wait for it in a collective: the raising rank's status
  (``error``, ``oom``, ``unsupported``) once the others have not answered within
  ``error_grace_s``; group killed;
* ranks that answer with different statuses: the most severe (crash > oom > error > timeout >
  unsupported > ok), every rank's detail in ``detail``; the group is killed because its
  collectives may be out of step.

A group that fails to start twice for the same (environment, ``cp_size``) is not tried again; its
tasks become ``crash`` with the start error.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from multiprocessing import connection as mp_connection
from typing import Any

from fuzzer.backends.base import Backend, BackendOutput, CPProcessGroups, environment_set, is_cp_backend
from fuzzer.backends.cp_layout import CPShardError, cp_twin
from fuzzer.cp.sharding import gather_outputs, shard_inputs
from fuzzer.executor import (
    ExecutorError,
    kill_tree,
    ChildLog,
    TaskOutcome,
    availability_of,
    become_child,
    exit_if_crashed,
    load_task_backends,
    release_after_oom,
    run_task,
    submit_run,
)
from oracle.config import AttentionCase

#: Environment of every CP rank: NVLink SHARP / multicast stay off (see docs/cp.md).
CP_RANK_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

_SEVERITY = ("crash", "oom", "error", "timeout", "unsupported", "ok")
_START_ATTEMPTS = 2


@dataclass
class CPTaskOutcome(TaskOutcome):
    """A `fuzzer.executor.TaskOutcome` of a CP run, with the same backend's non-CP run beside it.

    Attributes:
        non_cp: the outcome of the non-CP twin (`fuzzer.backends.cp_layout.cp_twin`) of the case on the
            same backend and variant, with the full inputs, on rank 0 (None when not run).
        rank_status: each rank's status, rank order (``"missing"`` for a rank that did not answer).
    """

    non_cp: TaskOutcome | None = None
    rank_status: list[str] = field(default_factory=list)

    def twin_outcome(self) -> TaskOutcome | None:
        """``non_cp``."""
        return self.non_cp

    def judged(self, case: AttentionCase, reference: Any, judge: Any) -> tuple[Any, Any]:
        """`fuzzer.cp.judge.judge_cp` of this outcome: ``(result with metrics["cp"], twin_result)``,
        or ``(judge(case, self), None)`` without a non-CP run (see `TaskOutcome.judged`)."""
        from fuzzer.cp.judge import judge_cp

        return judge_cp(case, reference, self, judge)


def _to_cpu(output: BackendOutput | None) -> BackendOutput | None:
    if output is None:
        return None

    def move(t):
        return None if t is None else t.detach().to("cpu")

    return BackendOutput(
        out=move(output.out), lse=move(output.lse), dq=move(output.dq), dk=move(output.dk), dv=move(output.dv),
        selected_kernel=output.selected_kernel, compile_ms=output.compile_ms, extra=dict(output.extra),
    )


def _to_device(output: BackendOutput | None, device: Any) -> BackendOutput | None:
    if output is None or str(device) == "cpu":
        return output
    for name in ("out", "lse", "dq", "dk", "dv"):
        value = getattr(output, name)
        if value is not None:
            setattr(output, name, value.to(device))
    return output


# ------------------------------------------------------------------------------------------ rank
class _CPCall:
    """Presents ``backend.run_cp`` with fixed process groups as a ``run(case, inputs, variant)``,
    so `fuzzer.executor.run_task` classifies its outcome exactly as for non-CP runs."""

    def __init__(self, backend: Backend, groups: CPProcessGroups):
        self.name = backend.name
        self.device = backend.device
        self.jit_compiled = getattr(backend, "jit_compiled", False)  # run_task: a failed build is compile time
        self._backend = backend
        self._groups = groups

    def run(self, case: AttentionCase, inputs: Any, variant: str) -> BackendOutput:
        return self._backend.run_cp(case, inputs, self._groups, variant)


def _make_groups(rank: int, cp_size: int, device: Any) -> CPProcessGroups:
    """The CP group and, for an even ``cp_size >= 4``, the a2a pairs and p2p rings (every rank
    creates every group, in the same order, as ``torch.distributed.new_group`` requires)."""
    import torch
    import torch.distributed as dist

    ranks = list(range(cp_size))
    group = dist.new_group(ranks)
    a2a_group = p2p_group = None
    if cp_size >= 4 and cp_size % 2 == 0:
        for i in range(cp_size // 2):
            pair = dist.new_group([2 * i, 2 * i + 1])
            if rank // 2 == i:
                a2a_group = pair
        for parity in range(2):
            ring = dist.new_group(list(range(parity, cp_size, 2)))
            if rank % 2 == parity:
                p2p_group = ring
    stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None
    return CPProcessGroups(
        rank=rank, cp_size=cp_size, group=group, global_ranks=ranks, device=device, stream=stream,
        a2a_group=a2a_group, p2p_group=p2p_group,
    )


def _rank_main(
    conn: Any,
    rank: int,
    cp_size: int,
    store_port: int,
    specs: list[tuple[str, str]],
    env_vars: dict[str, str],
    log: Any,
    device_type: str,
    gpu_id: int,
    start_timeout_s: float,
    pg_timeout_s: float,
) -> None:
    """Entry point of one rank (`fuzzer.executor.become_child`, ``log``: its
    `fuzzer.executor.ChildLog`'s write end): join the group, load the backends, serve ``run``
    requests."""
    become_child(log)
    faulthandler.enable(sys.stderr)  # a segfault leaves its Python stack in the log
    os.environ.update(CP_RANK_ENV)
    os.environ.update(env_vars)
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.multiprocessing  # noqa: F401  (registers tensor reductions for the pipe)

    from oracle.config import AttentionCase as Case

    if device_type == "cuda":
        torch.cuda.set_device(gpu_id)
        device, pg_backend = torch.device("cuda", gpu_id), "nccl"
    else:
        device, pg_backend = torch.device("cpu"), "gloo"
    store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=start_timeout_s))
    dist.init_process_group(pg_backend, store=store, rank=rank, world_size=cp_size, timeout=timedelta(seconds=pg_timeout_s))
    groups = _make_groups(rank, cp_size, device)
    backends = load_task_backends(specs)
    conn.send(("ready", os.getpid(), {name: availability_of(b) for name, b in backends.items()}))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message[0] == "stop":
            dist.destroy_process_group()
            return
        _, case_json, local_inputs, full_inputs, tasks = message
        case = Case.from_json(case_json)
        for i, (name, variant) in enumerate(tasks):
            backend = backends[name]
            if full_inputs is not None:
                conn.send(("twin_start", i))
                twin = run_task(backend, cp_twin(case), full_inputs, variant)
                twin.output = _to_cpu(twin.output)
                conn.send(("twin_done", i, twin))
                exit_if_crashed(twin, prefix="non-CP twin: ")  # a poisoned CUDA context: die, be restarted
            conn.send(("start", i))
            outcome = run_task(_CPCall(backend, groups), case, local_inputs, variant)
            outcome.output = _to_cpu(outcome.output)
            conn.send(("done", i, outcome))
            exit_if_crashed(outcome)
            release_after_oom(outcome, cuda=device.type == "cuda")


# ---------------------------------------------------------------------------------------- parent
@dataclass
class _Group:
    environment: str
    cp_size: int
    processes: list[Any]
    conns: list[Any]
    logs: list[ChildLog]
    store: Any
    pids: list[int] = field(default_factory=list)
    availability: dict[str, str | None] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, int]:
        return self.environment, self.cp_size

    def is_alive(self) -> bool:
        return all(p.is_alive() for p in self.processes)


class _StartError(Exception):
    pass


class CPExecutor:
    """Runs tasks of cases with ``cp_size > 1`` on groups of rank processes (module docstring).

    Args:
        backends: ``(backend, spec)`` pairs, as for `fuzzer.executor.ChildProcessExecutor`; only
            CP-capable ones (`fuzzer.backends.base.is_cp_backend`) are run, others get ``unsupported``.
        max_cp_size: the largest ``cp_size`` to offer (`max_cp_size` property); default: the CUDA
            device count for CUDA backends, 2 for CPU (gloo) backends.
        gpu_ids: GPU of each rank (``gpu_ids[rank]``); default ``0 .. device_count - 1``.
        start_timeout_s: seconds a group may take to start (imports, rendezvous, groups).
        pg_timeout_s: ``torch.distributed`` timeout of the ranks' collectives, seconds; longer than
            any task timeout so that hangs are judged here, by ``timeout_s``.
        error_grace_s: after one rank reports a failure, how long the others may still take.
        run_non_cp_twin: also run each task's non-CP twin on rank 0 (``CPTaskOutcome.non_cp``).
        max_live_groups: groups kept alive at once (least recently used stopped first), ``>= 1``.
        log_dir: where each rank's stderr goes (a temporary directory by default).

    Raises:
        ExecutorError: ``max_cp_size`` or ``max_live_groups`` is not an int >= 1.
    """

    def __init__(
        self,
        backends: list[tuple[Backend, str]],
        *,
        max_cp_size: int | None = None,
        gpu_ids: list[int] | None = None,
        start_timeout_s: float = 300.0,
        pg_timeout_s: float = 3600.0,
        error_grace_s: float = 10.0,
        run_non_cp_twin: bool = True,
        max_live_groups: int = 4,
        log_dir: str | None = None,
    ):
        import torch.multiprocessing  # noqa: F401  (registers tensor reductions)

        if max_cp_size is not None and (isinstance(max_cp_size, bool) or not isinstance(max_cp_size, int) or max_cp_size < 1):
            raise ExecutorError(f"max_cp_size: must be an int >= 1, got {max_cp_size!r}")
        if isinstance(max_live_groups, bool) or not isinstance(max_live_groups, int) or max_live_groups < 1:
            raise ExecutorError(f"max_live_groups: must be an int >= 1, got {max_live_groups!r}")
        self.max_live_groups = max_live_groups
        self.backends = {b.name: (b, spec) for b, spec in backends}
        self._max_cp_size = max_cp_size
        self._gpu_ids = gpu_ids
        self.start_timeout_s = start_timeout_s
        self.pg_timeout_s = pg_timeout_s
        self.error_grace_s = error_grace_s
        self.run_non_cp_twin = run_non_cp_twin
        self._log_dir = log_dir
        self._owns_log_dir = log_dir is None  # the temporary directory made lazily: removed by close()
        self._ctx = multiprocessing.get_context("spawn")
        self._groups: dict[tuple[str, int], _Group] = {}  # insertion order = least recently used first
        self._start_errors: dict[tuple[str, int], list[str]] = defaultdict(list)
        self._log_count = 0
        self.restarts = 0  # groups started again after a crash, a timeout or a poisoned task

    @property
    def log_dir(self) -> str:
        """Where the ranks' stderr logs go (a temporary directory, made at the first group start)."""
        if self._log_dir is None or (self._owns_log_dir and not os.path.isdir(self._log_dir)):
            self._log_dir = tempfile.mkdtemp(prefix="attnfuzz-cp-ranks-")
        return self._log_dir

    # ------------------------------------------------------------------ capacity
    def _cuda_device_count(self) -> int:
        if self._gpu_ids is not None:
            return len(self._gpu_ids)
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    def _capacity(self, device: str) -> int:
        """How many ranks a group of backends on ``device`` can have here."""
        if device == "cuda":
            return self._cuda_device_count()
        return self._max_cp_size or 2

    @property
    def max_cp_size(self) -> int:
        """The largest power-of-two ``cp_size`` every CP backend here can run (1 = none): what
        generation should draw up to."""
        devices = {b.device for b, _ in self.backends.values() if is_cp_backend(b)}
        if not devices:
            return 1
        limit = min(self._capacity(d) for d in devices)
        if self._max_cp_size is not None:
            limit = min(limit, self._max_cp_size)
        size = 1
        while size * 2 <= limit:
            size *= 2
        return size

    def availability(self) -> dict[str, str | None]:
        """Per backend: None when it can run CP cases here, else why not (starts nothing)."""
        result: dict[str, str | None] = {}
        for name, (backend, _) in self.backends.items():
            if not is_cp_backend(backend):
                result[name] = f"{name} does not declare capabilities.cp or has no run_cp"
            elif self._capacity(backend.device) < 2:
                result[name] = f"context parallelism needs >= 2 {backend.device} devices, found {self._capacity(backend.device)}"
            else:
                result[name] = None
        return result

    def group_pids(self, environment: str, cp_size: int) -> list[int]:
        """Process ids of the ranks of the live group ``(environment, cp_size)``, rank order
        (empty when that group is not alive)."""
        group = self._groups.get((environment, cp_size))
        return list(group.pids) if group is not None and group.is_alive() else []

    # ------------------------------------------------------------------ groups
    def _environment(self, name: str) -> str:
        return self.backends[name][0].environment

    def _start(self, environment: str, cp_size: int) -> _Group:
        import torch.distributed as dist

        members = [(spec, b.name) for b, spec in self.backends.values() if b.environment == environment]
        env_vars: dict[str, str] = {}
        device = "cpu"
        for b, _ in self.backends.values():
            if b.environment == environment:
                env_vars.update(b.env_vars)
                device = b.device
        gpu_ids = self._gpu_ids if self._gpu_ids is not None else list(range(self._cuda_device_count()))
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        processes, conns, logs = [], [], []
        self._log_count += 1
        for rank in range(cp_size):
            log = ChildLog(os.path.join(self.log_dir, f"{environment}.cp{cp_size}.{self._log_count}.rank{rank}.log"))
            parent_conn, child_conn = self._ctx.Pipe(duplex=True)
            process = self._ctx.Process(
                target=_rank_main,
                args=(
                    child_conn, rank, cp_size, store.port, members, env_vars, log.child_end, device,
                    gpu_ids[rank] if device == "cuda" else -1, self.start_timeout_s, self.pg_timeout_s,
                ),
                daemon=True,
                name=f"attnfuzz-cp{cp_size}-{environment}-rank{rank}",
            )
            from fuzzer.environment import child_library_env, resolve_cudnn_choice
            # the same cuDNN as every other backend child (fuzzer.environment), set before exec
            try:
                with environment_set(child_library_env(resolve_cudnn_choice())):
                    process.start()
            finally:
                log.started()
            child_conn.close()
            processes.append(process)
            conns.append(parent_conn)
            logs.append(log)
        group = _Group(environment, cp_size, processes, conns, logs, store)
        pids: dict[int, int] = {}
        deadline = time.monotonic() + self.start_timeout_s
        while len(pids) < cp_size:
            waiting = [c for r, c in enumerate(conns) if r not in pids]
            ready = mp_connection.wait(waiting, max(deadline - time.monotonic(), 0.0))
            if not ready:
                late = [r for r in range(cp_size) if r not in pids]
                self._kill_group(group)
                raise _StartError(
                    f"ranks {late} of the cp_size={cp_size} group did not start within {self.start_timeout_s:g} s\n"
                    + self._tails(group, late)
                )
            for conn in ready:
                rank = conns.index(conn)
                try:
                    _, pid, availability = conn.recv()
                except (EOFError, OSError):
                    processes[rank].join(5)
                    self._kill_group(group)
                    raise _StartError(
                        f"rank {rank} of the cp_size={cp_size} group died at start "
                        f"(exit code {processes[rank].exitcode})\n" + self._tails(group, [rank])
                    ) from None
                pids[rank] = pid
                if rank == 0:
                    group.availability = availability
        group.pids = [pids[r] for r in range(cp_size)]
        return group

    def _ensure_group(self, environment: str, cp_size: int) -> _Group:
        key = (environment, cp_size)
        group = self._groups.pop(key, None)
        if group is not None and not group.is_alive():  # a rank died since its last task
            self._kill_group(group)
            self.restarts += 1
            group = None
        if group is None:
            errors = self._start_errors[key]
            if len(errors) >= _START_ATTEMPTS:
                raise _StartError(f"not retried after {len(errors)} failed starts; last: {errors[-1]}")
            while len(self._groups) >= self.max_live_groups:
                self._stop_group(next(iter(self._groups)))
            try:
                group = self._start(environment, cp_size)
            except _StartError as exc:
                errors.append(str(exc))
                raise
        self._groups[key] = group  # now the most recently used
        return group

    def _kill_group(self, group: _Group) -> None:
        for process in group.processes:
            if process.is_alive():
                kill_tree(process.pid)  # with what the rank started, a detached process included
        for process in group.processes:
            process.join(10)
        for conn in group.conns:
            conn.close()
        group.store = None

    def _kill(self, group: _Group) -> None:
        """Kill ``group`` (after a timeout, a crash or a poisoned task); the next task starts it again."""
        self._groups.pop(group.key, None)
        self._kill_group(group)
        self.restarts += 1

    def _stop_group(self, key: tuple[str, int]) -> None:
        """Stop the group ``key`` politely (then by force)."""
        group = self._groups.pop(key, None)
        if group is None:
            return
        for conn in group.conns:
            try:
                conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
        for process in group.processes:
            process.join(5)
        self._kill_group(group)

    def _tails(self, group: _Group, ranks: list[int]) -> str:
        return "\n".join(
            f"--- rank {r} stderr (tail) ---\n{group.logs[r].tail(ended=not group.processes[r].is_alive())}" for r in ranks
        )

    # ------------------------------------------------------------------ running
    def run(
        self, case: AttentionCase, inputs: Any, tasks: list[tuple[str, str]], timeout_s: float
    ) -> list[TaskOutcome]:
        """Run ``tasks`` (``(backend, variant)``) on ``case`` under CP; one outcome per task, in order.

        Args:
            case: a case with ``cp_size > 1``.
            inputs: the full `oracle.inputs.AttentionInputs` on the worker's device.
            tasks: the calls to make.
            timeout_s: per-task wall-clock limit in seconds (twin included).

        Returns:
            One `CPTaskOutcome` per task; outputs gathered into the full canonical
            layout on the inputs' device.

        Raises:
            ExecutorError: ``case.cp_size == 1`` (route such cases to the usual executor).
        """
        if case.cp_size < 2:
            raise ExecutorError(f"cp_size: CPExecutor runs cases with cp_size > 1, got {case.cp_size}")
        device = inputs.q.device
        outcomes: dict[int, TaskOutcome] = {}
        by_env: dict[str, list[int]] = {}
        for i, (name, variant) in enumerate(tasks):
            entry = self.backends.get(name)
            if entry is None or not is_cp_backend(entry[0]):
                outcomes[i] = CPTaskOutcome(name, variant, "unsupported", detail=f"{name} cannot run context parallelism here")
            elif self._capacity(entry[0].device) < case.cp_size:
                outcomes[i] = CPTaskOutcome(
                    name, variant, "unsupported",
                    detail=f"cp_size={case.cp_size} needs {case.cp_size} {entry[0].device} ranks, "
                    f"this host offers {self._capacity(entry[0].device)}",
                )
            else:
                by_env.setdefault(self._environment(name), []).append(i)
        if by_env:
            host_inputs = inputs.to("cpu") if device.type != "cpu" else inputs
            try:
                shards = [shard_inputs(case, host_inputs, case.cp_size, r) for r in range(case.cp_size)]
            except CPShardError as exc:
                for indices in by_env.values():
                    for i in indices:
                        outcomes[i] = CPTaskOutcome(
                            *tasks[i], "error", detail=f"cannot shard the inputs: {exc}", exception_type="CPShardError"
                        )
                by_env = {}
            for environment, indices in by_env.items():
                pending = list(indices)
                stalls = 0
                while pending:
                    try:
                        group = self._ensure_group(environment, case.cp_size)
                    except _StartError as exc:
                        for i in pending:
                            outcomes[i] = CPTaskOutcome(*tasks[i], "crash", detail=f"CP group did not start: {exc}")
                        break
                    left = self._run_in_group(group, case, shards, host_inputs, tasks, pending, timeout_s, outcomes)
                    stalls = stalls + 1 if left == pending else 0
                    if stalls >= 2:
                        outcomes[pending[0]] = CPTaskOutcome(
                            *tasks[pending[0]], "crash", detail="CP group died before starting the task, twice in a row"
                        )
                        left, stalls = pending[1:], 0
                    pending = left
        result = [outcomes[i] for i in range(len(tasks))]
        for outcome in result:
            outcome.output = _to_device(outcome.output, device)
            twin = getattr(outcome, "non_cp", None)
            if twin is not None:
                twin.output = _to_device(twin.output, device)
        return result

    def _run_in_group(self, group, case, shards, full_inputs, tasks, pending, timeout_s, outcomes) -> list[int]:
        """Send ``pending`` to every rank of ``group``; settle them one by one; return those left
        when the group had to be killed."""
        n = group.cp_size
        batch = [tasks[i] for i in pending]
        for rank, conn in enumerate(group.conns):
            twin_inputs = full_inputs if rank == 0 and self.run_non_cp_twin else None
            try:
                conn.send(("run", case.to_json(), shards[rank], twin_inputs, batch))
            except (BrokenPipeError, OSError):
                self._kill(group)
                return pending
        answers: dict[int, dict[int, TaskOutcome]] = defaultdict(dict)
        twins: dict[int, TaskOutcome] = {}
        doing: dict[int, str] = {}
        for k in range(len(batch)):
            started = time.monotonic()
            failed_at: float | None = None
            while len(answers[k]) < n:
                deadline = started + timeout_s
                if failed_at is not None:
                    deadline = min(deadline, failed_at + self.error_grace_s)
                now = time.monotonic()
                if now >= deadline:
                    outcomes[pending[k]] = self._stuck_outcome(group, batch[k], answers[k], twins.get(k), timeout_s, doing)
                    self._kill(group)
                    return pending[k + 1 :]
                waiting = [c for c in group.conns if not c.closed]
                for conn in mp_connection.wait(waiting, deadline - now):
                    rank = group.conns.index(conn)
                    try:
                        message = conn.recv()
                    except (EOFError, OSError):
                        group.processes[rank].join(10)
                        outcomes[pending[k]] = self._death_outcome(group, rank, batch[k], answers[k], twins.get(k))
                        self._kill(group)
                        return pending[k + 1 :]
                    kind, index = message[0], message[1]
                    if kind == "twin_start":
                        doing[rank] = f"the non-CP twin of task {index}"
                    elif kind == "twin_done":
                        twins[index] = message[2]
                    elif kind == "start":
                        doing[rank] = f"the CP run of task {index}"
                    elif kind == "done":
                        answers[index][rank] = message[2]
                        doing[rank] = f"idle after task {index}"
                        if index == k and message[2].status != "ok" and failed_at is None:
                            failed_at = time.monotonic()
            outcome, poisoned = self._combine(case, batch[k], answers[k], twins.get(k), n)
            outcomes[pending[k]] = outcome
            if poisoned:
                self._kill(group)
                return pending[k + 1 :]
        return []

    @staticmethod
    def _summary(answers: dict[int, TaskOutcome]) -> str:
        """``rank r: status: detail`` lines, ranks with equal (status, detail) joined."""
        seen: dict[tuple[str, str], list[int]] = {}
        for rank in sorted(answers):
            a = answers[rank]
            seen.setdefault((a.status, a.detail), []).append(rank)
        return "\n".join(
            f"rank{'s' if len(r) > 1 else ''} {','.join(map(str, r))}: {status}" + (f": {detail}" if detail else "")
            for (status, detail), r in seen.items()
        )

    def _combine(self, case, task, answers, twin, n) -> tuple[CPTaskOutcome, bool]:
        """One outcome from every rank's; ``poisoned`` when the ranks disagree on the status."""
        name, variant = task
        statuses = [answers[r].status for r in range(n)]
        run_ms = max(a.run_ms for a in answers.values())
        compile_ms = max(a.compile_ms for a in answers.values())
        common = dict(run_ms=run_ms, compile_ms=compile_ms, non_cp=twin, rank_status=statuses)
        if all(s == "ok" for s in statuses):
            try:
                output = gather_outputs(case, n, [answers[r].output for r in range(n)])
            except CPShardError as exc:
                return CPTaskOutcome(name, variant, "error", detail=f"gathering the ranks' outputs: {exc}",
                                     exception_type="CPShardError", **common), False
            output.extra.update(cp_size=n, cp_comm_type=case.cp_comm_type)
            return CPTaskOutcome(name, variant, "ok", output=output, **common), False
        worst = min(range(n), key=lambda r: (_SEVERITY.index(statuses[r]), r))
        chosen = answers[worst]
        return (
            CPTaskOutcome(name, variant, chosen.status, detail=self._summary(answers),
                          exception_type=chosen.exception_type, **common),
            len(set(statuses)) > 1,
        )

    def _stuck_outcome(self, group, task, answers, twin, timeout_s, doing) -> CPTaskOutcome:
        """Some ranks did not answer in time: ``timeout`` naming them, or, when another rank had
        already failed, that rank's status."""
        name, variant = task
        n = group.cp_size
        missing = [r for r in range(n) if r not in answers]
        statuses = [answers[r].status if r in answers else "missing" for r in range(n)]
        where = "; ".join(f"rank {r} was running {doing.get(r, 'nothing yet')}" for r in missing)
        failed = [r for r in sorted(answers) if answers[r].status != "ok"]
        if failed:
            chosen = answers[failed[0]]
            detail = (
                f"{self._summary(answers)}\nranks {missing} did not answer within {self.error_grace_s:g} s after "
                f"rank {failed[0]} failed (waiting in a collective?); {where}; group killed\n{self._tails(group, missing)}"
            )
            return CPTaskOutcome(name, variant, chosen.status, detail=detail, exception_type=chosen.exception_type,
                                 non_cp=twin, rank_status=statuses)
        detail = (
            f"no result from rank{'s' if len(missing) > 1 else ''} {','.join(map(str, missing))} of cp_size={n} "
            f"after {timeout_s:g} s; {where}; group killed\n{self._tails(group, missing)}"
        )
        return CPTaskOutcome(name, variant, "timeout", detail=detail, non_cp=twin, rank_status=statuses)

    def _death_outcome(self, group, rank, task, answers, twin) -> CPTaskOutcome:
        """Rank ``rank`` died: ``crash`` (or ``oom`` for a SIGKILL we did not send)."""
        name, variant = task
        code = group.processes[rank].exitcode
        statuses = [answers[r].status if r in answers else "missing" for r in range(group.cp_size)]
        statuses[rank] = "died"
        tail = self._tails(group, [rank])
        if code is not None and code < 0:
            sig = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            if code == -signal.SIGKILL:
                detail = f"rank {rank} killed by SIGKILL (likely out of memory)\n{tail}"
                return CPTaskOutcome(name, variant, "oom", detail=detail,
                                     non_cp=twin, rank_status=statuses)
            return CPTaskOutcome(name, variant, "crash", detail=f"rank {rank} died with signal {sig}\n{tail}",
                                 non_cp=twin, rank_status=statuses)
        return CPTaskOutcome(name, variant, "crash", detail=f"rank {rank} exited with code {code}\n{tail}",
                             non_cp=twin, rank_status=statuses)

    def close(self) -> None:
        """Stop every live group (politely, then by force) and remove the temporary stderr
        directory this executor made (one given as ``log_dir`` is kept)."""
        for key in list(self._groups):
            self._stop_group(key)
        if self._owns_log_dir and self._log_dir is not None:
            import shutil

            shutil.rmtree(self._log_dir, ignore_errors=True)

    def __enter__(self) -> CPExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RoutingExecutor:
    """The worker's executor for cases without CP and a `CPExecutor` for cases with CP, behind
    the one executor interface: ``run`` sends a case to ``cp`` when ``case.cp_size > 1``.

    Args:
        default: the usual executor (`fuzzer.executor.ChildProcessExecutor` or ``InProcessExecutor``).
        cp: the `CPExecutor`.
    """

    def __init__(self, default: Any, cp: CPExecutor):
        self.default = default
        self.cp = cp

    @property
    def max_cp_size(self) -> int:
        """`CPExecutor.max_cp_size` (what generation may draw up to)."""
        return self.cp.max_cp_size

    @property
    def restarts(self) -> int:
        """Restarts of both executors."""
        return getattr(self.default, "restarts", 0) + self.cp.restarts

    def availability(self) -> dict[str, str | None]:
        """The default executor's availability (CP-only limits show up as ``max_cp_size``)."""
        return self.default.availability()

    def run(self, case: AttentionCase, inputs: Any, tasks: list[tuple[str, str]], timeout_s: float) -> list[TaskOutcome]:
        """Run ``tasks`` on the executor ``case.cp_size`` selects."""
        executor = self.cp if case.cp_size > 1 else self.default
        return executor.run(case, inputs, tasks, timeout_s)

    def submit(
        self, case: AttentionCase, inputs: Any, tasks: list[tuple[str, str]], timeout_s: float, *, skip_busy: bool = False
    ) -> Any:
        """`fuzzer.executor.submit_run` on the executor ``case.cp_size`` selects: the default
        executor's concurrent run (with ``skip_busy``: lanes, when it supports them), or a
        `fuzzer.executor.DeferredRun` (the CP executor runs its rank groups when collected)."""
        executor = self.cp if case.cp_size > 1 else self.default
        return submit_run(executor, case, inputs, tasks, timeout_s, skip_busy=skip_busy)

    @property
    def supports_lanes(self) -> bool:
        """Whether the default executor takes ``skip_busy`` (CP cases always run whole)."""
        return bool(getattr(self.default, "supports_lanes", False))

    def close(self) -> None:
        """Close both executors."""
        try:
            self.cp.close()
        finally:
            self.default.close()

    def __enter__(self) -> RoutingExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_executor_with_cp(
    backends: list[tuple[Backend, str]],
    isolation: str = "process",
    memory_limit_bytes: int | None = None,
) -> Any:
    """`fuzzer.evaluate.make_executor` for ``backends``, with a `RoutingExecutor` in front (a
    `CPExecutor` for the ``cp_size > 1`` cases) when a CP backend is among them.

    Raises:
        ValueError: ``isolation`` is unknown.
    """
    from fuzzer.evaluate import make_executor

    executor = make_executor(backends, isolation, memory_limit_bytes)
    if any(is_cp_backend(b) for b, _ in backends):
        executor = RoutingExecutor(executor, CPExecutor(backends))
    return executor


__all__ = ["CP_RANK_ENV", "CPExecutor", "CPTaskOutcome", "RoutingExecutor", "make_executor_with_cp"]
