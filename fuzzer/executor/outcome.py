"""What one backend call produced: `TaskOutcome`, its statuses, the ``exception_type`` names of
the executor's own checks, and the executor's own error.

A call ends ``ok``, ``unsupported``, ``error``, ``crash``, ``timeout`` or ``oom``; a task not run
is `SKIPPED` or `BUSY` (no result is recorded for either). The checks of `fuzzer.executor.calls`
name what they found in ``exception_type`` (`INPUT_MUTATED`, `OUTPUT_REUSED`, `INVALID_OUTPUT`,
`DECLARATION_GAP`), which becomes the signature ``error:<name>``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fuzzer.backends.base import BackendOutput
from oracle.config import AttentionCase
from oracle.errors import AttnFuzzError

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
#: ``exception_type`` (signature ``error:InputMutated``) of a call that wrote into its inputs.
INPUT_MUTATED = "InputMutated"
#: ``exception_type`` (signature ``error:OutputReused``) of a call whose output reuses a buffer of
#: the previous call's output (that output would change under its verdict).
OUTPUT_REUSED = "OutputReused"
#: ``exception_type`` (signature ``error:InvalidOutput``) of a call that returned no
#: `BackendOutput`, a field that is no tensor, or a tensor off the backend's device (the
#: evaluator adds what the case asks: `fuzzer.evaluate.output_problems`).
INVALID_OUTPUT = "InvalidOutput"


COMPILE_ERROR_TYPES = ("MLIRError", "CUDADialectError", "InductorError", "BackendCompilerFailed")
"""The exception type names of a JIT library's failed kernel build (FA4's CuTe DSL: ``MLIRError``,
``CUDADialectError``; torch.compile: ``InductorError``, ``BackendCompilerFailed``)."""


#: The tensor fields of a `BackendOutput`, in order (each a tensor or None).
OUTPUT_TENSORS = ("out", "lse", "dq", "dk", "dv")


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
