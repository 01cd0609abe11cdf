"""One backend call in this process, isolated from its inputs and classified as a `TaskOutcome`.

Isolation of a call (`run_task`): a backend gets its own copy of the inputs (`own_inputs`) and,
after the call, that copy is compared with the originals (`mutated_inputs`); one that wrote into
its inputs gets an ``error`` outcome (`INPUT_MUTATED`), and the other backends, in the same child
or not, and the oracle see the inputs unchanged. An output that reuses a buffer of the previous
call's output (`OutputReuse`) is an ``error`` too (`OUTPUT_REUSED`); every output leaves the
child as a copy (bytes, or `fuzzer.executor.transport.shared_copy`), so the earlier call's
verdict stands. An output that is no `BackendOutput`, holds a field that is no tensor or a tensor
off the backend's device is ``error`` (`INVALID_OUTPUT`); a ``compile_ms`` that is no finite
number >= 0 is taken as 0. ``torch.OutOfMemoryError``, ``MemoryError`` (host memory, e.g. under
an ``RLIMIT_AS``) and torch's CPU allocator failing are ``oom``; a fatal CUDA error (the context
is poisoned) is ``crash``.

Threads: each child and the worker itself run torch with `configure_torch_threads` (default one
intra-op thread, ``$ATTNFUZZ_TORCH_THREADS`` to change it): the worker and its children take turns
on the cores, and torch's default of one thread per core makes every process spin and contend on a
loaded machine (4 to 18 times slower per case on a busy 2-core machine than one thread).

`InProcessExecutor` runs its tasks this way in the worker's own process (no isolation of crashes
or hangs: tests and debugging).
"""

from __future__ import annotations

import math
import os
import time
import traceback
from typing import Any

from fuzzer.backends.base import Backend, BackendOutput, DeclarationGapError, UnsupportedCaseError
from fuzzer.executor.outcome import (
    COMPILE_ERROR_TYPES,
    DECLARATION_GAP,
    INPUT_MUTATED,
    INVALID_OUTPUT,
    OUTPUT_REUSED,
    OUTPUT_TENSORS,
    ExecutorError,
    TaskOutcome,
)
from fuzzer.guard import GUARD, PluginCallError, str_or_none
from oracle.config import AttentionCase

THREADS_ENV = "ATTNFUZZ_TORCH_THREADS"


# Substrings of exception messages after which a CUDA context is unusable: the child must die.
_FATAL_CUDA_MARKERS = (
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "CUDA error: misaligned address",
    "an illegal instruction was encountered",
    "CUDA_ERROR_ILLEGAL_ADDRESS",
)


# torch's CPU allocator raises RuntimeError with these when malloc fails
_HOST_OOM_MARKERS = ("can't allocate memory", "not enough memory")


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


def _is_fatal_cuda(exc: BaseException) -> bool:
    text = str(exc)
    return any(marker in text for marker in _FATAL_CUDA_MARKERS)


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


def device_of(inputs: Any) -> str:
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
        return inputs.to(device) if device_of(inputs) != device else inputs
    present = vars(inputs)  # not getattr: that would build a lazy dout (oracle.inputs.AttentionInputs)
    elsewhere = [
        f.name
        for f in dataclasses.fields(inputs)
        if isinstance(present.get(f.name), torch.Tensor) and present[f.name].device.type != device
    ]
    if not elsewhere:
        return inputs
    return dataclasses.replace(inputs, **{name: present[name].to(device) for name in elsewhere})


def output_to(output: BackendOutput, device: str, *, copy: bool = False) -> BackendOutput:
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
                outcome.output = output_to(outcome.output, device_of(inputs), copy=True)
            outcomes.append(outcome)
        return outcomes

    def close(self) -> None:
        pass
