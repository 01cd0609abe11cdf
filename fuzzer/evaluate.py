"""One case through backends: the pure `judge` and the `Evaluator`.

Every caller that runs a case and judges it goes through here: the fuzz worker
(`fuzzer.worker.Worker`, which adds the loop, the sink, the journal and the leases), replay
(`fuzzer.builds.replay.run_replay`), the pytest corpus plugin and the CP campaign (`fuzzer.cp.campaign`).

`Evaluator.evaluate` does, for one `AttentionCase`:

1. split the (backend, variant) tasks into runnable ones and ``unsupported`` results (each
   backend's declared `Backend.unsupported_reasons`);
2. when something is runnable: the deterministic inputs (`oracle.inputs.make_inputs`), once, on
   the evaluator's device;
3. every runnable task submitted to the executor (`fuzzer.executor.submit_run`: child processes,
   or in process for tests), and meanwhile, in this thread, the float64 oracle
   (`oracle.reference.reference`, with gradients only for ``case.backward``) and the
   reference-only parts of the comparison (`oracle.compare.PreparedReference`), once; then the
   outcomes are collected. A `fuzzer.executor.ChildProcessExecutor` with parallelism on (by
   default on CUDA) runs the kernels while the oracle is computed; an executor without real
   concurrency runs them when collected, after the oracle (the serial order);
4. each outcome judged by `judge` through `fuzzer.executor.TaskOutcome.judged` (a CP outcome
   judges its non-CP twin too, `fuzzer.cp.judge.judge_cp`: the core never imports the CP wing,
   which runs the Evaluator in its campaign; CP backends need the CP executor,
   `fuzzer.cp.executor.make_executor_with_cp`).

Lanes (``lane_grace_s``, the worker's fuzz cases on CUDA): an environment still busy with an
earlier case is left out (`fuzzer.executor.BUSY`), and after the oracle the evaluator waits at most
``lane_grace_s`` for the others; what still runs becomes ``Evaluation.late`` (a `LateRun`), judged
later by `Evaluator.collect_late`.

Background judging (``judge_later``, the worker's fuzz cases on CUDA): the ``ok`` outcomes are judged on
the evaluator's judge thread (`PendingJudgement`, one thread, first in first out; on a GPU its own CUDA
stream) while the caller goes on with the next case; the outcomes that did not return (crash, timeout,
error) are turned into results at once. The caller collects the finished judgements
(`PendingJudgement.done`, `PendingJudgement.result`). Why: on the H200 (2026-12-02, 451305b;
`benchmarks/gpu/results/2026-12-02-451305b-default/manifest.json`) the comparison took 18-25 ms a case
on the worker's thread, mostly waiting for the GPU beside the children's kernels, 13% of the wall time;
the worker's thread only waits for a judgement when too many are pending
(`fuzzer.worker.MAX_PENDING_JUDGEMENTS`) and at the end.

It stores nothing: the `Evaluation` it returns holds the results (and, for a CP case, the twin
case and its results) for the caller to record.

Errors: a failure of attnfuzz's own steps on one case (inputs, oracle, comparison) is handled in
one place, `Evaluator._own_step_failed`: it becomes an ``error`` result with the evidence
(``attnfuzz_error:<ExceptionType>``), never a crash of the caller. The oracle runs under the
per-case time limit (`oracle_time_bound`: inputs and reference together) and the case's
working-set bound (`oracle.config.AttentionCase.check_resources`, before any allocation). When
the oracle fails after the tasks were submitted, the evaluator still waits for them (the children
stay in step) and drops their outcomes: the case's results are the own-step error alone.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fuzzer.backends.base import Backend, is_cp_backend
from fuzzer.backends.cp_layout import cp_twin
from fuzzer.executor import (
    BUSY,
    INVALID_OUTPUT,
    OUTPUT_TENSORS,
    SKIPPED,
    ChildProcessExecutor,
    InProcessExecutor,
    TaskOutcome,
    configure_torch_threads,
    output_structure_problems,
    sane_ms,
    submit_run,
)
from fuzzer.guard import GUARD, PluginCallError, PluginGuard, a_str, ask, list_of_str
from fuzzer.results import STORED_NONFINITE_RATIO, CaseResult
from oracle.config import AttentionCase, torch_dtype

ISOLATIONS = ("process", "none")


def storable_error_ratio(x: float | None) -> float | None:
    """``x`` as a float for `CaseResult.error_ratio`: None stays None, a finite value is kept, inf
    and NaN become `STORED_NONFINITE_RATIO`."""
    if x is None:
        return None
    return float(x) if math.isfinite(x) else STORED_NONFINITE_RATIO


def normalise_masked_lse(lse: Any, ref_lse: Any, sentinel: float, *, empty_rows: Any = None) -> Any:
    """Map the library's documented lse for rows with no visible key to attnfuzz's ``-inf``, on
    exactly those rows (``ref_lse == -inf``) and only where the value equals ``sentinel``.

    Args:
        lse: the kernel's lse, ``[batch, heads, seqlen_q]`` (thd ``[heads, total_q]``).
        ref_lse: the oracle's lse, same shape, float64; ``-inf`` on rows without a visible key.
        sentinel: the value the backend declares for such rows (`Backend.masked_row_lse`).
        empty_rows: ``torch.isneginf(ref_lse)`` already on ``lse``'s device (bool, same shape),
            or None. Given, the work stays where ``lse`` is (an output that came back as bytes
            is normalised on the host and judged in its name's batch, `oracle.compare.judge_tensors`).

    Returns:
        ``lse`` with those entries replaced: on ``lse``'s device with ``empty_rows``, else on
        ``ref_lse``'s (unchanged when the shapes differ: the comparison reports the shape).
    """
    import torch

    if lse.shape != ref_lse.shape:
        return lse
    if empty_rows is not None and empty_rows.device == lse.device and empty_rows.shape == lse.shape:
        return lse.masked_fill(empty_rows & (lse == sentinel), -math.inf)
    if lse.device != ref_lse.device:  # an output that came back as bytes (on the host): to the reference's device
        lse = lse.to(ref_lse.device)
    masked = torch.isneginf(ref_lse) & (lse == sentinel)
    return lse.masked_fill(masked, -math.inf)


def backend_version(backend: Backend, guard: PluginGuard | None = None) -> str:
    """``backend.version_string()`` through ``guard`` (default `fuzzer.guard.GUARD`): a plugin's
    that raises, hangs or returns no str gives ``"unknown (<why>)"`` instead, and the result is
    stored all the same."""
    try:
        return (guard or GUARD).call(backend, "version_string", check=a_str)
    except PluginCallError as exc:
        return f"unknown ({exc.method}() {exc.reason})"[:500]


def unsupported_result(case: AttentionCase, backend: Backend, variant: str, reasons: Iterable[str], phase: str) -> CaseResult:
    """The ``unsupported`` `CaseResult` of ``backend``/``variant`` on ``case`` (never a failure)."""
    return CaseResult(
        case_id=case.case_id,
        backend=backend.name,
        variant=variant,
        status="unsupported",
        detail="; ".join(reasons),
        backend_version=backend_version(backend),
        phase=phase,
    )


def plugin_error_result(case: AttentionCase, backend: Backend, variant: str, error: PluginCallError, phase: str) -> CaseResult:
    """The ``error`` `CaseResult` of ``backend``/``variant`` on ``case`` when one of the
    backend's own methods, asked in this process, failed (`fuzzer.guard`): signature
    ``error:PluginError`` (raised, or returned a value of the wrong type) or ``error:PluginTimeout``
    (ran past the deadline: the backend is quarantined), the detail naming the method."""
    signature = f"error:{error.exception_type}"
    return CaseResult(
        case_id=case.case_id,
        backend=backend.name,
        variant=variant,
        status="error",
        signature=signature,
        signatures=(signature,),
        detail=str(error)[:2000],
        backend_version=backend_version(backend),
        phase=phase,
    )


def output_problems(case: AttentionCase, reference: Any, output: Any, backend: Backend, variant: str) -> list[str]:
    """What makes ``output`` unfit to judge for ``case`` (empty: nothing), each naming the field
    and what was expected: `fuzzer.executor.output_structure_problems` (no `BackendOutput`, a field
    that is no tensor); ``out`` missing; ``lse`` missing where the variant returns one
    (`fuzzer.backends.base.Backend.returns_lse`); a gradient missing in a backward case of a
    backend that declares backward; ``out`` or a gradient not in the case's dtype (a float64 or
    complex output judged against the float64 oracle would pass where the kernel computed nothing
    in the case's dtype), ``lse`` not float32 or float64; a shape other than the reference's.

    Args:
        case: the case.
        reference: its `oracle.reference.ReferenceResult` or `oracle.compare.PreparedReference`.
        output: the outcome's output (tensors on any device).
        backend: the backend that returned it.
        variant: the variant that ran.
    """
    import torch

    problems = output_structure_problems(output, None)
    if problems:
        return problems
    ref = getattr(reference, "reference", reference)
    dtype = torch_dtype(case.dtype)
    caps = getattr(backend, "capabilities", None)
    wanted = {"out": "every case asks for it"}
    try:
        if backend.returns_lse(variant):
            wanted["lse"] = "the backend declares lse for this variant"
    except Exception:  # noqa: BLE001 - a plugin's override: judged by what it returned
        pass
    if case.backward and getattr(caps, "backward", False):
        wanted.update(dict.fromkeys(("dq", "dk", "dv"), "a backward case, and the backend declares backward"))
    for name in OUTPUT_TENSORS:
        tensor = getattr(output, name)
        if tensor is None:
            if name in wanted:
                problems.append(f"{name}: missing ({wanted[name]})")
            continue
        if name == "lse":
            if tensor.dtype not in (torch.float32, torch.float64):
                problems.append(f"lse: dtype {str(tensor.dtype).removeprefix('torch.')}, expected float32 or float64")
        elif tensor.dtype != dtype:
            problems.append(f"{name}: dtype {str(tensor.dtype).removeprefix('torch.')}, expected {case.dtype} (the case's dtype)")
        expected = getattr(ref, name, None)
        if isinstance(expected, torch.Tensor) and tuple(tensor.shape) != tuple(expected.shape):
            problems.append(f"{name}: shape {tuple(tensor.shape)}, expected {tuple(expected.shape)}")
    return problems


def judge(
    case: AttentionCase,
    reference: Any,
    outcome: TaskOutcome,
    backend: Backend,
    *,
    oracle_ms: float = 0.0,
    phase: str = "fuzz",
    guard: PluginGuard | None = None,
) -> CaseResult:
    """The verdict on one backend call: pure (no I/O, no state). `judge_many` of one outcome.

    Rules: ``unsupported`` stays unsupported; a call that did not return (``error``, ``crash``,
    ``timeout``, ``oom``) is that status with signature ``error:<ExceptionType>`` or the status
    itself; an ``ok`` output that is unfit to judge (`output_problems`: a tensor missing, of the
    wrong dtype or shape, no tensor at all) is ``error`` with signature ``error:InvalidOutput``,
    the detail naming each field and what was expected; any other ``ok`` output is compared with the float64 oracle (`oracle.compare.compare_outputs`;
    the backend's documented lse of rows without a visible key, `Backend.masked_row_lse`, is
    read as ``-inf`` first): ``pass`` or ``fail`` with the comparison's primary signature.

    Args:
        case: the case the outcome ran.
        reference: `oracle.reference.ReferenceResult` of ``case``'s inputs, or its
            `oracle.compare.PreparedReference` (faster when several outcomes are judged).
        outcome: the executor's `TaskOutcome`.
        backend: the backend that ran it (for its version and lse convention).
        oracle_ms: the oracle's time for this case, milliseconds (recorded with the result).
        phase: one of `fuzzer.results.PHASES`.
        guard: as `judge_many`.

    Returns:
        The `CaseResult`.

    Raises:
        oracle.compare.CompareInputError: the output holds a gradient the reference lacks.
    """
    return judge_many(case, reference, [(outcome, backend)], oracle_ms=oracle_ms, phase=phase, guard=guard)[0]


def judge_many(
    case: AttentionCase,
    reference: Any,
    calls: list[tuple[TaskOutcome, Backend]],
    *,
    oracle_ms: float = 0.0,
    phase: str = "fuzz",
    guard: PluginGuard | None = None,
) -> list[CaseResult]:
    """`judge` of several outcomes of one case, pure: the ``ok`` outputs are compared with the
    reference together (`oracle.compare.compare_outputs_batch`: on a GPU each tensor name in one
    batch, three host transfers per name instead of about ten per output; on the CPU one tensor
    at a time; the figures are those of one-by-one judging).

    Args:
        case, reference, oracle_ms, phase: as `judge`.
        calls: ``(outcome, backend that ran it)`` pairs.
        guard: what a plugin's ``version_string`` is called through (`backend_version`).

    Returns:
        One `CaseResult` per call, in order.

    Raises:
        oracle.compare.CompareInputError: some output holds a gradient the reference lacks (the
            caller judges one by one to tell which).
    """
    import torch

    from oracle.compare import compare_outputs_batch

    results: list[CaseResult | None] = [None] * len(calls)
    to_compare: list[int] = []
    given: list[dict[str, Any]] = []
    commons: list[dict[str, Any]] = []
    empty_rows: dict[Any, Any] = {}  # device -> the reference's rows without a visible key there (once per case)
    for i, (outcome, backend) in enumerate(calls):
        common = dict(
            case_id=case.case_id,
            backend=outcome.backend,
            variant=outcome.variant,
            run_ms=sane_ms(outcome.run_ms),
            compile_ms=sane_ms(outcome.compile_ms),
            oracle_ms=oracle_ms,
            backend_version=backend_version(backend, guard),
            phase=phase,
        )
        commons.append(common)
        if outcome.status == "unsupported":
            results[i] = CaseResult(status="unsupported", detail=outcome.detail, **common)
            continue
        if outcome.status != "ok":
            signature = outcome.status if outcome.status != "error" else f"error:{outcome.exception_type}"
            results[i] = CaseResult(status=outcome.status, signature=signature, signatures=(signature,), detail=outcome.detail, **common)
            continue
        problems = output_problems(case, reference, outcome.output, backend, outcome.variant)
        if problems:
            signature = f"error:{INVALID_OUTPUT}"
            detail = f"{outcome.backend}/{outcome.variant} returned an output unfit to judge: " + "; ".join(problems)
            results[i] = CaseResult(status="error", signature=signature, signatures=(signature,), detail=detail[:2000], **common)
            continue
        out = outcome.output
        lse = out.lse
        if lse is not None and backend.masked_row_lse is not None:
            ref_lse = getattr(reference, "reference", reference).lse
            if lse.device not in empty_rows:
                empty_rows[lse.device] = torch.isneginf(ref_lse).to(lse.device)
            lse = normalise_masked_lse(lse, ref_lse, backend.masked_row_lse, empty_rows=empty_rows[lse.device])
        to_compare.append(i)
        given.append({"out": out.out, "lse": lse, "dq": out.dq, "dk": out.dk, "dv": out.dv})
    if to_compare:
        for j, (i, verdict) in enumerate(zip(to_compare, compare_outputs_batch(case, reference, given))):
            metrics: dict[str, Any] = {name: tv.to_json() for name, tv in verdict.tensors.items()}
            signatures = tuple(verdict.signatures)
            if not verdict.passed:
                signatures, block = explain(case, reference, given[j], verdict, calls[i][1], opinion=phase in OPINION_PHASES)
                if block is not None:
                    metrics[DESIGN_METRICS_KEY] = block
            results[i] = CaseResult(
                status="pass" if verdict.passed else "fail",
                signature=None if verdict.passed else signatures[0],
                signatures=signatures,
                metrics=metrics,
                error_ratio=storable_error_ratio(verdict.error_ratio),
                selected_kernel=calls[i][0].output.selected_kernel,
                **commons[i],
            )
    return results  # type: ignore[return-value]


DESIGN_METRICS_KEY = "design"
"""The key of a failing result's design explanation in ``CaseResult.metrics``
(`oracle.emulate.Explanation.to_json`, or ``{"error": ...}`` when the explanation itself failed)."""


EXPLAIN_MS_KEY = "explain_ms"
"""The key, in a failing result's design block, of the wall milliseconds its explanation took."""

OPINION_PHASES = frozenset({"confirm", "replay"})
"""Phases whose failing results carry the whole second opinion (`explain` with ``opinion``): the
confirmation of a minimised case and the replay of a stored bucket. A fuzz or shrink result gets
the same signatures from the cheaper explanation (only its failing tensors emulated, the mechanism
from the float64 magnitudes)."""


def explain(
    case: AttentionCase, reference: Any, given: dict[str, Any], verdict: Any, backend: Backend, *, opinion: bool = True
) -> tuple[tuple[str, ...], dict[str, Any] | None]:
    """Tell a defect from the limit of ``backend``'s design for a failing verdict
    (`oracle.emulate.explain_failure`; `oracle.design.UNDECLARED` for a backend that declares
    none): ``(signatures, the metrics block)``; the block is None (and the verdict's signatures
    stand) when ``reference`` keeps no inputs (a bare `oracle.reference.ReferenceResult`). The signatures are the verdict's, with each
    tensor a correct kernel of the design fails the same way as ``<tensor>:limit`` (or
    ``<tensor>:unjudgeable``) after the others. Never raises: a failure of the explanation (no
    inputs kept with the reference, a bug of ours, a design object that is not a
    `oracle.design.Design`) keeps the verdict's signatures and records the error. ``opinion``:
    the bucket's second opinion in full (`oracle.emulate.explain_failure` with ``complete``, the
    whole design's emulation judged on every tensor, and ``ablate``, the mechanism named by
    single-claim emulations); ``judge_many`` asks for it in `OPINION_PHASES` only, the fuzz and
    shrink phases get the same signatures from the failing tensors' emulation alone (on the
    H200 the explanations of the fuzz and shrink phases shared the GPU with the kernels they
    judged: 2026-12-04, `docs/design-limits.md`)."""
    if getattr(reference, "inputs", None) is None:
        return tuple(verdict.signatures), None
    from oracle.design import UNDECLARED, Design
    from oracle.emulate import explain_failure

    try:
        design = getattr(backend, "design", None)
        if design is None:
            design = UNDECLARED
        if not isinstance(design, Design):
            raise TypeError(f"design: {type(design).__name__} is not an oracle.design.Design")
        t0 = time.perf_counter()
        explanation = explain_failure(case, reference, given, verdict, design, ablate=opinion, complete=opinion)
        block = explanation.to_json()
        # what this result's explanation cost (the emulations it ran; those cached from another
        # backend's result of the case are not counted again): summed by benchmarks/gpu/summarise.py
        block[EXPLAIN_MS_KEY] = round((time.perf_counter() - t0) * 1000.0, 3)
        return explanation.signatures, block
    except Exception as exc:  # the verdict stands; the evidence is kept
        return tuple(verdict.signatures), {"error": f"{type(exc).__name__}: {exc}"[:500]}


@dataclass
class Evaluation:
    """What `Evaluator.evaluate` found for one case.

    Attributes:
        case: the case.
        results: one `CaseResult` per (backend, variant) considered: the unsupported ones first,
            then the runnable ones in task order. For a CP case these are the CP results (with
            ``metrics["cp"]``).
        twin_case: for a CP case whose outcomes carried non-CP runs, `fuzzer.backends.cp_layout.cp_twin` of it;
            else None.
        twin_results: the twin's results (same inputs and oracle), to be recorded with
            ``twin_case``.
        twins: one entry per runnable result (the last ``runnable`` of ``results``): its twin's
            result, or None.
        runnable: how many tasks ran.
        inputs_s: seconds spent generating the inputs.
        oracle_s: seconds of the float64 oracle, wall time in this thread (with a concurrent
            executor the kernels ran meanwhile).
        kernel_s, compile_s: backend run and JIT compile seconds summed over the outcomes (as
            the children measured them; concurrent environments overlap, so the sum can exceed
            the wall time).
        wait_s: wall seconds spent collecting the outcomes after the oracle (with a
            concurrent executor: what the oracle did not hide; else the whole run).
        judge_s: seconds spent comparing (reference preparation included).
        task_timing_s: per backend, seconds by part outside the library calls
            (`fuzzer.executor.TASK_TIMING_PARTS`, summed over this case's outcomes; empty in
            process), plus ``run`` and ``compile``.
        not_applicable: by backend, variants not considered: they send no distinct call for
            this case (`fuzzer.backends.base.Backend.applicable_variants`); no result.
        skipped: by backend, tasks not run because another variant of the backend crashed or
            timed out on this case (fuzz phase only: `fuzzer.executor.SKIPPED`); no result.
        slowest: ``(backend, seconds)`` of the environment that took longest on this case (the
            first backend of its tasks), or None without child timing.
        busy: by backend, tasks not run because the backend's environment was still working on an
            earlier case (lanes, ``lane_grace_s``: `fuzzer.executor.BUSY`); no result.
        late: lanes: the environments still working when the grace time ran out (`LateRun`); their
            results come from `Evaluator.collect_late`, not in ``results``. None otherwise.
        pending: background judging: the ``ok`` outcomes being judged on the judge thread
            (`PendingJudgement`); their results are not in ``results``. None otherwise.
        background: this evaluation was made on the judge thread (`PendingJudgement.result`):
            its ``judge_s`` ran beside the caller's thread, not on it.
    """

    case: AttentionCase
    results: list[CaseResult] = field(default_factory=list)
    twin_case: AttentionCase | None = None
    twin_results: list[CaseResult] = field(default_factory=list)
    twins: list[CaseResult | None] = field(default_factory=list)
    runnable: int = 0
    inputs_s: float = 0.0
    oracle_s: float = 0.0
    kernel_s: float = 0.0
    compile_s: float = 0.0
    wait_s: float = 0.0
    judge_s: float = 0.0
    task_timing_s: dict[str, dict[str, float]] = field(default_factory=dict)
    slowest: tuple[str, float] | None = None
    not_applicable: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    busy: Counter = field(default_factory=Counter)
    late: LateRun | None = None
    pending: PendingJudgement | None = None
    background: bool = False

    def note_timing(self, outcome: Any) -> None:
        """Add ``outcome``'s run, compile and `fuzzer.executor.TaskOutcome.timing` parts to
        `task_timing_s` (seconds) and keep the slowest environment (its ``env_wall``)."""
        parts = self.task_timing_s.setdefault(outcome.backend, {})
        parts["tasks"] = parts.get("tasks", 0.0) + 1
        parts["run"] = parts.get("run", 0.0) + outcome.run_ms / 1000.0
        parts["compile"] = parts.get("compile", 0.0) + outcome.compile_ms / 1000.0
        for part, ms in (getattr(outcome, "timing", None) or {}).items():
            parts[part] = parts.get(part, 0.0) + ms / 1000.0
            if part == "env_wall" and (self.slowest is None or ms / 1000.0 > self.slowest[1]):
                self.slowest = (outcome.backend, ms / 1000.0)


@dataclass
class LateRun:
    """The part of a case's run still in flight when the evaluator stopped waiting (lanes): what
    `Evaluator.collect_late` needs to judge it later. Holds the inputs (a child may read them
    through shared memory until it is done) and the prepared reference, so at most one per
    environment is alive at a time.

    Attributes:
        case: the case.
        tasks: the ``(backend, variant)`` tasks still running, in order.
        handle: the executor's handle of those tasks (``done()``, ``result()``).
        prepared: the case's `oracle.compare.PreparedReference`.
        inputs: the case's inputs (kept alive while the children read them).
        oracle_ms: the oracle's time for the case, milliseconds (recorded with each result).
        phase: recorded with each result.
    """

    case: AttentionCase
    tasks: list[tuple[str, str]]
    handle: Any
    prepared: Any
    inputs: Any
    oracle_ms: float
    phase: str

    def done(self) -> bool:
        """Whether every task has finished (collecting then does not wait)."""
        done = getattr(self.handle, "done", None)
        return bool(done()) if callable(done) else True


class PendingJudgement:
    """The ``ok`` outcomes of one case (or of a `LateRun`) being judged on the evaluator's judge
    thread (`Evaluator.evaluate` and `Evaluator.collect_late` with ``judge_later``).

    Attributes:
        case: the case.
        backends: the backends whose outcomes it judges (each ran the case: a caller counting
            the backends that ran a case counts these, `fuzzer.coverage.count_case`).
        future: the judge thread's `concurrent.futures.Future` of the `Evaluation`.
        meta: free for the caller (the worker keeps its repeat key and the case's other results
            there).
    """

    def __init__(self, case: AttentionCase, backends: set[str], future: Future):
        self.case = case
        self.backends = backends
        self.future = future
        self.meta: dict[str, Any] = {}

    def done(self) -> bool:
        """Whether the judgement is finished (`result` then does not wait)."""
        return self.future.done()

    def result(self, timeout: float | None = None) -> Evaluation:
        """The `Evaluation` of the judged outcomes (``background`` set; its ``results`` one per
        outcome in order, ``judge_s`` the judge thread's seconds), waiting up to ``timeout``
        seconds (None: until done). Never raises for a failure of the judging itself: each
        outcome then gets its own-step error (`Evaluator._own_step_failed`).

        Raises:
            concurrent.futures.TimeoutError: not done within ``timeout``.
        """
        return self.future.result(timeout)


def applicable_tasks(
    backends: Iterable[Backend], case: AttentionCase, guard: PluginGuard | None = None
) -> tuple[list[tuple[str, str]], Counter]:
    """The default tasks of ``case``: each backend's `fuzzer.backends.base.Backend.applicable_variants`
    as ``(backend, variant)`` in order, and by backend how many variants were left out (no
    distinct call for the case; backends with none left out are not in the counter). A backend
    whose ``applicable_variants`` fails (`fuzzer.guard`, through ``guard``) contributes every
    variant: the split then records what its checks do."""
    tasks: list[tuple[str, str]] = []
    left_out: Counter = Counter()
    for backend in backends:
        try:
            applicable = _applicable_variants(backend, case, guard or GUARD)
        except PluginCallError:
            applicable = tuple(backend.variants)
        tasks.extend((backend.name, v) for v in applicable)
        left_out[backend.name] += len(backend.variants) - len(applicable)
    return tasks, +left_out


def _applicable_variants(backend: Backend, case: AttentionCase, guard: PluginGuard | None) -> tuple[str, ...]:
    """``backend.applicable_variants(case)`` through ``guard`` (None: in this thread, already
    under a guard), checked: a list of its own variants."""

    def check(value: Any) -> str | None:
        problem = list_of_str(value)
        if problem is None and any(v not in backend.variants for v in value):
            problem = f"returned {list(value)!r}: not all of them variants of the backend {tuple(backend.variants)!r}"
        return problem

    if guard is None:
        return tuple(ask(backend, "applicable_variants", case, check=check))
    return tuple(guard.call(backend, "applicable_variants", case, check=check))


def declared_reasons(
    backend: Backend, case: AttentionCase, variants: Iterable[str] | None, guard: PluginGuard | None = None
) -> dict[str, list[str]]:
    """``backend.unsupported_reasons(case, variant)`` of each of ``variants`` (None: its
    `fuzzer.backends.base.Backend.applicable_variants`), in order, asked in one call through
    ``guard`` (a plugin's: one thread hop for all, under one deadline).

    Raises:
        fuzzer.guard.PluginCallError: a method raised, returned something other than a list of
            str, or ran past the deadline (the backend is then quarantined).
    """
    guard = guard or GUARD

    def answers() -> dict[str, list[str]]:
        considered = _applicable_variants(backend, case, None) if variants is None else variants
        return {v: list(ask(backend, "unsupported_reasons", case, v, check=list_of_str)) for v in considered}

    return guard.run(backend, "unsupported_reasons" if variants is not None else "applicable_variants", answers)


def set_skip_after_crash(executor: Any, on: bool) -> None:
    """Turn `fuzzer.executor.ChildProcessExecutor.skip_after_crash` on or off for ``executor``
    and the executor behind it (a CP `fuzzer.cp.executor.RoutingExecutor`'s ``default``);
    executors without it (in process, CP) are left alone."""
    for target in (executor, getattr(executor, "default", None)):
        if target is not None and hasattr(target, "skip_after_crash"):
            target.skip_after_crash = on


def make_executor(
    backends: list[tuple[Backend, str]],
    isolation: str = "process",
    memory_limit_bytes: int | None = None,
) -> Any:
    """The executor for ``backends`` without context parallelism: child processes
    (``"process"``) or in process (``"none"``). CP backends run their ``cp_size == 1`` cases in it;
    `fuzzer.cp.executor.make_executor_with_cp` puts the CP executor in front of it.

    Raises:
        ValueError: ``isolation`` is unknown.
    """
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation: unknown value {isolation!r} (allowed: {', '.join(ISOLATIONS)})")
    if isolation == "process":
        return ChildProcessExecutor(backends, memory_limit_bytes=memory_limit_bytes)
    return InProcessExecutor(backends)


class Evaluator:
    """Runs one case through backends and judges every outcome (see the module docstring).

    Args:
        backends: ``(backend, spec)`` pairs (spec = ``module:attr`` that loads it in a child).
        executor: what runs the calls; None: `make_executor` with ``isolation``, which runs no CP
            case (with a CP backend among ``backends`` pass
            `fuzzer.cp.executor.make_executor_with_cp`, as the worker and the replay do).
        device: ``"cpu"`` or ``"cuda"``: where inputs and the oracle live.
        case_timeout_s: per backend call, seconds, before its child is killed.
        isolation: ``"process"`` or ``"none"`` (used when ``executor`` is None).
        memory_limit_bytes: child resident-memory limit (used when ``executor`` is None).
        guard: what the backends' own methods are called through in this process
            (`fuzzer.guard.PluginGuard`; default `fuzzer.guard.GUARD`). A backend whose method
            raises or returns garbage gets ``error`` results for the case
            (`plugin_error_result`); one whose method runs past the deadline is quarantined:
            ``quarantined`` names it with the reason, and it leaves ``usable``.

    Use `open` (availability, starts the children) before `evaluate`, `close` after; or a
    ``with`` block.
    """

    def __init__(
        self,
        backends: list[tuple[Backend, str]],
        executor: Any = None,
        *,
        device: str = "cpu",
        case_timeout_s: float = 120.0,
        isolation: str = "process",
        memory_limit_bytes: int | None = None,
        guard: PluginGuard | None = None,
    ):
        self.guard = guard if guard is not None else GUARD
        #: backend name -> why it was quarantined (a method of it ran past the guard's deadline)
        self.quarantined: dict[str, str] = {}
        self.specs = list(backends)
        self.backends: dict[str, Backend] = {b.name: b for b, _ in backends}
        self.device = device
        self.case_timeout_s = case_timeout_s
        if executor is None and any(is_cp_backend(b) for b, _ in self.specs):
            raise ValueError(
                "executor: a CP backend needs the CP executor; pass "
                "executor=fuzzer.cp.executor.make_executor_with_cp(backends, isolation, memory_limit_bytes)"
            )
        self.executor = executor if executor is not None else make_executor(self.specs, isolation, memory_limit_bytes)
        self.unavailable: dict[str, str] = {}
        self.usable: list[Backend] = list(self.backends.values())
        self._judge_pool: ThreadPoolExecutor | None = None  # the judge thread (background judging), started on first use
        self._judge_stream: Any = None  # its CUDA stream (on a GPU)

    def open(self) -> dict[str, str]:
        """Set this process's torch threads (`fuzzer.executor.configure_torch_threads`), ask the
        executor for each backend's availability (this starts the children) and keep the
        available ones in ``usable``. Returns ``{name: reason}`` of the unavailable ones."""
        configure_torch_threads()
        availability = self.executor.availability()
        self.unavailable = {n: r for n, r in availability.items() if r}
        self.usable = [b for n, b in self.backends.items() if n not in self.unavailable]
        return self.unavailable

    def close(self) -> None:
        """Stop the executor's child processes, after the judge thread has finished what was
        given to it (background judging)."""
        if self._judge_pool is not None:
            self._judge_pool.shutdown(wait=True)
            self._judge_pool = None
        if self.executor is not None:
            self.executor.close()
            self.executor = None

    def __enter__(self) -> Evaluator:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def split(
        self, case: AttentionCase, tasks: list[tuple[str, str]] | None = None, phase: str = "fuzz"
    ) -> tuple[list[tuple[str, str]], list[CaseResult]]:
        """Runnable ``(backend, variant)`` tasks and ``unsupported`` results for ``case``.

        Args:
            case: the case.
            tasks: explicit tasks (any loaded backend); None: every variant of every usable backend.
            phase: recorded with the unsupported results.
        """
        runnable, unsupported, _ = self.split_applicable(case, tasks, phase)
        return runnable, unsupported

    def split_applicable(
        self, case: AttentionCase, tasks: list[tuple[str, str]] | None = None, phase: str = "fuzz"
    ) -> tuple[list[tuple[str, str]], list[CaseResult], Counter]:
        """`split`, and the variants left out by backend: with ``tasks`` None, only the
        `fuzzer.backends.base.Backend.applicable_variants` of each usable backend are
        considered (no result for a variant that sends no distinct call for ``case``); explicit
        ``tasks`` are all considered."""
        runnable: list[tuple[str, str]] = []
        unsupported: list[CaseResult] = []
        left_out: Counter = Counter()
        self._drop_quarantined()
        asked: dict[str, Any] = {}  # backend -> {variant: reasons} or the PluginCallError
        considered_backends = list(self.usable)
        if tasks is None:
            order = [(b.name, None) for b in considered_backends]
        else:
            order = [(name, variant) for name, variant in tasks]
        for name in dict.fromkeys(name for name, _ in order):
            backend = self.backends[name]
            variants = None if tasks is None else [v for n, v in order if n == name]
            try:
                asked[name] = declared_reasons(backend, case, variants, self.guard)
            except PluginCallError as exc:
                asked[name] = exc
                if exc.timed_out:
                    self._quarantine(name, exc)
        if tasks is None:
            order = []
            for backend in considered_backends:
                answer = asked.get(backend.name)
                considered = list(answer) if isinstance(answer, dict) else list(backend.variants)
                order.extend((backend.name, v) for v in considered)
                left_out[backend.name] += len(backend.variants) - len(considered)
            left_out = +left_out
        for name, variant in order:
            backend = self.backends[name]
            answer = asked[name]
            if isinstance(answer, PluginCallError):
                unsupported.append(plugin_error_result(case, backend, variant, answer, phase))
                continue
            reasons = answer[variant]
            if reasons:
                unsupported.append(unsupported_result(case, backend, variant, reasons, phase))
            else:
                runnable.append((name, variant))
        return runnable, unsupported, left_out

    def _quarantine(self, name: str, error: PluginCallError) -> None:
        """Take backend ``name`` out of ``usable`` for good: a method of it ran past the deadline."""
        if name in self.quarantined:
            return
        self.quarantined[name] = self.guard.quarantined.get(name) or error.reason
        self.usable = [b for b in self.usable if b.name != name]

    def _drop_quarantined(self) -> None:
        """Quarantine the usable backends the guard has quarantined since (a ``version_string``
        that hung while a result was judged)."""
        for backend in list(self.usable):
            reason = self.guard.quarantined.get(backend.name)
            if reason is not None:
                self._quarantine(backend.name, PluginCallError(backend.name, "?", reason, timed_out=True))

    def evaluate(
        self,
        case: AttentionCase,
        phase: str = "fuzz",
        tasks: list[tuple[str, str]] | None = None,
        *,
        lane_grace_s: float | None = None,
        judge_later: bool = False,
    ) -> Evaluation:
        """Run ``case`` on ``tasks`` (default: every variant of every usable backend) and judge it.

        Args:
            case: the case.
            phase: recorded with each result (``fuzz``, ``shrink``, ``confirm``, ``replay``).
            tasks: explicit ``(backend, variant)`` list; unsupported ones come back as such.
            lane_grace_s: lanes (None: off, the whole run is waited for). An environment still
                busy with an earlier case's late part is left out of this case (`Evaluation.busy`),
                and after the oracle the evaluator waits at most this many seconds for the
                others: what is still running then becomes ``Evaluation.late``, judged later by
                `collect_late`. With an executor without lanes (in process, serial children, a CP
                case) the whole run is waited for.
            judge_later: background judging: the ``ok`` outcomes are judged on the judge thread
                (``Evaluation.pending``, a `PendingJudgement`) and the comparison's preparation
                is left to it; the others' results are in ``results`` at once. A CP outcome (its
                twin) is always judged here.

        Returns:
            The `Evaluation` (nothing is stored).

        Raises:
            fuzzer.executor.ExecutorError: the executor could not start a child (as its ``run``).
        """
        runnable, results, left_out = self.split_applicable(case, tasks, phase)
        evaluation = Evaluation(case=case, results=results, runnable=len(runnable), not_applicable=left_out)
        if not runnable:
            return evaluation
        try:
            inputs = self._inputs(case, evaluation)
        except Exception as exc:  # MemoryError, OverflowError, OracleTimeout, a bug of ours ...
            evaluation.results.append(self._own_step_failed(case, exc, "oracle", phase))
            return evaluation
        set_skip_after_crash(self.executor, phase == "fuzz")
        lanes = lane_grace_s is not None
        handle = submit_run(self.executor, case, inputs, runnable, self.case_timeout_s, skip_busy=lanes)
        try:
            prepared, oracle_ms = self._oracle(case, inputs, evaluation, eager=not judge_later)
        except Exception as exc:  # MemoryError, OverflowError, OracleTimeout, a bug of ours ...
            handle.abandon()  # wait for what runs (the children stay in step); its outcomes are dropped
            evaluation.results.append(self._own_step_failed(case, exc, "oracle", phase))
            return evaluation
        t_wait = time.perf_counter()
        if lanes:
            outcomes, rest = handle.partial(lane_grace_s)
        else:
            outcomes, rest = handle.result(), None
        t0 = time.perf_counter()
        evaluation.wait_s += t0 - t_wait
        self._judge_outcomes(case, prepared, oracle_ms, phase, outcomes, evaluation, judge_later=judge_later)
        evaluation.judge_s += time.perf_counter() - t0
        if rest is not None:
            evaluation.late = LateRun(case, rest.tasks, rest, prepared, inputs, oracle_ms, phase)
            evaluation.runnable -= len(rest.tasks)
        if evaluation.twin_results:
            evaluation.twin_case = cp_twin(case)
        return evaluation

    def collect_late(self, late: LateRun, wait: bool = False, *, judge_later: bool = False) -> Evaluation | None:
        """Judge the outcomes of ``late`` (the part of an `evaluate` with ``lane_grace_s`` still
        running then): an `Evaluation` of the same case holding only those results (and their
        kernel, compile and judging seconds; ``wait_s`` is what this call waited), or None when
        they are not all done and ``wait`` is false. With ``judge_later`` the ``ok`` outcomes go
        to the judge thread (``Evaluation.pending``), as in `evaluate`.

        Raises:
            fuzzer.executor.ExecutorError: a child could not be started (as ``result()``).
        """
        if not wait and not late.done():
            return None
        evaluation = Evaluation(case=late.case, runnable=len(late.tasks))
        t_wait = time.perf_counter()
        outcomes = late.handle.result()
        t0 = time.perf_counter()
        evaluation.wait_s += t0 - t_wait
        self._judge_outcomes(late.case, late.prepared, late.oracle_ms, late.phase, outcomes, evaluation, judge_later=judge_later)
        evaluation.judge_s += time.perf_counter() - t0
        if evaluation.twin_results:
            evaluation.twin_case = cp_twin(late.case)
        return evaluation

    def _judge_outcomes(
        self, case: AttentionCase, prepared: Any, oracle_ms: float, phase: str, outcomes: list[TaskOutcome], evaluation: Evaluation,
        *, judge_later: bool = False,
    ) -> None:
        """Judge ``outcomes`` into ``evaluation`` (results, twins, seconds, timing); `SKIPPED`
        and `BUSY` outcomes leave no result and are counted instead. With ``judge_later`` and
        no CP outcome among them, the ``ok`` outcomes go to the judge thread
        (``evaluation.pending``) and the others are judged here."""
        ran = []
        for outcome in outcomes:
            if outcome.status in (SKIPPED, BUSY):  # not run: another variant ended the child, or its environment was busy
                (evaluation.skipped if outcome.status == SKIPPED else evaluation.busy)[outcome.backend] += 1
                evaluation.runnable -= 1
                continue
            evaluation.kernel_s += outcome.run_ms / 1000.0
            evaluation.compile_s += outcome.compile_ms / 1000.0
            evaluation.note_timing(outcome)
            ran.append(outcome)
        if judge_later and all(type(o).judged is TaskOutcome.judged for o in ran):
            later = [o for o in ran if o.status == "ok"]
            if later:
                ran = [o for o in ran if o.status != "ok"]
                evaluation.pending = self._judge_in_background(case, prepared, oracle_ms, phase, later)
        if ran:
            self._judge_ran(case, prepared, oracle_ms, phase, ran, evaluation)

    def _judge_ran(
        self, case: AttentionCase, prepared: Any, oracle_ms: float, phase: str, ran: list[TaskOutcome], evaluation: Evaluation
    ) -> None:
        """Judge outcomes that ran into ``evaluation`` (results, twins, the twins' seconds).
        Plain outcomes (no CP twin: `fuzzer.executor.TaskOutcome.judged` not overridden) are
        judged together (`judge_many`); when that raises, each is judged on its own, so an
        own-step failure names its outcome."""
        plain = [o for o in ran if type(o).judged is TaskOutcome.judged]
        batched: dict[int, CaseResult] = {}
        if len(plain) > 1:
            try:
                calls = [(o, self.backends[o.backend]) for o in plain]
                batched = dict(zip(map(id, plain), judge_many(case, prepared, calls, oracle_ms=oracle_ms, phase=phase, guard=self.guard)))
            except Exception:  # judged one by one below: the failure is then reported with its outcome
                batched = {}
        for outcome in ran:
            result = batched.get(id(outcome))
            if result is not None:
                twin_result = None
            else:
                try:
                    result, twin_result = self._judge_one(case, prepared, outcome, oracle_ms, phase)
                except Exception as exc:
                    result, twin_result = self._own_step_failed(case, exc, "compare", phase, outcome), None
            evaluation.results.append(result)
            evaluation.twins.append(twin_result)
            if twin_result is not None:
                evaluation.twin_results.append(twin_result)
                twin_outcome = outcome.twin_outcome()
                if twin_outcome is not None:
                    evaluation.kernel_s += twin_outcome.run_ms / 1000.0
                    evaluation.compile_s += twin_outcome.compile_ms / 1000.0

    # ------------------------------------------------------------------ background judging
    def _judge_in_background(
        self, case: AttentionCase, prepared: Any, oracle_ms: float, phase: str, outcomes: list[TaskOutcome]
    ) -> PendingJudgement:
        """Give plain ``outcomes`` of ``case`` to the judge thread (started on first use); returns
        their `PendingJudgement`. On a GPU the judge thread works on its own CUDA stream, which
        first waits for what this thread queued so far (the inputs, the oracle, the reference)."""
        ready = None
        if self._judge_pool is None:  # the caller's thread is the only one that gives work
            self._judge_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnfuzz-judge")
            self._judge_stream = _new_judge_stream(self.device)
        if self._judge_stream is not None:
            import torch

            ready = torch.cuda.Event()
            ready.record()  # on this thread's current stream
        future = self._judge_pool.submit(self._judge_job, case, prepared, oracle_ms, phase, outcomes, ready)
        return PendingJudgement(case, {o.backend for o in outcomes}, future)

    def _judge_job(
        self, case: AttentionCase, prepared: Any, oracle_ms: float, phase: str, outcomes: list[TaskOutcome], ready: Any
    ) -> Evaluation:
        """The judge thread's work for one `PendingJudgement`: an `Evaluation` (``background``
        set) of ``outcomes``. Every GPU operation of it is done when it returns (its stream is
        synchronised), so the tensors it used may be freed by any thread. A failure of the
        judging itself gives each outcome its own-step error (never raises)."""
        t0 = time.perf_counter()
        evaluation = Evaluation(case=case, background=True)
        stream = self._judge_stream
        try:
            if stream is not None:
                import torch

                stream.wait_event(ready)
                with torch.cuda.stream(stream):
                    self._judge_ran(case, prepared, oracle_ms, phase, outcomes, evaluation)
                stream.synchronize()
            else:
                self._judge_ran(case, prepared, oracle_ms, phase, outcomes, evaluation)
        except Exception as exc:  # a CUDA error of the stream, a bug of ours: every outcome gets the evidence
            evaluation.results = [self._own_step_failed(case, exc, "compare", phase, o) for o in outcomes]
            evaluation.twins = [None] * len(outcomes)
        evaluation.judge_s = time.perf_counter() - t0
        return evaluation

    # ------------------------------------------------------------------ attnfuzz's own steps
    def _inputs(self, case: AttentionCase, evaluation: Evaluation) -> Any:
        """The inputs of ``case`` (`oracle.inputs.make_inputs` on the evaluator's device), after
        `oracle.config.AttentionCase.check_resources`, under the per-case time bound; adds to
        ``evaluation.inputs_s``. Raises what those raise (`OracleTimeout` past the bound)."""
        from oracle.inputs import make_inputs

        case.check_resources()  # before any allocation (also a case built before a lower bound was set)
        t0 = time.perf_counter()
        with oracle_time_bound(self.case_timeout_s):
            inputs = make_inputs(case, device=self.device)
            device_done(self.device)  # the inputs' GPU work is theirs, not the next step's
        evaluation.inputs_s += time.perf_counter() - t0
        return inputs

    def _oracle(self, case: AttentionCase, inputs: Any, evaluation: Evaluation, *, eager: bool = True) -> tuple[Any, float]:
        """The oracle of ``inputs`` and the prepared comparison reference of ``case``, under what
        the inputs left of the per-case time bound (one bound for both steps, as before the
        overlap); ``(prepared, oracle ms)``. Main thread only for the bound (`oracle_time_bound`).
        Adds to ``evaluation.oracle_s`` (the reference) and ``judge_s`` (the preparation, done
        here with ``eager``, else by the first judgement: the judge thread's, in background
        judging)."""
        from oracle.compare import PreparedReference
        from oracle.reference import reference

        bound = self.case_timeout_s
        if bound:
            bound = max(bound - evaluation.inputs_s, 1e-3)  # > 0: a zero would mean no bound
        with oracle_time_bound(bound):
            t1 = time.perf_counter()
            ref = reference(case, inputs, backward=case.backward)
            device_done(self.device)  # the oracle's GPU work is the oracle's (see device_done)
            t2 = time.perf_counter()
        evaluation.oracle_s += t2 - t1
        prepared = PreparedReference(case, ref, inputs=inputs, eager=eager)
        evaluation.judge_s += time.perf_counter() - t2  # the comparison's own preparation
        return prepared, (t2 - t1) * 1000.0

    def _judge_one(
        self, case: AttentionCase, prepared: Any, outcome: TaskOutcome, oracle_ms: float, phase: str
    ) -> tuple[CaseResult, CaseResult | None]:
        """`judge` of one outcome (with its CP twin, if any: `fuzzer.executor.TaskOutcome.judged`):
        ``(result, twin_result or None)``."""
        backend = self.backends[outcome.backend]
        return outcome.judged(
            case, prepared.reference, lambda c, o: judge(c, prepared, o, backend, oracle_ms=oracle_ms, phase=phase, guard=self.guard)
        )

    def _own_step_failed(
        self, case: AttentionCase, exc: BaseException, step: str, phase: str, outcome: TaskOutcome | None = None
    ) -> CaseResult:
        """The one place for a failure of attnfuzz's own steps on one case: an ``error`` result
        with the evidence (exception type, message, the innermost frames), and the worker goes on.

        Args:
            step: ``"oracle"`` (inputs or float64 reference: the result is recorded under the
                pseudo backend ``attnfuzz``, variant ``oracle``: no backend is to blame) or
                ``"compare"`` (judging ``outcome``: recorded under its backend variant).

        Returns:
            The result, signature ``attnfuzz_error:<ExceptionType>``.
        """
        import traceback

        frames = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:])
        detail = f"attnfuzz's own {step} step failed on {case.describe()}: {type(exc).__name__}: {exc}\n{frames}"
        backend, variant = (outcome.backend, outcome.variant) if outcome is not None else (OWN_BACKEND, step)
        return CaseResult(
            case.case_id,
            backend,
            variant,
            "error",
            signature=f"attnfuzz_error:{type(exc).__name__}",
            signatures=(f"attnfuzz_error:{type(exc).__name__}",),
            detail=detail,
            phase=phase,
        )


OWN_BACKEND = "attnfuzz"
"""The backend name of results about attnfuzz's own steps (the oracle failed on a case)."""


class OracleTimeout(Exception):
    """The float64 oracle ran past the per-case time limit (`oracle_time_bound`)."""


def device_done(device: Any) -> None:
    """Wait until the work queued on ``device`` by this thread is done (its current stream's
    ``synchronize`` on a CUDA device, so not the judge thread's stream, `Evaluator`'s background
    judging; nothing on the CPU, where torch runs each operation before returning).

    Why: CUDA operations return once queued, so without it the GPU time of the inputs and of the
    float64 oracle was counted where the host next waited for the GPU, the comparison's
    preparation (`oracle.compare.PreparedReference` fetches its figures at once), i.e. as
    attnfuzz's own work instead of the oracle's. The wait costs no time: that preparation waits
    for the same work right after. Raises what ``torch.cuda.Stream.synchronize`` raises (a CUDA
    error of the queued work)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.current_stream(dev).synchronize()  # this thread's work only: not the judge thread's stream


def _new_judge_stream(device: str) -> Any:
    """The judge thread's CUDA stream on ``device`` (a stream of torch's pool, which does not
    wait for the default stream implicitly), or None on the CPU."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    return torch.cuda.Stream(device=dev if dev.index is not None else torch.cuda.current_device())


@contextmanager
def oracle_time_bound(seconds: float | None) -> Iterator[None]:
    """Raise `OracleTimeout` in this thread once ``seconds`` pass inside the block: the same
    per-case limit as a backend's child, for the oracle that runs in the worker. A ``SIGALRM``
    timer (``setitimer``): its handler raises between Python bytecodes, and the blockwise oracle
    returns to Python after every block, so the bound holds to about one block. Only in the main
    thread (signals go there); elsewhere, or with ``seconds`` None, no bound."""
    import signal
    import threading

    if not seconds or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expired(_signum: int, _frame: Any) -> None:
        raise OracleTimeout(f"the float64 oracle ran past the per-case limit of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def with_phase(result: CaseResult, phase: str) -> CaseResult:
    """``result`` with ``phase`` replaced."""
    return result if result.phase == phase else dataclasses.replace(result, phase=phase)


__all__ = [
    "Evaluation",
    "LateRun",
    "Evaluator",
    "ISOLATIONS",
    "OWN_BACKEND",
    "STORED_NONFINITE_RATIO",
    "OracleTimeout",
    "PendingJudgement",
    "judge",
    "judge_many",
    "oracle_time_bound",
    "make_executor",
    "normalise_masked_lse",
    "storable_error_ratio",
    "unsupported_result",
    "with_phase",
]
