"""Running backends, isolated in persistent child processes.

One idea (the module is over 600 lines): running backend calls in persistent child processes and
turning every way a call can end (result, exception, crash, hang, OOM) into a `TaskOutcome`.

Each backend *environment* (``Backend.environment``: backends that can share process-wide state,
e.g. TE's ``NVTE_*`` selection variables) gets one child process, started on first use and reused
across cases. The parent (the worker) generates the inputs and computes the float64 oracle once
per case and sends the inputs to the children; children return outputs on the CPU. Tensors up to
``BYTES_TRANSPORT_MAX`` bytes travel as plain bytes in the pipe message (`PackedTensor`: one copy,
no shared-memory segment or CUDA IPC handle to create, pass and release per tensor, which cost
more than the copy for the small tensors of most cases); larger ones go through
``torch.multiprocessing``: a CPU tensor as a copy in shared memory made before sending
(`shared_copy`: never the sender's own tensor, which the oracle reads meanwhile), a CUDA tensor
as a CUDA IPC handle. A forward-only case sends no ``dout`` (the child gets zeros of its shape).

Isolation of a call (`run_task`): a backend gets its own copy of the inputs (`own_inputs`) and,
after the call, that copy is compared with the originals (`mutated_inputs`); one that wrote into
its inputs gets an ``error`` outcome (`INPUT_MUTATED`), and the other backends, in the same child
or not, and the oracle see the inputs unchanged. An output that reuses a buffer of the previous
call's output (`OutputReuse`) is an ``error`` too (`OUTPUT_REUSED`); every output leaves the
child as a copy (bytes, or `shared_copy`), so the earlier call's verdict stands. An output that
is no `BackendOutput`, holds a field that is no tensor or a tensor off the backend's device is
``error`` (`INVALID_OUTPUT`); a ``compile_ms`` that is no finite number >= 0 is taken as 0.

Threads: each child and the worker itself run torch with `configure_torch_threads` (default one
intra-op thread, ``$ATTNFUZZ_TORCH_THREADS`` to change it): the worker and its children take turns
on the cores, and torch's default of one thread per core makes every process spin and contend on a
loaded machine (4 to 18 times slower per case on a busy 2-core machine than one thread).

Concurrency: with parallelism on (`ChildProcessExecutor`'s ``parallel``; by default on when the
inputs are on a CUDA device, ``$ATTNFUZZ_PARALLEL_CHILDREN`` ``1``/``0`` to force it) the
environments of a case run at the same time, one parent thread per environment driving its child,
and `ChildProcessExecutor.submit` starts them and returns at once, so the worker computes the
oracle while the children run (`fuzzer.evaluate.Evaluator.evaluate`). Executors without real
concurrency run when their result is collected (`DeferredRun`, `submit_run`).

A child that dies (segfault, abort, a CUDA fatal error that poisons its context) turns the backend
call in flight into a ``crash`` outcome with the last lines of the child's stderr; one that runs
past the timeout is killed and becomes ``timeout``; ``torch.OutOfMemoryError``, ``MemoryError``
(host memory, e.g. under an ``RLIMIT_AS``), a SIGKILL that the executor did not send (the kernel's
OOM killer) and a child whose resident memory passes ``memory_limit_bytes`` (the executor watches
it and kills the child) become ``oom``. The child is restarted and the remaining tasks of the
case run in the new child, so no result is lost. On Linux a child dies with its parent
(``PR_SET_PDEATHSIG``): a worker killed by SIGKILL leaves no child running a kernel. A child
ignores SIGINT and SIGTERM (its worker stops it; `become_child`). Its stdout and stderr go
through a pipe to a log file its worker keeps under `LOG_MAX_BYTES` (`ChildLog`), whose last
lines a crash or a hang reports.

Protocol (parent -> child): ``("run", case_json, pack_inputs(case, inputs), [(backend_name, variant), ...])`` and
``("stop",)``. Child -> parent: ``("ready", {name: availability})`` once, then for each task
``("start", i)`` and ``("done", i, outcome_dict)``.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import math
import multiprocessing
import os
import re
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fuzzer.backends.base import Backend, BackendOutput, DeclarationGapError, UnsupportedCaseError, environment_set
from fuzzer.guard import GUARD, PluginCallError, str_or_none
from oracle.config import AttentionCase
from oracle.errors import AttnFuzzError

# Substrings of exception messages after which a CUDA context is unusable: the child must die.
_FATAL_CUDA_MARKERS = (
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "CUDA error: misaligned address",
    "an illegal instruction was encountered",
    "CUDA_ERROR_ILLEGAL_ADDRESS",
)
_STDERR_TAIL_LINES = 30
# torch's CPU allocator raises RuntimeError with these when malloc fails
_HOST_OOM_MARKERS = ("can't allocate memory", "not enough memory")
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
#: ``exception_type`` (so signature ``error:declaration_gap``) of a `DeclarationGapError`.
DECLARATION_GAP = "declaration_gap"
#: The parts of `TaskOutcome.timing` (milliseconds), where a child's task spends time besides the
#: library call (``run_ms``/``compile_ms``). Child side: ``unpack`` (the message's inputs rebuilt,
#: on the first task of a message), ``to_device`` (inputs moved to the backend's device),
#: ``pack`` (the output to the host and packed), ``runtime`` (the check for newly loaded runtime
#: libraries), ``guard`` (the call's own copy of its inputs made, and checked against the
#: originals after it: `own_inputs`, `mutated_inputs`). Parent side: ``send_wait`` (waiting for the send lock), ``send`` (pickling and
#: writing the message), ``deliver`` (from the send to the child's first "start": its read and
#: ``unpack``), ``transfer`` (a task's round trip less the child's own parts: pipes, pickling,
#: scheduling), ``collect`` (the output unpacked and moved to the worker's device),
#: ``env_wall`` (on an environment's first outcome of a run: its whole wall time).
TASK_TIMING_PARTS = (
    "unpack", "to_device", "guard", "pack", "runtime", "send_wait", "send", "deliver", "transfer", "collect", "env_wall",
)
#: `TaskOutcome.status` of a task not run because another variant of its backend crashed or timed
#: out on the same case (`ChildProcessExecutor.skip_after_crash`); the evaluator records no result.
SKIPPED = "skipped"
#: `TaskOutcome.status` of a task not run because its environment's child was still busy with an
#: earlier case when this one was submitted with ``skip_busy`` (lanes: `ChildProcessExecutor.submit`);
#: the evaluator records no result and counts it (`fuzzer.evaluate.Evaluation.busy`).
BUSY = "busy"
#: Set to a directory: every child profiles its serving loop (cProfile) and writes
#: ``child-<backends>-<pid>.prof`` there when it stops (diagnostics; `benchmarks/gpu/`).
PROFILE_DIR_ENV = "ATTNFUZZ_PROFILE_DIR"
BYTES_TRANSPORT_MAX = 8 * 2**20  # bytes: tensors up to this size travel as bytes, larger ones as handles
#: ``exception_type`` (signature ``error:InputMutated``) of a call that wrote into its inputs.
INPUT_MUTATED = "InputMutated"
#: ``exception_type`` (signature ``error:OutputReused``) of a call whose output reuses a buffer of
#: the previous call's output (that output would change under its verdict).
OUTPUT_REUSED = "OutputReused"
#: ``exception_type`` (signature ``error:InvalidOutput``) of a call that returned no
#: `BackendOutput`, a field that is no tensor, or a tensor off the backend's device (the
#: evaluator adds what the case asks: `fuzzer.evaluate.output_problems`).
INVALID_OUTPUT = "InvalidOutput"
THREADS_ENV = "ATTNFUZZ_TORCH_THREADS"
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


def configure_torch_threads(threads: int | None = None) -> int:
    """Set torch's intra-op threads of this process (and one inter-op thread when still possible).

    Args:
        threads: how many; None: ``$ATTNFUZZ_TORCH_THREADS`` if set, else 1.

    Returns:
        The number set.

    Raises:
        ExecutorError: the count (argument or variable) is not a positive integer.
    """
    import torch

    if threads is None:
        text = os.environ.get(THREADS_ENV, "1").strip()
        try:
            threads = int(text)
        except ValueError:
            raise ExecutorError(f"{THREADS_ENV}: must be a positive integer, got {text!r}") from None
    if threads < 1:
        raise ExecutorError(f"{THREADS_ENV}: must be a positive integer, got {threads!r}")
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # only allowed before the first parallel work of the process
        pass
    return threads


@dataclass(frozen=True)
class PackedTensor:
    """A tensor as plain bytes for the pipe to a child: ``dtype`` (torch name, e.g.
    ``"bfloat16"``), ``shape``, ``device`` (``"cpu"``, ``"cuda:0"``: where it was) and the
    C-contiguous bytes. `unpack` gives it back on the CPU, same dtype, shape and values."""

    dtype: str
    shape: tuple[int, ...]
    device: str
    data: bytes

    @classmethod
    def pack(cls, tensor: Any) -> Any:
        """``tensor`` as a `PackedTensor` if it holds at most ``BYTES_TRANSPORT_MAX`` bytes (a
        copy to the host for a CUDA tensor); a larger CPU tensor as a copy in shared memory, made
        here (`shared_copy`); a larger CUDA tensor itself (a CUDA IPC handle when pickled); None
        stays None."""
        import torch

        if tensor is None or not isinstance(tensor, torch.Tensor):
            return tensor
        if tensor.numel() * tensor.element_size() > BYTES_TRANSPORT_MAX:
            return shared_copy(tensor) if tensor.device.type == "cpu" else tensor
        host = tensor.detach().to("cpu").contiguous()
        data = host.view(-1).view(torch.uint8).numpy().tobytes() if host.numel() else b""
        return cls(str(host.dtype).removeprefix("torch."), tuple(host.shape), str(tensor.device), data)

    def unpack(self) -> Any:
        import torch

        dtype = getattr(torch, self.dtype)
        if not self.data:
            return torch.empty(self.shape, dtype=dtype)
        return torch.frombuffer(bytearray(self.data), dtype=torch.uint8).view(dtype).reshape(self.shape)


def shared_copy(tensor: Any) -> Any:
    """A copy of the CPU tensor ``tensor`` in shared memory (same dtype, shape and values), made
    in the calling thread: what a larger tensor travels as (`PackedTensor.pack`).

    Why a copy: pickling a CPU tensor for the pipe (torch's reducer) moves *its own* storage into
    shared memory, in place, in the thread that sends. The inputs were sent from an environment
    thread while the worker's main thread read the same tensors for the oracle: the storage
    changed under the oracle and the worker died with SIGSEGV (``--backend torch-cpu-math``, a
    corpus case just over ``BYTES_TRANSPORT_MAX``, 2 runs in 3); and the child then shared the
    worker's own inputs, so a backend that wrote into them changed the oracle's (an innocent
    backend failed with an error ratio of 714,848 while the culprit passed). An output was the
    backend's own buffer moved into shared memory, so a plugin that reused it for its next call
    changed the output already sent."""
    return tensor.detach().clone().share_memory_()


def _unpack(value: Any) -> Any:
    return value.unpack() if isinstance(value, PackedTensor) else value


def pack_inputs(case: AttentionCase, inputs: Any) -> dict[str, Any]:
    """`oracle.inputs.AttentionInputs` as a dict of `PackedTensor` (or large tensors) for a child;
    ``dout`` is left out of a forward-only case. Inverse: `unpack_inputs`."""
    import dataclasses

    names = [f.name for f in dataclasses.fields(inputs) if case.backward or f.name != "dout"]
    packed = {name: PackedTensor.pack(getattr(inputs, name)) for name in names}
    if not case.backward:  # not read: a lazy dout (oracle.inputs.AttentionInputs) stays unbuilt
        shape, dtype = inputs.dout_meta if hasattr(type(inputs), "dout_meta") else (inputs.dout.shape, inputs.dout.dtype)
        packed["dout"] = ("zeros", tuple(shape), str(dtype).removeprefix("torch."))
    return packed


def unpack_inputs(packed: dict[str, Any]) -> Any:
    """The `oracle.inputs.AttentionInputs` of `pack_inputs` (host tensors, or the shared ones)."""
    import torch

    from oracle.inputs import AttentionInputs

    fields = {}
    for name, value in packed.items():
        if isinstance(value, tuple) and value and value[0] == "zeros":
            fields[name] = torch.zeros(value[1], dtype=getattr(torch, value[2]))
        else:
            fields[name] = _unpack(value)
    return AttentionInputs(**fields)


def pack_output(output: Any) -> Any:
    """A `BackendOutput` whose tensors are `PackedTensor` where small enough (see `unpack_output`)."""
    if output is None:
        return None
    return BackendOutput(
        out=PackedTensor.pack(output.out),
        lse=PackedTensor.pack(output.lse),
        dq=PackedTensor.pack(output.dq),
        dk=PackedTensor.pack(output.dk),
        dv=PackedTensor.pack(output.dv),
        selected_kernel=output.selected_kernel,
        compile_ms=output.compile_ms,
        extra=dict(output.extra),
    )


def unpack_output(output: Any) -> Any:
    """Inverse of `pack_output` (tensors on the CPU)."""
    if output is None:
        return None
    for name in ("out", "lse", "dq", "dk", "dv"):
        setattr(output, name, _unpack(getattr(output, name)))
    return output


def die_with_parent(signum: int = signal.SIGKILL) -> bool:
    """Linux: have the kernel send ``signum`` to this process when the thread that started it
    ends (``prctl(PR_SET_PDEATHSIG)``; for a process started by a main thread, when its parent
    process ends, however it ends: SIGKILL included). Elsewhere nothing is done.

    Returns:
        False when the parent is already gone (this process was reparented: the signal will never
        come; the caller should stop), else True. The parent is the `multiprocessing` one of a
        process started so, else the parent pid before the call.
    """
    started_by = multiprocessing.parent_process()
    parent = started_by.pid if started_by is not None and started_by.pid else os.getppid()
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    return os.getppid() == parent


def adopt_orphans() -> bool:
    """Linux: make this process a *subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``): a process
    started below it whose parent ends (a double fork, a daemon, ``setsid ... &``) is re-parented
    to this process instead of init, so it stays in this process's tree (`descendants`) and is
    ended with it (`kill_tree`, `end_descendants`). Elsewhere nothing is done.

    Returns:
        Whether the kernel took the setting."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(pid: int) -> list[int]:
    """The pids of every living process below ``pid`` (children, theirs, ...), read from
    ``/proc/<n>/stat`` (Linux; elsewhere ``[]``); ``pid`` itself is not in it. A snapshot: a
    process may start or end right after."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat_line = handle.read()
        except OSError:  # ended meanwhile
            continue
        fields = stat_line[stat_line.rfind(b")") + 2:].split()  # after "(comm)": state, ppid, ...
        if len(fields) > 1 and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, stack = [], list(children.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children.get(child, []))
    return found


def kill_tree(pid: int, *, include_root: bool = True) -> int:
    """SIGKILL ``pid`` (with ``include_root``) and every process below it (`descendants`): first
    each is stopped (SIGSTOP: it cannot start another), again until no new one appears, then all
    are killed. With ``pid`` a subreaper (`adopt_orphans`) this includes what detached itself.

    Returns:
        How many processes below ``pid`` were killed."""
    stopped: set[int] = set()
    if include_root:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGSTOP)
    for _ in range(32):  # each round stops what the last one's processes started before they stopped
        new = [p for p in descendants(pid) if p not in stopped]
        if not new:
            break
        for p in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGSTOP)
            stopped.add(p)
    for p in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)
    if include_root:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return len(stopped)


def end_descendants() -> int:
    """Kill every process below this one (`kill_tree` without this process): what a backend
    child does before it exits, so that nothing its backends started (detached or not) outlives
    it. Returns how many were killed."""
    return kill_tree(os.getpid(), include_root=False)


def become_child(log: Any) -> None:
    """What every child process of a worker does first (a backend child, a CP rank): die with its
    parent (`die_with_parent`, SIGKILL: the parent restarts children, a child keeps no state
    worth saving), exiting at once if the parent is already gone; ignore SIGINT and SIGTERM (the
    parent stops its children: a terminal's Ctrl-C or a scheduler's SIGTERM to the whole process
    group must not end one in the middle of a task, which would read as a crash of its backend);
    send its output to ``log`` (`log_output_to`); adopt what its backends start and detach
    (`adopt_orphans`), so that its worker ends those with it (`kill_tree`)."""
    if not die_with_parent(signal.SIGKILL):  # the parent died before the death signal was armed
        os._exit(0)
    adopt_orphans()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    log_output_to(log)


def resident_bytes(pid: int) -> int | None:
    """Resident set size of process ``pid`` in bytes (Linux ``/proc``), None if unknown."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class ExecutorError(AttnFuzzError):
    """The executor could not start a child process at all (not a backend failure)."""


@dataclass
class TaskOutcome:
    """What one (backend, variant) call produced.

    Attributes:
        backend, variant: the task.
        status: ``"ok"``, ``"unsupported"``, ``"error"``, ``"crash"``, ``"timeout"``, ``"oom"``
            or ``"skipped"`` (`SKIPPED`: not run, no result).
        output: the `BackendOutput` (tensors on the CPU or the worker's device) when ``ok``.
        run_ms: wall time of the call, milliseconds (compile time excluded when the adapter
            measured it).
        compile_ms: JIT compilation time reported by the adapter, milliseconds.
        detail: reason, exception text or stderr tail.
        exception_type: the exception class name for ``error`` (``declaration_gap`` for a
            `DeclarationGapError`: the library refused a case the adapter declared runnable).
        runtime: set by a child when this call loaded runtime libraries it had not reported yet
            (`child_runtime`, by backend name); the executor attributes later results to it.
        timing: where the task's time went outside the call itself, milliseconds by part (empty
            in process): `TASK_TIMING_PARTS`. Diagnostics only; never judged or stored.
    """

    backend: str
    variant: str
    status: str
    output: BackendOutput | None = None
    run_ms: float = 0.0
    compile_ms: float = 0.0
    detail: str = ""
    exception_type: str = ""
    runtime: dict[str, dict[str, str]] | None = None
    timing: dict[str, float] = field(default_factory=dict)

    def twin_outcome(self) -> TaskOutcome | None:
        """The outcome of the same task on this case's non-CP twin, run beside it: None here; a
        CP outcome (`fuzzer.cp.executor.CPTaskOutcome`) carries one."""
        return None

    def judged(self, case: AttentionCase, reference: Any, judge: Callable[[AttentionCase, TaskOutcome], Any]) -> tuple[Any, Any]:
        """``(judge(case, self), None)``: how the evaluator judges this outcome. A CP outcome
        (`fuzzer.cp.executor.CPTaskOutcome`) also judges its non-CP twin and adds the CP block
        (`fuzzer.cp.judge.judge_cp`), returning ``(result, twin_result)``; the core never names
        the CP wing.

        Args:
            case: the case of this outcome.
            reference: its oracle (`oracle.reference.ReferenceResult`; a twin shares it).
            judge: ``judge(case, outcome) -> CaseResult``.
        """
        return judge(case, self), None


def _is_fatal_cuda(exc: BaseException) -> bool:
    text = str(exc)
    return any(marker in text for marker in _FATAL_CUDA_MARKERS)


COMPILE_ERROR_TYPES = ("MLIRError", "CUDADialectError", "InductorError", "BackendCompilerFailed")
"""The exception type names of a JIT library's failed kernel build (FA4's CuTe DSL: ``MLIRError``,
``CUDADialectError``; torch.compile: ``InductorError``, ``BackendCompilerFailed``)."""


def run_task(backend: Backend, case: AttentionCase, inputs: Any, variant: str) -> TaskOutcome:
    """Call one backend in this process and classify the outcome (no process isolation).

    The backend gets its own copy of ``inputs`` (`own_inputs`), compared with ``inputs`` after
    the call (`mutated_inputs`): a call that wrote into it is an ``error`` outcome
    (`INPUT_MUTATED`) naming the tensors, and ``inputs`` stay as they were for the next call and
    the oracle. ``ok`` outcomes carry the output on the backend's device; an output of the wrong
    kind or off the device is ``error`` (`INVALID_OUTPUT`, `output_structure_problems`); a fatal
    CUDA error is reported as ``crash`` with ``detail`` starting with ``"fatal CUDA error"``.
    """
    moved = time.perf_counter()
    inputs = inputs_on(inputs, backend.device)
    copied = time.perf_counter()
    to_device_ms = (copied - moved) * 1000.0
    handed = own_inputs(inputs)
    start = time.perf_counter()
    guard_ms = (start - copied) * 1000.0
    outcome = _run_task_call(backend, case, handed, variant, start)
    if outcome.status != "ok":  # a call that raised took its time too (a compile that failed: a minute of flex)
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        if getattr(backend, "jit_compiled", False) and outcome.exception_type in COMPILE_ERROR_TYPES:  # a CP rank passes a wrapper
            # a failed build is compile time: the compile budget sees it (on the H200, 2026-12-02, nine
            # torch-flex InductorErrors took 127 s of a 600 s campaign, all counted as kernel time)
            outcome.compile_ms = elapsed_ms
        else:
            outcome.run_ms = elapsed_ms
    t_check = time.perf_counter()
    mutated = mutated_inputs(inputs, handed)
    if mutated and outcome.status != "crash":  # a crash ends the child: its inputs die with it
        outcome = _mutated_outcome(backend, variant, mutated, outcome)
    outcome.timing["to_device"] = to_device_ms
    outcome.timing["guard"] = guard_ms + (time.perf_counter() - t_check) * 1000.0
    return outcome


def _run_task_call(backend: Backend, case: AttentionCase, inputs: Any, variant: str, start: float) -> TaskOutcome:
    """The call of `run_task`, ``inputs`` already on the backend's device (``start``: its
    ``time.perf_counter()``)."""
    import torch

    try:
        output = backend.run(case, inputs, variant)
        if backend.device == "cuda":
            torch.cuda.synchronize()
    except UnsupportedCaseError as exc:
        return TaskOutcome(backend.name, variant, "unsupported", detail=str(exc))
    except DeclarationGapError as exc:  # the library refused what the adapter declared runnable
        return TaskOutcome(backend.name, variant, "error", detail=str(exc)[-2000:], exception_type=DECLARATION_GAP)
    except torch.OutOfMemoryError as exc:
        return TaskOutcome(backend.name, variant, "oom", detail=str(exc)[-2000:], exception_type="OutOfMemoryError")
    except MemoryError as exc:  # host memory (an RLIMIT_AS, or a failed malloc in Python)
        detail = f"host out of memory: MemoryError: {exc}"[-2000:]
        return TaskOutcome(backend.name, variant, "oom", detail=detail, exception_type="MemoryError")
    except RuntimeError as exc:
        if any(marker in str(exc) for marker in _HOST_OOM_MARKERS):  # torch's CPU allocator
            detail = f"host out of memory: {type(exc).__name__}: {exc}"[-2000:]
            return TaskOutcome(backend.name, variant, "oom", detail=detail, exception_type=type(exc).__name__)
        return _failed(backend, variant, exc)
    except Exception as exc:  # a backend bug or an undeclared limitation: recorded, never raised
        return _failed(backend, variant, exc)
    elapsed_ms = (time.perf_counter() - start) * 1000.0
    problems = output_structure_problems(output, getattr(backend, "device", "cpu"))
    if problems:
        detail = f"{backend.name}/{variant} returned an invalid output: " + "; ".join(problems)
        return TaskOutcome(backend.name, variant, "error", run_ms=elapsed_ms, detail=detail[:2000], exception_type=INVALID_OUTPUT)
    output.extra = {  # strings and numbers only (the docstring's rule): anything else would not pickle or store
        str(k)[:100]: v if isinstance(v, (str, int, float, bool)) or v is None else repr(v)[:200] for k, v in output.extra.items()
    }
    compile_ms = sane_ms(output.compile_ms)
    if compile_ms != output.compile_ms:  # NaN, inf, negative or no number: taken as no compile time, noted
        output.extra["compile_ms_reported"] = repr(output.compile_ms)[:80]
        output.compile_ms = compile_ms
    run_ms = max(elapsed_ms - compile_ms, 0.0)
    return TaskOutcome(backend.name, variant, "ok", output=output, run_ms=run_ms, compile_ms=compile_ms)


OUTPUT_TENSORS = ("out", "lse", "dq", "dk", "dv")


def sane_ms(value: Any) -> float:
    """``value`` as milliseconds for a result: a finite number >= 0 as a float, anything else
    (NaN, inf, a negative number, a string, None) 0.0. A plugin's NaN ``compile_ms`` reached the
    store's NOT NULL column as NULL and ended the worker with exit 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    value = float(value)
    return value if math.isfinite(value) and value >= 0.0 else 0.0


def output_structure_problems(output: Any, device: str | None) -> list[str]:
    """What is wrong with ``output`` as a backend's return value, before any of it is moved or
    judged (empty: nothing): no `BackendOutput`; a tensor field (`OUTPUT_TENSORS`) that is
    neither None nor a ``torch.Tensor``; a tensor not on ``device`` (the backend's: a CUDA
    backend that computed on the host is not the kernel under test); ``extra`` no dict;
    ``selected_kernel`` neither None nor a string.

    Args:
        output: what ``Backend.run`` returned.
        device: ``"cpu"`` or ``"cuda"``, the backend's declared device; None: not checked (the
            executor moved the output since).
    """
    import torch

    if not isinstance(output, BackendOutput):
        return [f"expected a fuzzer.backends.base.BackendOutput, got {type(output).__name__}"]
    problems = []
    for name in OUTPUT_TENSORS:
        value = getattr(output, name)
        if value is None:
            continue
        if not isinstance(value, torch.Tensor):
            problems.append(f"{name}: expected a torch.Tensor or None, got {type(value).__name__}")
        elif device is not None and value.device.type != device:
            problems.append(f"{name}: on {value.device.type}, expected {device} (the backend's device)")
    if not isinstance(output.extra, dict):
        problems.append(f"extra: expected a dict, got {type(output.extra).__name__}")
    if output.selected_kernel is not None and not isinstance(output.selected_kernel, str):
        problems.append(f"selected_kernel: expected a str or None, got {type(output.selected_kernel).__name__}")
    return problems


def own_inputs(inputs: Any) -> Any:
    """A copy of ``inputs`` (`oracle.inputs.AttentionInputs`, `fuzzer.backends.base.CPShardInputs`,
    a stand-in) whose tensors are clones: what a backend call gets, so that a backend that writes
    into its inputs changes neither the next backend's nor the oracle's. Other attributes are
    shared; a lazy ``dout`` not built yet stays lazy (it builds a tensor of its own). An object
    without attributes is returned as it is."""
    import torch

    state = getattr(inputs, "__dict__", None)
    if state is None:
        return inputs
    try:
        copy = object.__new__(type(inputs))
    except TypeError:  # a type whose own __new__ must make it (types.SimpleNamespace)
        copy = type(inputs).__new__(type(inputs))
    copy.__dict__.update({k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in state.items()})
    return copy


def mutated_inputs(originals: Any, handed: Any) -> list[str]:
    """The names of the tensors of ``originals`` that ``handed`` (`own_inputs` of them, after a
    call) no longer holds bit for bit (NaN where NaN was counts as kept), in field order; an
    attribute replaced by another object counts as written."""
    import torch

    state = getattr(originals, "__dict__", None)
    if state is None or handed is originals:
        return []
    after = vars(handed)
    names = []
    for name, before in state.items():
        if not isinstance(before, torch.Tensor) or name not in after:
            continue
        now = after[name]
        if not isinstance(now, torch.Tensor) or not _same_values(before, now):
            names.append(name)
    return names


def _same_values(a: Any, b: Any) -> bool:
    """Whether two tensors hold the same dtype, shape and values (NaN equal to NaN)."""
    import torch

    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    if torch.equal(a, b):
        return True
    if not (a.is_floating_point() or a.is_complex()):
        return False
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def _mutated_outcome(backend: Backend, variant: str, names: list[str], outcome: TaskOutcome) -> TaskOutcome:
    """The ``error`` outcome (`INPUT_MUTATED`) of a call that wrote into its inputs ``names``."""
    was = f" (the call itself ended {outcome.status}{': ' + outcome.detail[:300] if outcome.detail else ''})" if outcome.status != "ok" else ""
    detail = (
        f"{backend.name}/{variant} wrote into its inputs {', '.join(names)}: a backend must not modify them in place "
        f"(it ran on a copy of its own; the other backends and the oracle saw them unchanged; its output is not judged){was}"
    )
    return TaskOutcome(
        backend.name, variant, "error", run_ms=outcome.run_ms, compile_ms=outcome.compile_ms,
        detail=detail[:2000], exception_type=INPUT_MUTATED, runtime=outcome.runtime, timing=outcome.timing,
    )


class OutputReuse:
    """Tells a call whose output reuses a buffer of the previous call's output (in one process:
    a child's consecutive tasks, or the in-process executor's). It holds no tensor: only weak
    references to the previous output's storages (`torch.multiprocessing.reductions.StorageWeakRef`),
    so a buffer freed since (its address free for the allocator) is no reuse, and one the backend
    kept and filled again is."""

    def __init__(self) -> None:
        self._previous: tuple[str, list[tuple[str, Any]]] | None = None

    def check(self, outcome: TaskOutcome) -> TaskOutcome:
        """``outcome``, or its ``error`` (`OUTPUT_REUSED`) when an ``ok`` output shares storage
        with the previous ``ok`` output; remembers this output for the next call."""
        import torch
        from torch.multiprocessing.reductions import StorageWeakRef

        output = outcome.output
        if outcome.status != "ok" or not isinstance(output, BackendOutput):
            return outcome
        tensors = [(n, getattr(output, n)) for n in OUTPUT_TENSORS if isinstance(getattr(output, n), torch.Tensor)]
        refs = [(n, StorageWeakRef(t.untyped_storage())) for n, t in tensors if t.untyped_storage().nbytes()]
        reused = []
        if self._previous is not None:
            who, held = self._previous
            live = {ref.cdata: name for name, ref in held if not ref.expired()}
            reused = [(n, live[ref.cdata], who) for n, ref in refs if ref.cdata in live]
        self._previous = (f"{outcome.backend}/{outcome.variant}", refs)
        if not reused:
            return outcome
        what = ", ".join(f"{n} (the {m} of {who})" for n, m, who in reused)
        detail = (
            f"{outcome.backend}/{outcome.variant} returned an output that reuses the buffer of the previous call's output: {what}; "
            "a backend's output must stay valid after its next call (the earlier output was copied when it was returned, "
            "so its verdict stands; this one is not judged)"
        )
        return TaskOutcome(
            outcome.backend, outcome.variant, "error", run_ms=outcome.run_ms, compile_ms=outcome.compile_ms,
            detail=detail[:2000], exception_type=OUTPUT_REUSED, runtime=outcome.runtime, timing=outcome.timing,
        )


def _failed(backend: Backend, variant: str, exc: BaseException) -> TaskOutcome:
    """``crash`` for a fatal CUDA error (the context is poisoned), else ``error``."""
    status = "crash" if _is_fatal_cuda(exc) else "error"
    detail = ("fatal CUDA error: " if status == "crash" else "") + "".join(
        traceback.format_exception_only(type(exc), exc)
    ).strip()[-2000:]
    return TaskOutcome(backend.name, variant, status, detail=detail, exception_type=type(exc).__name__)


def availability_of(backend: Backend) -> str | None:
    """``backend.availability()``, or the reason it is unavailable when that raised or returned
    something other than a str or None (a plugin's: the backend is then unavailable, with the
    reason, and the others of its child go on)."""
    try:
        reason = backend.availability()
    except Exception as exc:  # noqa: BLE001 - a plugin's check: its failure is the reason
        return f"availability() raised {type(exc).__name__}: {exc}"[:1000]
    if reason is not None and not isinstance(reason, str):
        return f"availability() returned {type(reason).__name__}, expected a str or None"
    return reason


def quick_availability_of(backend: Backend) -> str | None:
    """``backend.quick_availability()`` asked in this process through `fuzzer.guard.GUARD` (a
    plugin's under its deadline), or the reason it is unavailable when that raised, hung or
    returned something other than a str or None."""
    try:
        return GUARD.call(backend, "quick_availability", check=str_or_none)
    except PluginCallError as exc:
        return f"{exc.method}() {exc.reason}"


def _device_of(inputs: Any) -> str:
    return inputs.q.device.type


def inputs_on(inputs: Any, device: str) -> Any:
    """``inputs`` with every tensor on ``device`` (``"cpu"``/``"cuda"``): the same object when all
    already are, else a copy in which only the tensors elsewhere are moved.

    The inputs a child receives can be on two devices at once: tensors up to
    ``BYTES_TRANSPORT_MAX`` travel as bytes and arrive on the CPU, larger ones as CUDA handles
    (`PackedTensor`). Deciding by ``q`` alone left a small ``k`` on the CPU when ``q`` was large:
    "RuntimeError: k must be on CUDA" from FA2 on the H200 (b2 sq382 sk1 h32/4 d172 fp16,
    2026-12-01), recorded as the kernel's error."""
    import dataclasses

    import torch

    if not dataclasses.is_dataclass(inputs):  # a stand-in with only q/k/v (tests): moved as a whole
        return inputs.to(device) if _device_of(inputs) != device else inputs
    present = vars(inputs)  # not getattr: that would build a lazy dout (oracle.inputs.AttentionInputs)
    elsewhere = [
        f.name
        for f in dataclasses.fields(inputs)
        if isinstance(present.get(f.name), torch.Tensor) and present[f.name].device.type != device
    ]
    if not elsewhere:
        return inputs
    return dataclasses.replace(inputs, **{name: present[name].to(device) for name in elsewhere})


def _output_to(output: BackendOutput, device: str, *, copy: bool = False) -> BackendOutput:
    """``output`` with its tensors on ``device`` (``copy``: always new tensors, never the
    backend's own buffers)."""

    def move(t):
        return None if t is None else t.detach().to(device, copy=copy)

    return BackendOutput(
        out=move(output.out),
        lse=move(output.lse),
        dq=move(output.dq),
        dk=move(output.dk),
        dv=move(output.dv),
        selected_kernel=output.selected_kernel,
        compile_ms=output.compile_ms,
        extra=dict(output.extra),
    )


class InProcessExecutor:
    """Runs backends in the worker's own process: no isolation, for tests and debugging."""

    def __init__(self, backends: list[tuple[Backend, str]]):
        self.backends = {b.name: b for b, _ in backends}

    def availability(self) -> dict[str, str | None]:
        answers: dict[str, str | None] = {}
        for name, backend in self.backends.items():
            try:
                answers[name] = GUARD.call(backend, "availability", check=str_or_none)
            except PluginCallError as exc:
                answers[name] = f"{exc.method}() {exc.reason}"
        return answers

    def run(
        self, case: AttentionCase, inputs: Any, tasks: list[tuple[str, str]], timeout_s: float
    ) -> list[TaskOutcome]:
        outcomes = []
        reuse = OutputReuse()
        for name, variant in tasks:
            outcome = reuse.check(run_task(self.backends[name], case, inputs, variant))
            if outcome.output is not None:  # copied: a backend that reuses its buffer cannot change it
                outcome.output = _output_to(outcome.output, _device_of(inputs), copy=True)
            outcomes.append(outcome)
        return outcomes

    def close(self) -> None:
        pass


class DeferredRun:
    """A run of an executor that has no real concurrency, started only when collected: what
    `submit_run` gives for an executor without ``submit`` (`InProcessExecutor`, the CP
    executor), and what `ChildProcessExecutor.submit` gives with parallelism off. The caller's
    order stays the serial one: nothing runs before `result`.

    Args:
        executor: anything with ``run(case, inputs, tasks, timeout_s) -> list[TaskOutcome]``.
        case, inputs, tasks, timeout_s: that call's arguments (``timeout_s`` per task, seconds).
    """

    def __init__(self, executor: Any, case: AttentionCase, inputs: Any, tasks: list[tuple[str, str]], timeout_s: float):
        self._call = (executor, case, inputs, list(tasks), timeout_s)
        self._outcomes: list[TaskOutcome] | None = None

    def result(self) -> list[TaskOutcome]:
        """``executor.run(...)`` (run on the first call, in the calling thread; the same list
        after): one outcome per task, in task order. Raises what ``run`` raises."""
        if self._outcomes is None:
            executor, case, inputs, tasks, timeout_s = self._call
            self._outcomes = executor.run(case, inputs, tasks, timeout_s)
        return self._outcomes

    def partial(self, timeout_s: float) -> tuple[list[TaskOutcome], None]:
        """`result` (nothing runs in the background here): every outcome, and no rest."""
        return self.result(), None

    def abandon(self) -> None:
        """Give the run up: nothing was started, so nothing runs."""
        self._outcomes = self._outcomes if self._outcomes is not None else []


def submit_run(
    executor: Any, case: AttentionCase, inputs: Any, tasks: list[tuple[str, str]], timeout_s: float, *, skip_busy: bool = False
) -> Any:
    """Start ``tasks`` on ``executor`` and return a handle to collect them later:
    ``executor.submit(...)`` when it has one (`ChildProcessExecutor`: the children start working
    now), else a `DeferredRun` (runs at ``handle.result()``).

    The handle has ``result() -> list[TaskOutcome]`` (one per task, in task order; waits),
    ``partial(timeout_s)`` (the outcomes finished within ``timeout_s`` seconds, in task order, and
    a handle of the rest or None) and ``abandon()`` (waits for whatever already runs, discards the
    outcomes and any error: the executor is ready for the next case).

    ``skip_busy`` (lanes): an environment still working on an earlier run gets no task of this
    one (`BUSY` outcomes); only executors whose ``submit`` takes it (`ChildProcessExecutor`, and
    a CP `RoutingExecutor` for cases without CP) are asked.
    """
    submit = getattr(executor, "submit", None)
    if callable(submit):
        if skip_busy and getattr(executor, "supports_lanes", False):
            return submit(case, inputs, tasks, timeout_s, skip_busy=True)
        return submit(case, inputs, tasks, timeout_s)
    return DeferredRun(executor, case, inputs, tasks, timeout_s)


class _ChildRun:
    """A run of `ChildProcessExecutor` in flight: one future per environment (its pending loop
    in a thread of the executor's pool), collected by `result` (see `submit_run`), or part by part
    with `partial` (lanes). ``preset`` holds outcomes known at submission (`BUSY` tasks)."""

    def __init__(
        self,
        executor: ChildProcessExecutor,
        tasks: list[tuple[str, str]],
        futures: dict[str, Any],
        preset: dict[int, TaskOutcome] | None = None,
        indices: dict[str, list[int]] | None = None,
    ):
        self._executor = executor
        self._tasks = tasks
        self._futures = futures
        self._preset = dict(preset or {})
        #: task indices by environment (of ``futures``); the tasks a `partial` rest keeps
        self._indices = indices if indices is not None else {}
        self._outcomes: list[TaskOutcome] | None = None
        self._error: BaseException | None = None

    @property
    def tasks(self) -> list[tuple[str, str]]:
        """The tasks whose outcomes `result` returns, in order."""
        return list(self._tasks)

    def done(self) -> bool:
        """Whether every environment has finished."""
        return all(f.done() for f in self._futures.values())

    def environments_done(self) -> set[str]:
        """The environments of this run that have finished."""
        return {env for env, f in self._futures.items() if f.done()}

    def _wait(self) -> None:
        try:
            concurrent.futures.wait(_futures_of(self._futures.values()))
        finally:
            if self.done():
                self._executor._run_finished(self)

    def result(self) -> list[TaskOutcome]:
        """Wait for every environment; one outcome per task, in task order, outputs unpacked
        (small tensors on the CPU, see `ChildProcessExecutor._collected`).

        Raises:
            ExecutorError: a child could not be started (the first such error, in environment
                order, after every environment finished).
        """
        if self._outcomes is None and self._error is None:
            self._wait()
            merged: dict[int, TaskOutcome] = dict(self._preset)
            for future in self._futures.values():
                error = future.exception()
                if error is not None:
                    self._error = self._error or error
                else:
                    merged.update(future.result())
            if self._error is None:
                self._outcomes = self._executor._collected(self._tasks, merged)
        if self._error is not None:
            raise self._error
        return self._outcomes

    def partial(self, timeout_s: float) -> tuple[list[TaskOutcome], _ChildRun | None]:
        """Wait up to ``timeout_s`` seconds for the environments, then split the run: the outcomes
        of every environment that finished (and the `BUSY` ones), in task order, and a run of the
        environments still working (None when all finished), collected later with its own
        `result`. Environments keep working after this returns: a rest's children stay busy
        until they finish (a later `ChildProcessExecutor.submit` waits for them or, with
        ``skip_busy``, leaves them out).

        Raises:
            ExecutorError: as `result` (after every environment finished) when a child of a
                finished environment could not be started.
        """
        if not self._futures or self._outcomes is not None or self._error is not None:
            return self.result(), None
        concurrent.futures.wait(_futures_of(self._futures.values()), timeout=max(timeout_s, 0.0))
        finished = {env: f for env, f in self._futures.items() if f.done()}
        if any(f.exception() is not None for f in finished.values()) or len(finished) == len(self._futures):
            return self.result(), None
        merged: dict[int, TaskOutcome] = dict(self._preset)
        for future in finished.values():
            merged.update(future.result())
        keep = sorted(merged)
        done = self._executor._collected([self._tasks[i] for i in keep], {k: merged[i] for k, i in enumerate(keep)})
        rest_futures = {env: f for env, f in self._futures.items() if env not in finished}
        rest_indices = sorted(i for env in rest_futures for i in self._indices.get(env, ()))
        position = {i: k for k, i in enumerate(rest_indices)}
        rest = _ChildRun(
            self._executor,
            [self._tasks[i] for i in rest_indices],
            {env: _Reindexed(f, position) for env, f in rest_futures.items()},
            indices={env: [position[i] for i in self._indices.get(env, ())] for env in rest_futures},
        )
        self._outcomes = done
        self._executor._run_finished(self)
        return done, rest

    def abandon(self) -> None:
        """Wait for every environment (the children stay in step) and discard the outcomes and
        any error."""
        try:
            self.result()
        except Exception:  # noqa: BLE001 - given up on purpose; the next run meets it again
            pass


class _Reindexed:
    """A future of one environment's ``{task index: outcome}`` seen with other indices (the
    positions of those tasks in a `_ChildRun.partial` rest); the rest of the future's interface
    is the wrapped one's."""

    def __init__(self, future: Any, position: dict[int, int]):
        self._future = future
        self._position = position

    def done(self) -> bool:
        return self._future.done()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._future.exception(timeout)

    def result(self, timeout: float | None = None) -> dict[int, TaskOutcome]:
        return {self._position[i]: outcome for i, outcome in self._future.result(timeout).items()}

    @property
    def future(self) -> Any:
        """The wrapped `concurrent.futures.Future` (what ``concurrent.futures.wait`` takes)."""
        return self._future


def _futures_of(futures: Any) -> list[Any]:
    """The `concurrent.futures.Future` s behind ``futures`` (a `_Reindexed` unwrapped)."""
    return [getattr(f, "future", f) for f in futures]


# ---------------------------------------------------------------------------------------- child
# ------------------------------------------------------- what every child process does (both executors)
LOG_MAX_BYTES = 4 * 2**20
"""A child's log (its stderr and stdout, `ChildLog`) is kept under about this many bytes (plus
`LOG_KEEP_BYTES`): a plugin's child printing in a loop wrote 3.7 GB in 60 s (2026-12-03)."""
LOG_KEEP_BYTES = 64 * 2**10
"""When a child's log passes `LOG_MAX_BYTES` it starts again from its last this many bytes (the
tail is what a crash or a hang reports)."""
_LOG_CHUNK_BYTES = 65536


class ChildLog:
    """A child process's stderr and stdout, kept in the file ``path`` by this process, bounded.

    The child writes into a pipe (`child_end`, handed to the child with its other arguments and
    given to `log_output_to` there) and a thread of this process copies what comes to the file.
    Past ``max_bytes`` the file starts again with its last ``keep_bytes`` (from a line start),
    after a line saying how many bytes were dropped in all (`dropped_bytes`): a child printing
    without end costs at most about ``max_bytes + keep_bytes`` of disk, and its last lines are
    always there. What a child wrote before it died is still in the pipe and reaches the file
    (`tail` waits for it). Why not the file itself as the child's stderr, as before: nothing could
    bound a file a child appends to without losing its tail or racing its writes.

    Args:
        path: the log file (created when missing, appended to).
        max_bytes: the bound, bytes (> ``keep_bytes``).
        keep_bytes: what is kept when the bound is passed, bytes (>= 0).

    Raises:
        ValueError: ``keep_bytes`` is negative or not below ``max_bytes``.
    """

    def __init__(self, path: str, *, max_bytes: int = LOG_MAX_BYTES, keep_bytes: int = LOG_KEEP_BYTES):
        from multiprocessing.connection import Connection

        if not 0 <= keep_bytes < max_bytes:
            raise ValueError(f"keep_bytes must be >= 0 and below max_bytes ({max_bytes}), got {keep_bytes}")
        self.path = path
        self.max_bytes = max_bytes
        self.keep_bytes = keep_bytes
        self.dropped_bytes = 0
        self._note_bytes = 0  # the note at the file's start after a restart (not the child's bytes)
        self._file = open(path, "ab")
        self._size = self._file.tell()
        self._read_fd, write_fd = os.pipe()
        #: the pipe's write end, for the child (a `multiprocessing` connection: it can be passed
        #: to a ``spawn`` child among the process's arguments)
        self.child_end = Connection(write_fd, readable=False)
        self._read_bytes = 0  # taken from the pipe so far
        self._written_bytes = 0  # of those, in the file (or dropped)
        self._thread = threading.Thread(target=self._pump, name="attnfuzz-child-log", daemon=True)
        self._thread.start()

    def started(self) -> None:
        """Close this process's copy of the pipe's write end, once the child was started with it:
        the copying then ends when the child (and whatever it started that keeps its stderr)
        has ended."""
        self.child_end.close()

    def _pump(self) -> None:
        try:
            while True:
                try:
                    chunk = os.read(self._read_fd, _LOG_CHUNK_BYTES)
                except OSError:
                    break
                self._read_bytes += len(chunk)
                if not chunk:
                    break
                self._write(chunk)
                self._written_bytes += len(chunk)
        finally:
            os.close(self._read_fd)
            self._file.close()

    def _write(self, chunk: bytes) -> None:
        try:
            self._file.write(chunk)
            self._file.flush()
            self._size += len(chunk)
            if self._size > self.max_bytes:
                self._restart()
        except OSError:  # a full disk, the directory removed: the log is best effort
            pass

    def _restart(self) -> None:
        """Start the file again from its last ``keep_bytes`` (from a line start), after a line
        saying how much was dropped."""
        with open(self.path, "rb") as fh:
            fh.seek(max(self._size - self.keep_bytes, self._note_bytes))  # the child's bytes, not an earlier note
            kept = fh.read()
        newline = kept.find(b"\n")
        if 0 <= newline < len(kept) - 1:
            kept = kept[newline + 1 :]
        self.dropped_bytes += self._size - self._note_bytes - len(kept)
        note = (
            f"[attnfuzz: {self.dropped_bytes} bytes of this log dropped in all, to keep it under "
            f"{self.max_bytes} bytes; its last part follows]\n"
        ).encode()
        self._file.seek(0)
        self._file.truncate()
        self._file.write(note + kept)
        self._file.flush()
        self._size = len(note) + len(kept)
        self._note_bytes = len(note)

    def _pending(self) -> int:
        """Bytes in the pipe not read yet (0 when the pipe is closed)."""
        import fcntl
        import struct
        import termios

        try:
            return struct.unpack("i", fcntl.ioctl(self._read_fd, termios.FIONREAD, b"\0\0\0\0"))[0]
        except OSError:
            return 0

    def settle(self, timeout_s: float = 2.0, *, ended: bool = False) -> None:
        """Wait (at most ``timeout_s`` seconds) until what the child wrote so far is in the file.

        Args:
            timeout_s: the bound, seconds.
            ended: the child has ended: wait for the pipe's end (exact); else for the bytes
                in the pipe now (to within one chunk being copied as this is called).
        """
        if ended:
            self._thread.join(timeout_s)
            return
        if not self._thread.is_alive():
            return
        target = self._read_bytes + self._pending()
        if self._written_bytes >= target:
            return
        deadline = time.monotonic() + timeout_s
        while self._written_bytes < target and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)  # the copying thread is one write away

    def tail(self, lines: int = _STDERR_TAIL_LINES, *, ended: bool = False) -> str:
        """The last ``lines`` lines of the log, once `settle` d (``ended``: as there)."""
        self.settle(ended=ended)
        return _tail(self.path, lines)


def log_output_to(log: Any) -> None:
    """Send this process's stderr (fd 2 and ``sys.stderr``, line-buffered) and its stdout (fd 1
    and ``sys.stdout``) into ``log``, the write end of its parent's `ChildLog`
    (`ChildLog.child_end`, a connection), which is closed here: what the parent reads back as the
    stderr tail of a crash or a hang. Stdout too: a library that prints (FA4's CuTe DSL prints
    launch errors to fd 1) must not write into the worker's own stdout, which ``attnfuzz fuzz
    --json`` keeps for its JSON (on the H200, 2026-12-01, FA4's messages came before the JSON
    document)."""
    fd = log.fileno()
    os.dup2(fd, 2)
    os.dup2(fd, 1)
    log.close()
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)


def load_task_backends(specs: list[tuple[str, str]]) -> dict[str, Backend]:
    """The backends a child serves, by name: each ``(spec, name)`` loaded with
    `fuzzer.registry.load_spec` and the backend of that name kept.

    Raises:
        BackendError: a spec cannot be loaded.
    """
    from fuzzer.registry import load_spec

    backends: dict[str, Backend] = {}
    for spec, name in specs:
        for backend in load_spec(spec):
            if backend.name == name:
                backends[name] = backend
    return backends


def exit_if_crashed(outcome: TaskOutcome, prefix: str = "") -> None:
    """After a ``crash`` outcome (the CUDA context is poisoned) write its detail to stderr and exit
    with status 70 (after the outcome was sent): the parent restarts the child."""
    if outcome.status == "crash":
        sys.stderr.write(prefix + outcome.detail + "\n")
        sys.stderr.flush()
        end_descendants()
        os._exit(70)


def release_after_oom(outcome: TaskOutcome, cuda: bool | None = None) -> None:
    """After an ``oom`` outcome on CUDA, return the cached blocks (``torch.cuda.empty_cache``), so
    that the next case starts with the memory free. ``cuda``: whether this process computes on
    CUDA; None: ``torch.cuda.is_available()``, asked only after an ``oom``."""
    if outcome.status != "oom":
        return
    import torch

    if cuda if cuda is not None else torch.cuda.is_available():
        torch.cuda.empty_cache()


def _child_main(conn, specs: list[tuple[str, str]], env_vars: dict[str, str], log: Any) -> None:
    """Entry point of a child process (`become_child`, ``log``: its `ChildLog`'s write end): load
    the backends, then serve ``run`` requests."""
    become_child(log)
    os.environ.update(env_vars)
    import torch.multiprocessing  # noqa: F401  (registers tensor reductions for the pipe)

    configure_torch_threads()

    from oracle.config import AttentionCase as Case

    backends = load_task_backends(specs)
    availability = {name: availability_of(b) for name, b in backends.items()}
    runtime, seen = child_runtime(backends), _mapped_runtime_files()
    # CUDA backends load runtime libraries lazily; a CPU backend may say it does too
    watch_runtime = any(getattr(b, "watch_runtime_libraries", b.device != "cpu") for b in backends.values())
    conflict = next((r["cudnn_conflict"] for r in runtime.values() if r.get("cudnn_conflict")), None)
    if conflict:  # results of this process could not be attributed to one cuDNN
        availability = {name: reason or conflict for name, reason in availability.items()}
    conn.send(("ready", availability, runtime))
    profile_dir = os.environ.get(PROFILE_DIR_ENV)
    if profile_dir:  # diagnostics: this child's serving loop under cProfile, written at its end
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
        try:
            _serve(conn, backends, Case, seen, watch_runtime)
        finally:
            end_descendants()
            profiler.disable()
            with contextlib.suppress(OSError):
                os.makedirs(profile_dir, exist_ok=True)
                profiler.dump_stats(os.path.join(profile_dir, f"child-{'+'.join(backends)}-{os.getpid()}.prof"))
        return
    try:
        _serve(conn, backends, Case, seen, watch_runtime)
    finally:
        end_descendants()  # what its backends started (a detached process included) ends with it


def _serve(conn, backends: dict[str, Backend], Case: type, seen: frozenset[str], watch_runtime: bool) -> None:
    """A child's loop: serve ``run`` messages until ``stop`` or the pipe closes."""
    reuse = OutputReuse()
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message[0] == "stop":
            return
        _, case_json, packed, tasks = message
        t_unpack = time.perf_counter()
        case = Case.from_json(case_json)
        inputs = unpack_inputs(packed)
        unpack_ms = (time.perf_counter() - t_unpack) * 1000.0
        for i, (name, variant) in enumerate(tasks):
            conn.send(("start", i))
            outcome = reuse.check(run_task(backends[name], case, inputs, variant))
            t_pack = time.perf_counter()
            if outcome.output is not None:
                outcome.output = pack_output(_output_to(outcome.output, "cpu"))
            t_runtime = time.perf_counter()
            # the runtime libraries are CUDA ones: a child of CPU backends loads none lazily
            now_seen = _mapped_runtime_files() if watch_runtime else seen
            if now_seen != seen:  # a library loaded lazily by this call: report it with the outcome
                seen, outcome.runtime = now_seen, child_runtime(backends)
            outcome.timing["pack"] = (t_runtime - t_pack) * 1000.0
            outcome.timing["runtime"] = (time.perf_counter() - t_runtime) * 1000.0
            if i == 0:
                outcome.timing["unpack"] = unpack_ms
            conn.send(("done", i, outcome))
            exit_if_crashed(outcome)  # the CUDA context is poisoned: die, be restarted
            release_after_oom(outcome)


def child_runtime(backends: dict[str, Backend]) -> dict[str, dict[str, str]]:
    """What this process has loaded, per backend: `fuzzer.environment.runtime_report` (the
    runtime libraries mapped, one or two cuDNN builds) updated with the backend's own
    `Backend.runtime_versions` (its library's query, e.g. TE's cuDNN version), which wins. A
    backend whose query raises reports the process map only."""
    from fuzzer.environment import runtime_report

    shared = runtime_report()
    result = {}
    for name, backend in backends.items():
        report = dict(shared)
        try:
            own = backend.runtime_versions()
        except Exception:  # noqa: BLE001 - a query that fails must not stop the child
            own = {}
        report.update({str(k): str(v) for k, v in (own or {}).items() if v})
        result[name] = report
    return result


_SO_PATHS = re.compile(rb"(/[^\n]*\.so[^\n/]*)$", re.M)  # file-backed shared objects of /proc/self/maps
_mapped_cache: list[tuple[frozenset[bytes], frozenset[str]]] = []


def _mapped_runtime_files() -> frozenset[str]:
    """The runtime libraries mapped now (`fuzzer.environment.loaded_libraries`, by path). Called
    after every task: the full parse (milliseconds) only runs when the set of mapped ``.so``
    files changed since the last call (a regex scan of the map, a fraction of that)."""
    from fuzzer.environment import loaded_libraries

    try:
        with open("/proc/self/maps", "rb") as fh:
            data = fh.read()
    except OSError:
        return frozenset(lib.path for lib in loaded_libraries())
    shared = frozenset(_SO_PATHS.findall(data))
    if _mapped_cache and _mapped_cache[0][0] == shared:
        return _mapped_cache[0][1]
    found = frozenset(lib.path for lib in loaded_libraries(data.decode("utf-8", errors="replace")))
    _mapped_cache[:] = [(shared, found)]
    return found


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


def _tail(path: str, lines: int = _STDERR_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 16384))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(deque(text.splitlines(), maxlen=lines))


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the OS says, else the count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


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


@dataclass
class _Child:
    process: Any
    conn: Any
    log: ChildLog
    availability: dict[str, str | None] = field(default_factory=dict)

    @property
    def log_path(self) -> str:
        return self.log.path

    def tail(self) -> str:
        """The last lines of its log (`ChildLog.tail`; exact once it has ended)."""
        return self.log.tail(ended=not self.process.is_alive())


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
        self._children: dict[str, _Child] = {}
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
        self._in_flight: _ChildRun | None = None  # the last run submitted, until it is collected
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

    def _start(self, environment: str, register: bool = True) -> _Child:
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
            log = ChildLog(self._new_log_path(environment))
            process = self._ctx.Process(
                target=_child_main, args=(child_conn, members, env_vars, log.child_end), daemon=True, name=f"attnfuzz-{environment}"
            )
            try:
                with environment_set(self._library_env):  # the loader reads LD_LIBRARY_PATH at exec
                    process.start()
            finally:
                log.started()
        child_conn.close()
        if not parent_conn.poll(self.start_timeout_s):
            kill_tree(process.pid)
            process.join(10)
            raise ExecutorError(f"child for environment {environment!r} did not start: {log.tail(ended=True)}")
        try:
            message = parent_conn.recv()
        except EOFError as exc:
            process.join(10)
            raise ExecutorError(f"child for environment {environment!r} died at start: {log.tail(ended=True)}") from exc
        child = _Child(process, parent_conn, log, message[1])
        with self._lock:
            self._note_runtime(message[2] if len(message) > 2 else None)
            if register:
                self._children[environment] = child
        return child

    def _start_spare(self, environment: str) -> _Child | None:
        """A spare child of ``environment`` (the spare pool's thread: the child lives as long as
        that thread, see the class docstring); None when the executor is closing."""
        if self._closing.is_set():
            return None
        child = self._start(environment, register=False)
        if self._closing.is_set():  # close() began while it started: it will not be used
            self._end_child(child)
            return None
        return child

    def _take_spare(self, environment: str) -> _Child | None:
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
                self._end_child(child)
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

    @staticmethod
    def _end_child(child: _Child) -> None:
        """Kill ``child`` (a dead or stuck environment child, or a spare never used) and close its pipe."""
        if child.process.is_alive():
            kill_tree(child.process.pid)  # with what it started, a detached process included
        child.process.join(10)
        child.conn.close()

    def _new_log_path(self, environment: str) -> str:
        """A stderr file name of its own for a new child of ``environment``:
        ``<log_dir>/<environment>.<n>.log``, created here (exclusively) so that no other start,
        of this executor or another sharing ``log_dir``, takes the same name. Call under the lock."""
        os.makedirs(self.log_dir, exist_ok=True)  # close() removed it: a child started after close
        n = len(os.listdir(self.log_dir))
        while True:
            log_path = os.path.join(self.log_dir, f"{environment}.{n}.log")
            try:
                os.close(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                return log_path
            except FileExistsError:
                n += 1

    def _note_runtime(self, runtime: dict[str, dict[str, str]] | None) -> None:
        """Attribute later results to what a child reported it loaded (`Backend.set_runtime`)."""
        with self._lock:
            for name, report in (runtime or {}).items():
                if name in self.backends and self.runtime.get(name) != report:
                    self.runtime[name] = dict(report)
                    self.backends[name][0].set_runtime(report)

    def _child(self, environment: str) -> _Child:
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
            self._end_child(child)

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
        return self._collected(tasks, outcomes)

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
            self._in_flight = run = _ChildRun(self, list(tasks), futures, preset=preset, indices=by_env)
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
        if _device_of(inputs) == "cuda":
            return True
        return len(self._environments) + 1 <= usable_cores()

    def _check_idle(self) -> None:
        """Before a serial run: wait for every environment's submitted run (lanes) to finish."""
        self._wait_idle()

    def _run_finished(self, run: _ChildRun) -> None:
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
                left = self._skipped_after_crash(tasks, pending, left, outcomes)
            stalls = stalls + 1 if left == pending else 0
            if stalls >= 2:  # the child died twice before starting anything: do not loop forever
                name, variant = tasks[pending[0]]
                outcomes[pending[0]] = TaskOutcome(
                    name, variant, "crash", detail="child died before starting the task, twice in a row"
                )
                left, stalls = pending[1:], 0
            pending = left
        return outcomes

    @staticmethod
    def _collected(tasks: list[tuple[str, str]], outcomes: dict[int, TaskOutcome]) -> list[TaskOutcome]:
        """The outcomes in task order, outputs unpacked: a tensor that came as bytes stays on the
        CPU, a larger one where the child shared it (the judge moves what it compares to the
        reference's device, `oracle.compare.judge_tensors`, so an output is moved once, where it
        is judged, and not at all when it is not)."""
        result = [outcomes[i] for i in range(len(tasks))]
        for outcome in result:
            t0 = time.perf_counter()
            outcome.output = unpack_output(outcome.output)
            outcome.timing["collect"] = (time.perf_counter() - t0) * 1000.0
        return result

    @staticmethod
    def _skipped_after_crash(tasks, pending, left, outcomes) -> list[int]:
        """``left`` less the tasks of a backend that crashed or timed out in this round (each
        then gets a ``skipped`` outcome naming the task that did): its other variants on the same
        case would very likely fail the same way, each costing a child restart or a timeout."""
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
            ready, rss = self._wait(child, max(remaining, 0.0))
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
                    outcomes[pending[current]] = self._death_outcome(child, name, variant)
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

    def _wait(self, child: _Child, timeout_s: float) -> tuple[bool, int | None]:
        """Wait up to ``timeout_s`` for a message; ``(ready, None)``, or ``(False, rss)`` as soon
        as the child's resident memory passes ``memory_limit_bytes``."""
        if self.memory_limit_bytes is None:
            return child.conn.poll(timeout_s), None
        deadline = time.monotonic() + timeout_s
        while True:
            rss = resident_bytes(child.process.pid)
            if rss is not None and rss > self.memory_limit_bytes:
                return False, rss
            left = deadline - time.monotonic()
            if child.conn.poll(max(min(self.memory_poll_s, left), 0.0)):
                return True, None
            if left <= 0:
                return False, None

    @staticmethod
    def _death_outcome(child: _Child, name: str, variant: str) -> TaskOutcome:
        code = child.process.exitcode
        tail = child.tail()
        if code is not None and code < 0:
            sig = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            if code == -signal.SIGKILL:
                return TaskOutcome(name, variant, "oom", detail=f"child killed by SIGKILL (likely out of memory)\n{tail}")
            return TaskOutcome(name, variant, "crash", detail=f"child died with signal {sig}\n{tail}")
        return TaskOutcome(name, variant, "crash", detail=f"child exited with code {code}\n{tail}")

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
                    self._end_child(child)
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
