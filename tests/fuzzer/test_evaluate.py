"""`fuzzer.evaluate`: the Evaluator judges every task of a case (planted all-zero kernel found,
unsupported tasks reported), child processes give the same verdicts as in-process runs (tensors
as bytes), the prepared comparison equals the plain one, and the worker writes each case once."""

from __future__ import annotations

import dataclasses
import math
import time

import torch

from fuzzer import executor as executor_module
from fuzzer.backends.base import BackendOutput
from fuzzer.evaluate import STORED_NONFINITE_RATIO, Evaluator, storable_error_ratio
from fuzzer.executor import (
    ChildProcessExecutor,
    ExecutorError,
    InProcessExecutor,
    PackedTensor,
    configure_torch_threads,
    pack_inputs,
    unpack_inputs,
)
from fuzzer.registry import load_spec
from fuzzer.sinks import MemorySink
from fuzzer.worker import Worker, WorkerConfig
from oracle.compare import PreparedReference, compare_outputs
from oracle.config import AttentionCase
from oracle.inputs import make_inputs
from oracle.reference import reference
from tests.fuzzer.standins import CorrectBackend

import pytest

# the stand-ins run float32, bshd, lengths up to 64
FORWARD = AttentionCase(batch_size=1, seqlen_q=40, seqlen_k=60, num_heads=2, head_dim=16, causal=True, dtype="float32", backward=False)
BACKWARD = AttentionCase(
    batch_size=2, seqlen_q=33, seqlen_k=64, num_heads=2, num_heads_kv=1, head_dim=8, backward=True, dtype="float32"
)
# for the comparison alone: bf16, more than one tile of rows, rows without a visible key
PREP_FORWARD = AttentionCase(batch_size=1, seqlen_q=150, seqlen_k=90, num_heads=2, head_dim=16, causal=True, backward=False)
PREP_BACKWARD = AttentionCase(
    batch_size=2, seqlen_q=70, seqlen_k=65, num_heads=2, num_heads_kv=1, head_dim=8, backward=True, window_size_left=3
)


class ZeroBackend(CorrectBackend):
    """Planted: variant ``zero`` returns an all-zero output; ``native`` is correct; it declares
    no support for head_dim above 16."""

    name = "standin-zero"
    environment = "standin-zero"
    variants = ("native", "zero")

    def unsupported_reasons(self, case, variant):
        reasons = super().unsupported_reasons(case, variant)
        return reasons + (["head_dim above 16"] if case.head_dim > 16 else [])

    def run(self, case, inputs, variant):
        output = super().run(case, inputs, variant)
        if variant == "zero":
            output = BackendOutput(out=torch.zeros_like(output.out), lse=output.lse, dq=output.dq, dk=output.dk, dv=output.dv)
        return output


BACKENDS = [(CorrectBackend(), "tests.fuzzer.standins:CorrectBackend"), (ZeroBackend(), "tests.fuzzer.test_evaluate:ZeroBackend")]



def judged(metrics: dict) -> dict:
    """A result's metrics without what measures time (the design block's ``explain_ms``): the
    verdict's figures, which two ways of judging one case must give alike."""
    from fuzzer.evaluate import DESIGN_METRICS_KEY, EXPLAIN_MS_KEY

    block = metrics.get(DESIGN_METRICS_KEY)
    if not isinstance(block, dict) or EXPLAIN_MS_KEY not in block:
        return metrics
    return {**metrics, DESIGN_METRICS_KEY: {k: v for k, v in block.items() if k != EXPLAIN_MS_KEY}}

def _by_task(results):
    return {(r.backend, r.variant): r for r in results}


def test_the_evaluator_finds_the_planted_zero_output_and_reports_unsupported_tasks_first() -> None:
    with Evaluator(BACKENDS, isolation="none") as evaluator:
        found = evaluator.evaluate(FORWARD)
        wide = evaluator.evaluate(AttentionCase(batch_size=1, seqlen_q=8, seqlen_k=8, num_heads=1, head_dim=32, dtype="float32"))
    results = _by_task(found.results)
    assert results[("standin-ok", "native")].status == "pass"
    assert results[("standin-zero", "native")].status == "pass"
    assert results[("standin-zero", "zero")].status == "fail"
    assert results[("standin-zero", "zero")].signature == "out:all_zero"
    assert found.runnable == 3 and found.oracle_s > 0
    assert [r.status for r in wide.results[:2]] == ["unsupported", "unsupported"]
    assert wide.runnable == 1 and "head_dim above 16" in wide.results[0].detail


def test_child_processes_give_the_verdicts_of_an_in_process_run() -> None:
    with Evaluator(BACKENDS, isolation="none") as evaluator:
        here = _by_task(evaluator.evaluate(BACKWARD).results)
    with Evaluator(BACKENDS, isolation="process") as evaluator:
        assert evaluator.unavailable == {}
        there = _by_task(evaluator.evaluate(BACKWARD).results)
    assert here.keys() == there.keys()
    for task, result in here.items():
        assert (result.status, result.signature, result.error_ratio) == (
            there[task].status, there[task].signature, there[task].error_ratio
        ), task
        assert judged(result.metrics) == judged(there[task].metrics), task
    assert there[("standin-zero", "zero")].signature == "out:all_zero"


@pytest.mark.parametrize("case", [PREP_FORWARD, PREP_BACKWARD], ids=["forward", "backward"])
def test_the_prepared_comparison_gives_the_plain_verdict(case: AttentionCase) -> None:
    inputs = make_inputs(case)
    ref = reference(case, inputs, backward=case.backward)
    prepared = PreparedReference(case, ref)
    out = ref.out.to(torch.bfloat16)
    wrong = out.clone()
    wrong[0, -1] += 1.0  # one wrong row
    grads = {name: getattr(ref, name).to(torch.bfloat16) for name in ("dq", "dk", "dv")} if case.backward else {}
    for candidate in (out, wrong):
        lse = ref.lse.float()
        plain = compare_outputs(case, ref, out=candidate, lse=lse, **grads)
        fast = compare_outputs(case, prepared, out=candidate, lse=lse, **grads)
        assert fast.to_json() == plain.to_json()
    assert not compare_outputs(case, prepared, out=wrong).passed
    assert compare_outputs(case, prepared, out=out).passed


def test_tensors_travel_as_bytes_and_come_back_equal(monkeypatch) -> None:
    for tensor in (torch.randn(3, 5).to(torch.bfloat16), torch.randn(2, 7), torch.arange(6, dtype=torch.int32),
                   torch.empty(0, 4), torch.randn(4, 6).t()):
        packed = PackedTensor.pack(tensor)
        assert isinstance(packed, PackedTensor)
        back = packed.unpack()
        assert back.dtype == tensor.dtype and back.shape == tensor.shape and torch.equal(back, tensor)
    monkeypatch.setattr(executor_module.transport, "BYTES_TRANSPORT_MAX", 16)
    large = torch.randn(100)
    shared = PackedTensor.pack(large)  # larger tensors take the shared-memory path, as a copy made here
    assert shared is not large and shared.is_shared() and torch.equal(shared, large)
    assert not large.is_shared()  # the oracle's tensor never moves under it


def test_a_forward_only_case_sends_no_dout() -> None:
    inputs = make_inputs(FORWARD)
    packed = pack_inputs(FORWARD, inputs)
    assert not isinstance(packed["dout"], PackedTensor)
    back = unpack_inputs(packed)
    assert back.dout.shape == inputs.dout.shape and back.dout.dtype == inputs.dout.dtype
    assert not back.dout.any()
    assert torch.equal(back.q, inputs.q) and torch.equal(back.v, inputs.v)
    assert isinstance(pack_inputs(BACKWARD, make_inputs(BACKWARD))["dout"], PackedTensor)


def test_torch_threads_are_set_per_process_and_bad_counts_are_refused(monkeypatch) -> None:
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("ATTNFUZZ_TORCH_THREADS", "two")
        with pytest.raises(ExecutorError, match="ATTNFUZZ_TORCH_THREADS"):
            configure_torch_threads()
        with pytest.raises(ExecutorError, match="positive"):
            configure_torch_threads(0)
        monkeypatch.setenv("ATTNFUZZ_TORCH_THREADS", "1")
        assert configure_torch_threads() == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


class CountingSink(MemorySink):
    def __init__(self) -> None:
        super().__init__()
        self.case_writes = 0
        self.single_writes = 0

    def record_case_results(self, case_json, origin, results, build_id, worker_id):
        self.case_writes += 1
        return super().record_case_results(case_json, origin, results, build_id, worker_id)

    def record_result(self, result, build_id, worker_id):
        self.single_writes += 1
        return super().record_result(result, build_id, worker_id)


def test_the_worker_writes_each_case_with_all_its_results_once() -> None:
    sink = CountingSink()
    config = WorkerConfig(backends=BACKENDS, isolation="none", time_budget_s=None, max_cases=4, seed=1,
                          shrink=False, replay_known=False, max_seqlen=64, allow_backward=False)
    stats = Worker(config, sink).run()
    assert stats.cases == 4
    # one write per case, but for a case drawn again in the run (seed 1 draws one twice): its
    # first run's results are reused and nothing is written again (`fuzzer.loop.repeats.RepeatMemo`)
    assert stats.repeated >= 1 and sink.case_writes == 4 == len(sink.cases)  # a repeat is not a case
    assert sum(stats.results.values()) == 4 * 3  # 3 tasks per case, unsupported ones included
    assert len(sink.results) == 3 * len(sink.cases)  # each distinct case stored with its 3 results, once
    assert sink.single_writes == 3 * sink.case_writes  # only from inside MemorySink's one write per case


def test_a_non_finite_error_ratio_is_stored_as_a_finite_stand_in_above_every_real_ratio():
    assert storable_error_ratio(None) is None
    assert storable_error_ratio(3.5) == 3.5
    assert storable_error_ratio(float("inf")) == STORED_NONFINITE_RATIO
    assert storable_error_ratio(float("nan")) == STORED_NONFINITE_RATIO
    assert STORED_NONFINITE_RATIO > 1e100 and STORED_NONFINITE_RATIO < float("inf")


def test_a_cp_backend_needs_the_cp_executor_and_a_plain_outcome_is_judged_without_a_twin():
    from fuzzer.backends.cp_cpu import RingAttentionCPUBackend
    from fuzzer.cp.executor import RoutingExecutor, make_executor_with_cp
    from fuzzer.executor import TaskOutcome

    specs = [(RingAttentionCPUBackend(), "fuzzer.backends.cp_cpu:RingAttentionCPUBackend")]
    with pytest.raises(ValueError, match="make_executor_with_cp"):
        Evaluator(specs, isolation="none")
    executor = make_executor_with_cp(specs, "none")
    try:
        assert isinstance(executor, RoutingExecutor), type(executor)
    finally:
        executor.close()
    outcome = TaskOutcome("cp-cpu-ring", "default", "ok")
    assert outcome.twin_outcome() is None
    assert outcome.judged(AttentionCase(), None, lambda case, o: (case.case_id, o.status)) == ((AttentionCase().case_id, "ok"), None)


# ------------------------------------------------ the oracle overlaps the children (ChildProcessExecutor.submit)
MARKER_SPECS = [(b, spec) for spec in ("tests.fuzzer.standins:MarkerMakeBackend", "tests.fuzzer.standins:CorrectBackend")
                for b in load_spec(spec)]


def test_the_oracle_is_computed_while_the_children_run(tmp_path, monkeypatch) -> None:
    """The reference, in this process, waits (bounded) for the file the maker's child creates when
    its task starts: it sees it only if the task was sent before the oracle ran."""
    import oracle.reference
    from tests.fuzzer.standins import marker_path

    monkeypatch.setenv("ATTNFUZZ_MARKER_DIR", str(tmp_path))
    real = oracle.reference.reference
    seen: list[bool] = []

    def waiting_reference(case, inputs, **kwargs):
        deadline = time.monotonic() + 60.0  # bounded: reached only when the overlap is missing
        while not marker_path(case.case_id).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        seen.append(marker_path(case.case_id).exists())
        return real(case, inputs, **kwargs)

    with Evaluator(MARKER_SPECS, executor=ChildProcessExecutor(MARKER_SPECS, parallel=True)) as evaluator:
        monkeypatch.setattr(oracle.reference, "reference", waiting_reference)
        evaluation = evaluator.evaluate(FORWARD)
    assert seen == [True]
    assert [(r.backend, r.status) for r in evaluation.results] == [("standin-marker-make", "pass"), ("standin-ok", "pass")]


WINDOWED = AttentionCase(batch_size=1, seqlen_q=20, seqlen_k=24, num_heads=2, head_dim=16, window_size_left=3, dtype="float32", backward=True)


@pytest.mark.parametrize("case", [FORWARD, BACKWARD, WINDOWED], ids=["forward", "backward", "windowed"])
def test_the_overlapped_evaluation_gives_the_serial_verdicts(case) -> None:
    verdicts = {}
    for parallel in (True, False):
        with Evaluator(BACKENDS, executor=ChildProcessExecutor(BACKENDS, parallel=parallel)) as evaluator:
            evaluation = evaluator.evaluate(case)
        verdicts[parallel] = [(r.backend, r.variant, r.status, r.signature, r.error_ratio, judged(r.metrics)) for r in evaluation.results]
        assert evaluation.runnable == 3 and evaluation.oracle_s > 0 and evaluation.inputs_s > 0
    assert verdicts[True] == verdicts[False]
    assert [v[2] for v in verdicts[True]] == ["pass", "pass", "fail"]


def test_an_oracle_failure_after_submission_waits_for_the_children_and_returns_the_own_step_error_alone(
    tmp_path, monkeypatch
) -> None:
    import oracle.reference
    from fuzzer.evaluate import OWN_BACKEND
    from tests.fuzzer.standins import marker_path

    monkeypatch.setenv("ATTNFUZZ_MARKER_DIR", str(tmp_path))

    def broken(case, inputs, **kwargs):
        raise OverflowError("Python int too large to convert to C long")

    executor = ChildProcessExecutor(MARKER_SPECS, parallel=True)
    with Evaluator(MARKER_SPECS, executor=executor) as evaluator:
        monkeypatch.setattr(oracle.reference, "reference", broken)
        failed = evaluator.evaluate(FORWARD)
        assert executor._in_flight is None  # collected: nothing left on the pipes
        assert marker_path(FORWARD.case_id).exists()  # the tasks had been sent and ran
        monkeypatch.undo()
        monkeypatch.setenv("ATTNFUZZ_MARKER_DIR", str(tmp_path))
        after = evaluator.evaluate(BACKWARD)
    assert [(r.backend, r.variant, r.status, r.signature) for r in failed.results] == [
        (OWN_BACKEND, "oracle", "error", "attnfuzz_error:OverflowError")]
    assert failed.twins == [] and failed.kernel_s == 0.0
    assert [(r.backend, r.status) for r in after.results] == [("standin-marker-make", "pass"), ("standin-ok", "pass")]


def test_executors_without_submit_keep_the_serial_order(monkeypatch) -> None:
    """An executor with only ``run`` is called after the oracle, and not at all when it fails."""
    import oracle.reference

    calls: list[str] = []

    class RunOnly:
        def __init__(self, specs):
            self.inner = InProcessExecutor(specs)

        def availability(self):
            return self.inner.availability()

        def run(self, case, inputs, tasks, timeout_s):
            calls.append("run")
            return self.inner.run(case, inputs, tasks, timeout_s)

        def close(self):
            pass

    real = oracle.reference.reference

    def recording(case, inputs, **kwargs):
        calls.append("oracle")
        return real(case, inputs, **kwargs)

    with Evaluator(BACKENDS, executor=RunOnly(BACKENDS)) as evaluator:
        monkeypatch.setattr(oracle.reference, "reference", recording)
        assert [r.status for r in evaluator.evaluate(FORWARD).results] == ["pass", "pass", "fail"]
        assert calls == ["oracle", "run"]
        monkeypatch.setattr(oracle.reference, "reference", lambda *a, **k: 1 / 0)
        assert [r.signature for r in evaluator.evaluate(FORWARD).results] == ["attnfuzz_error:ZeroDivisionError"]
        assert calls == ["oracle", "run"]


def test_a_long_backend_version_line_keeps_its_runtime_part() -> None:
    """The line names every package a backend declares and then what its child loaded; the
    runtime part (which cuDNN ran the result) comes last and must not be cut off (at 128
    characters it was, on the H200, 2026-12-01)."""
    from fuzzer.results import CaseResult

    packages = " ".join(f"package-{i}==1.{i}.0" for i in range(12))
    line = f"{packages} runtime:cudnn==9.27.0 runtime:cudnn_path=/root/.cache/attnfuzz/builds/x/site/nvidia/cudnn/lib"
    assert len(line) > 200
    result = CaseResult("0" * 16, "te-fused", "mask_type", "pass", backend_version=line)
    assert result.backend_version == line
    assert "runtime:cudnn==9.27.0" in result.backend_version


def test_inputs_on_two_devices_all_reach_the_backends_device(monkeypatch) -> None:
    """Small tensors travel as bytes (host), large ones as handles (their device): a child can get
    q on one device and k on another. inputs_on moves exactly the tensors elsewhere (here: the
    "meta" device stands in for a second one, CI has no GPU) and leaves inputs already in place
    as the same object, without building a lazy dout."""
    from fuzzer.executor import inputs_on
    from oracle.inputs import make_inputs

    case = AttentionCase(seqlen_q=3, seqlen_k=4, head_dim=8, dtype="float32", backward=False)
    inputs = make_inputs(case)
    assert not inputs.dout_built
    assert inputs_on(inputs, "cpu") is inputs
    assert not inputs.dout_built  # checked without reading the lazy dout
    mixed = dataclasses.replace(inputs, k=inputs.k.to("meta"))
    moved = inputs_on(mixed, "meta")
    assert moved.k is mixed.k and moved.q.device.type == "meta" and moved.v.device.type == "meta"
    # the H200's case: a large q already on the device, a small k from bytes on the host
    large_q = dataclasses.replace(inputs, q=inputs.q.to("meta"))
    fixed = inputs_on(large_q, "meta")
    assert fixed.q is large_q.q and fixed.k.device.type == "meta" and fixed.v.device.type == "meta"


def test_a_case_s_outcomes_are_judged_together_with_the_verdicts_of_judging_each_alone(monkeypatch) -> None:
    """The evaluator judges a case's plain outcomes in one batch (`fuzzer.evaluate.judge_many`):
    each result equals `judge` of its outcome alone (status, signatures, figures), the planted
    all-zero variant fails among passing ones, and the batch is really used (the one-by-one path
    is not taken). When the batch raises, each outcome is judged on its own and the failure names
    its outcome."""
    from fuzzer import evaluate as evaluate_module

    calls = []
    real = evaluate_module.judge_many
    monkeypatch.setattr(evaluate_module, "judge_many", lambda *a, **k: calls.append(len(a[2])) or real(*a, **k))
    with Evaluator(BACKENDS, isolation="none") as evaluator:
        found = evaluator.evaluate(BACKWARD)
        batches = list(calls)
        inputs = make_inputs(BACKWARD)
        ref = PreparedReference(BACKWARD, reference(BACKWARD, inputs, backward=True), inputs=inputs)  # as the evaluator keeps it
        alone = {}
        for (backend, _), name in zip(BACKENDS, ("standin-ok", "standin-zero")):
            for variant in backend.variants:
                outcome = executor_module.run_task(backend, BACKWARD, make_inputs(BACKWARD), variant)
                alone[(name, variant)] = evaluate_module.judge(BACKWARD, ref, outcome, backend)
    assert batches == [3]  # the three runnable tasks of the case, together
    results = _by_task(found.results)
    assert results[("standin-zero", "zero")].signature == "out:all_zero"
    assert results[("standin-ok", "native")].status == results[("standin-zero", "native")].status == "pass"
    for key, result in results.items():
        assert (result.status, result.signatures, judged(result.metrics)) == (alone[key].status, alone[key].signatures, judged(alone[key].metrics))

    def broken(*a, **k):
        raise RuntimeError("planted batch failure")

    monkeypatch.setattr(evaluate_module, "judge_many", broken)
    with Evaluator(BACKENDS, isolation="none") as evaluator:
        fallback = _by_task(evaluator.evaluate(BACKWARD).results)
    # judge() calls judge_many too, so each one-by-one judging raises: an own-step error per outcome
    assert {r.signature for r in fallback.values()} == {"attnfuzz_error:RuntimeError"}
    assert set(fallback) == set(results)


def test_device_done_waits_for_a_cuda_device_only(monkeypatch) -> None:
    from fuzzer import evaluate

    waited = []

    class Stream:
        def __init__(self, device):
            self.device = device

        def synchronize(self):
            waited.append(self.device)

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream(device))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(("whole device", device)))
    evaluate.device_done("cpu")
    assert waited == []
    evaluate.device_done("cuda:0")
    # this thread's stream only: the judge thread's stream (background judging) is not waited for
    assert waited == [torch.device("cuda:0")]


def test_the_inputs_and_the_oracle_wait_for_their_device_before_their_time_is_taken(monkeypatch) -> None:
    """The GPU time of the inputs and of the oracle is theirs: each step waits for its device
    before its clock stops (else it was counted as the comparison's, attnfuzz's own work)."""
    from fuzzer import evaluate

    order = []
    import oracle.inputs as inputs_module
    import oracle.reference as reference_module

    real_make_inputs, real_reference = inputs_module.make_inputs, reference_module.reference
    monkeypatch.setattr(inputs_module, "make_inputs", lambda *a, **k: (order.append("inputs"), real_make_inputs(*a, **k))[1])
    monkeypatch.setattr(reference_module, "reference", lambda *a, **k: (order.append("oracle"), real_reference(*a, **k))[1])
    monkeypatch.setattr(evaluate, "device_done", lambda device: order.append(f"done:{device}"))
    with Evaluator(BACKENDS, isolation="none") as ev:
        evaluation = ev.evaluate(FORWARD)
    assert evaluation.results
    assert order == ["inputs", "done:cpu", "oracle", "done:cpu"]


def test_the_masked_lse_normalised_with_the_case_s_empty_rows_is_the_same() -> None:
    """`normalise_masked_lse` with the reference's empty rows given (once per case, on the lse's
    device: an output that came as bytes stays on the host) maps the same entries, and only those:
    the sentinel on a row that sees no key, not the sentinel elsewhere nor another value there."""
    from fuzzer.evaluate import normalise_masked_lse

    ref_lse = torch.tensor([[0.5, -math.inf, 1.0, -math.inf]], dtype=torch.float64)
    lse = torch.tensor([[0.0, 0.0, 0.0, 3.0]], dtype=torch.float32)  # sentinel 0 on rows 0, 1, 2; row 3 says 3
    plain = normalise_masked_lse(lse, ref_lse, 0.0)
    given = normalise_masked_lse(lse, ref_lse, 0.0, empty_rows=torch.isneginf(ref_lse))
    assert torch.equal(plain, given) and given.device == lse.device
    assert given.tolist() == [[0.0, -math.inf, 0.0, 3.0]]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_reference_moved_to_the_host_in_one_transfer_holds_the_same_values_and_verdicts() -> None:
    """`ReferenceResult.to_host` on a GPU: every tensor (error scales included) equal to the
    device's, on the host, in its shape; the verdicts of outputs judged against it agree with
    those judged on the device (signatures equal, error ratios to 1e-9)."""
    from oracle.compare import compare_outputs_batch
    from oracle.config import torch_dtype

    ref = reference(PREP_BACKWARD, make_inputs(PREP_BACKWARD, "cuda"))
    host = ref.to_host()
    for name in ("out", "lse", "dq", "dk", "dv"):
        a, b = getattr(ref, name), getattr(host, name)
        assert b.device.type == "cpu" and b.shape == a.shape and torch.equal(a.cpu(), b), name
    assert set(host.error_scales) == set(ref.error_scales)
    for name, t in ref.error_scales.items():
        assert torch.equal(t.cpu(), host.error_scales[name]), name
    dtype = torch_dtype(PREP_BACKWARD.dtype)
    right = {n: getattr(ref, n).to(torch.float32 if n == "lse" else dtype).cpu() for n in ("out", "lse", "dq", "dk", "dv")}
    zero = dict(right, out=torch.zeros_like(right["out"]))
    on_device = compare_outputs_batch(PREP_BACKWARD, PreparedReference(PREP_BACKWARD, ref), [right, zero])
    on_host = compare_outputs_batch(PREP_BACKWARD, PreparedReference(PREP_BACKWARD, host), [right, zero])
    for a, b in zip(on_device, on_host):
        assert a.signatures == b.signatures
        assert math.isclose(a.error_ratio, b.error_ratio, rel_tol=1e-9) or a.error_ratio == b.error_ratio
    assert on_host[0].passed and "out:all_zero" in on_host[1].signatures


# ---------------------------------------------------------------- background judging
def _figures(results):
    return {(r.backend, r.variant): (r.status, r.signature, r.signatures, r.error_ratio, judged(r.metrics)) for r in results}


@pytest.mark.parametrize("case", [FORWARD, BACKWARD], ids=["forward", "backward"])
def test_judging_on_the_judge_thread_gives_the_inline_verdicts(case) -> None:
    """``judge_later``: the ok outcomes come back from the judge thread (``pending``), with the
    figures of inline judging, field for field; the case's other results are there at once."""
    with Evaluator(BACKENDS, isolation="none") as evaluator:
        inline = evaluator.evaluate(case)
        later = evaluator.evaluate(case, judge_later=True)
        assert later.pending is not None and later.results == []  # every task ran ok: all judged later
        judged = later.pending.result(timeout=60)
    assert judged.background and judged.case is case and judged.judge_s > 0
    assert later.runnable == inline.runnable == len(judged.results)
    assert later.pending.backends == {"standin-ok", "standin-zero"}
    assert _figures(judged.results) == _figures(inline.results)
    assert _by_task(judged.results)[("standin-zero", "zero")].signature == "out:all_zero"


class RaisingBackend(CorrectBackend):
    """Planted: variant ``raise`` raises (an ``error`` outcome, not ok); ``native`` is correct."""

    name = "standin-raise"
    environment = "standin-raise"
    variants = ("native", "raise")

    def run(self, case, inputs, variant):
        if variant == "raise":
            raise RuntimeError("planted failure")
        return super().run(case, inputs, variant)


def test_outcomes_that_did_not_return_are_results_at_once_and_only_ok_ones_wait_for_the_judge_thread() -> None:
    backends = [(RaisingBackend(), "tests.fuzzer.test_evaluate:RaisingBackend")]
    with Evaluator(backends, isolation="none") as evaluator:
        evaluation = evaluator.evaluate(FORWARD, judge_later=True)
        judged = evaluation.pending.result(timeout=60)
    assert [(r.variant, r.status, r.signature) for r in evaluation.results] == [("raise", "error", "error:RuntimeError")]
    assert [(r.variant, r.status) for r in judged.results] == [("native", "pass")]


def test_a_failure_of_the_judging_on_the_judge_thread_becomes_each_outcome_s_own_step_error(monkeypatch) -> None:
    """Planted: the judging itself raises on the judge thread; each outcome it held gets the
    own-step error with the evidence, and the evaluator goes on (the next case is judged)."""
    from fuzzer import evaluate

    import threading

    real = evaluate.Evaluator._judge_ran

    def broken(self, *args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            raise ZeroDivisionError("planted bug in the judging")
        return real(self, *args, **kwargs)

    with Evaluator(BACKENDS, isolation="none") as evaluator:
        monkeypatch.setattr(evaluate.Evaluator, "_judge_ran", broken)
        judged = evaluator.evaluate(FORWARD, judge_later=True).pending.result(timeout=60)
        monkeypatch.undo()
        after = evaluator.evaluate(FORWARD, judge_later=True).pending.result(timeout=60)
    assert len(judged.results) == 3
    assert {r.signature for r in judged.results} == {"attnfuzz_error:ZeroDivisionError"}
    assert all("planted bug in the judging" in r.detail for r in judged.results)
    assert {r.status for r in after.results} == {"pass", "fail"}


def test_the_evaluator_s_close_waits_for_the_judge_thread() -> None:
    evaluator = Evaluator(BACKENDS, isolation="none")
    evaluator.open()
    pending = evaluator.evaluate(BACKWARD, judge_later=True).pending
    evaluator.close()
    assert pending.done() and len(pending.result().results) == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_judge_thread_judges_on_its_own_stream_with_the_inline_verdicts() -> None:
    with Evaluator(BACKENDS, isolation="none", device="cuda") as evaluator:
        inline = evaluator.evaluate(BACKWARD)
        later = evaluator.evaluate(BACKWARD, judge_later=True)
        judged = later.pending.result(timeout=120)
        assert evaluator._judge_stream is not None and evaluator._judge_stream != torch.cuda.current_stream()
    assert _figures(judged.results) == _figures(inline.results)
