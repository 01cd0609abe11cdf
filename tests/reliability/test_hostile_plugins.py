"""Hostile and careless plugins (issue 38): a backend that writes into its inputs, reuses its
output buffer, returns an output unfit to judge, or whose own methods raise, return garbage or
hang in the worker's process costs that backend, never the run or another backend's verdict.

The stand-ins are in `tests.reliability.hostile`; "large" inputs and outputs are just over
`fuzzer.executor.BYTES_TRANSPORT_MAX`, where they leave the pipe's bytes for shared memory.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fuzzer import registry
from fuzzer.evaluate import Evaluator
from fuzzer.executor import BYTES_TRANSPORT_MAX, ChildProcessExecutor
from fuzzer.guard import PluginGuard
from fuzzer.results import BuildFingerprint
from fuzzer.sinks import MemorySink
from fuzzer.worker import Worker, WorkerConfig
from oracle.config import AttentionCase
from oracle.inputs import make_inputs
from service.db import migrations
from service.db.engine import make_engine
from service.db.store import SqlStore
from tests.reliability.hostile import BROKEN_METHODS, BROKEN_OUTPUTS

pytestmark = pytest.mark.timeout(300)

HOSTILE = "tests.reliability.hostile"
CORRECT = "tests.fuzzer.standins:CorrectBackend"
# q of [1, 4200, 8, 64] float32 is 8.6 MB, just over BYTES_TRANSPORT_MAX; k and v stay small
LARGE = AttentionCase(seqlen_q=4200, seqlen_k=16, num_heads=8, head_dim=64, dtype="float32")
SMALL = AttentionCase(seqlen_q=6, seqlen_k=5, num_heads=2, head_dim=16, dtype="float32")
BACKWARD = AttentionCase(seqlen_q=6, seqlen_k=5, num_heads=2, head_dim=16, dtype="float32", backward=True)


def _verdicts(evaluation) -> dict[tuple[str, str], tuple[str, str | None]]:
    return {(r.backend, r.variant): (r.status, r.signature) for r in evaluation.results}


def test_large_inputs_travel_to_the_child_as_a_copy_and_the_workers_own_stay_where_they_are() -> None:
    """Break 1a: an input over 8 MiB was pickled for the child from an environment thread, which
    moved the worker's own tensor into shared memory while the main thread read it for the oracle
    (``--backend torch-cpu-math``, a corpus case just over that size: SIGSEGV in 2 runs of 3).
    The child now gets a copy in shared memory made before the send: the worker's tensors keep
    their storage (not shared, same address) however the send and the oracle interleave."""
    inputs = make_inputs(LARGE)
    assert inputs.q.numel() * inputs.q.element_size() > BYTES_TRANSPORT_MAX
    before = {name: getattr(inputs, name).data_ptr() for name in ("q", "k", "v")}
    with ChildProcessExecutor(registry.select([], [CORRECT]), parallel=True) as executor:
        handle = executor.submit(LARGE, inputs, [("standin-ok", "native")], 120.0)
        outcome = handle.result()[0]
    assert outcome.status == "ok", outcome.detail
    after = {name: getattr(inputs, name).data_ptr() for name in ("q", "k", "v")}
    assert after == before and not inputs.q.is_shared(), (before, after, inputs.q.is_shared())


@pytest.mark.parametrize(
    ("case", "isolation"),
    [
        pytest.param(SMALL, "process", id="small-children"),
        pytest.param(LARGE, "process", id="large-children"),
        pytest.param(SMALL, "none", id="small-in-process"),
    ],
)
def test_a_backend_that_writes_into_its_inputs_is_reported_and_no_other_verdict_changes(case, isolation) -> None:
    """Break 1b: with inputs over 8 MiB torch-cpu-math failed (error ratio 714,848) while the
    culprit passed; at any size a backend in the culprit's child failed too. The culprit now gets
    ``error:InputMutated`` naming the tensors, and the backend in its child, the one in another
    child and the oracle all see the inputs as they were."""
    backends = registry.select(["torch-cpu-math"], [f"{HOSTILE}:InputWritingBackend", CORRECT])
    tasks = [("hostile-writes-inputs", "native"), ("standin-ok", "native"), ("torch-cpu-math", "is_causal")]
    executor = ChildProcessExecutor(backends, parallel=False) if isolation == "process" else None
    with Evaluator(backends, executor, isolation=isolation) as evaluator:
        verdicts = _verdicts(evaluator.evaluate(case, phase="fuzz", tasks=tasks))
        detail = next(r.detail for r in evaluator.evaluate(case, phase="replay", tasks=tasks[:1]).results)
    assert verdicts == {
        ("hostile-writes-inputs", "native"): ("error", "error:InputMutated"),
        ("standin-ok", "native"): ("pass", None),
        ("torch-cpu-math", "is_causal"): ("pass", None),
    }, verdicts
    assert "wrote into its inputs q, k" in detail, detail


@pytest.mark.parametrize(
    ("case", "isolation"),
    [pytest.param(LARGE, "process", id="large-children"), pytest.param(SMALL, "none", id="small-in-process")],
)
def test_a_plugin_that_reuses_its_output_buffer_is_reported_and_its_correct_variant_passes(case, isolation) -> None:
    """Break 1c: a plugin that returned one output buffer over 8 MiB for two variants (``right``
    first, then ``zeros`` into the same buffer) had ``right`` judged failing: its output, moved
    into shared memory in place, changed under it. Outputs now leave the child as copies and the
    reuse is an ``error:OutputReused`` of the variant that reused the buffer."""
    backends = registry.select([], [f"{HOSTILE}:ReusedBufferBackend"])
    executor = ChildProcessExecutor(backends, parallel=False) if isolation == "process" else None
    with Evaluator(backends, executor, isolation=isolation) as evaluator:
        evaluation = evaluator.evaluate(case, phase="fuzz")
    verdicts = _verdicts(evaluation)
    assert verdicts == {
        ("hostile-reuses-output", "right"): ("pass", None),
        ("hostile-reuses-output", "zeros"): ("error", "error:OutputReused"),
    }, verdicts
    detail = next(r.detail for r in evaluation.results if r.variant == "zeros")
    assert "out (the out of hostile-reuses-output/right)" in detail, detail


@pytest.mark.parametrize("isolation", ["process", "none"])
def test_an_output_unfit_to_judge_is_an_error_naming_the_field_never_a_pass(isolation) -> None:
    """Break 4: ``out=None``, no gradients or no lse for a backward case were judged ``pass``, and
    float64 or complex outputs passed too (the dtype was not checked); a list for lse crashed the
    child. Each is now ``error:InvalidOutput`` with the field and what was expected."""
    backends = registry.select([], [f"{HOSTILE}:BrokenOutputBackend"])
    with Evaluator(backends, isolation=isolation) as evaluator:
        results = evaluator.evaluate(BACKWARD, phase="fuzz").results
    seen = {r.variant: r for r in results}
    assert set(seen) == set(BROKEN_OUTPUTS), sorted(seen)
    for variant, says in BROKEN_OUTPUTS.items():
        r = seen[variant]
        assert (r.status, r.signature) == ("error", "error:InvalidOutput"), (variant, r.status, r.signature, r.detail)
        assert says in r.detail, (variant, r.detail)


def test_plugin_checks_that_raise_or_return_garbage_cost_that_backend_only() -> None:
    """Break 5: an ``unsupported_reasons`` that raised ended the run with exit 1 and no result of
    any backend. Each broken check (`tests.reliability.hostile.BROKEN_METHODS`) now gives its
    backend ``error:PluginError`` naming the method; a ``version_string`` that raises leaves the
    results stored with the version ``unknown (...)``; the correct backend passes."""
    specs = [CORRECT, f"{HOSTILE}:RaisingVersionBackend"] + [f"{HOSTILE}:{cls.__name__}" for _, cls in BROKEN_METHODS.values()]
    backends = registry.select([], specs)
    with Evaluator(backends, isolation="none", guard=PluginGuard(30.0)) as evaluator:
        results = evaluator.evaluate(SMALL, phase="fuzz").results
    by_backend = {r.backend: r for r in results}
    assert (by_backend["standin-ok"].status, by_backend["hostile-raises-version"].status) == ("pass", "pass"), results
    assert by_backend["hostile-raises-version"].backend_version.startswith("unknown (version_string() raised OSError")
    for name, (says, _) in BROKEN_METHODS.items():
        r = by_backend[name]
        assert (r.status, r.signature) == ("error", "error:PluginError"), (name, r.status, r.signature, r.detail)
        assert says in r.detail, (name, r.detail)


def test_a_plugin_check_that_hangs_is_quarantined_at_the_deadline_and_the_worker_goes_on() -> None:
    """Break 5: a plugin whose ``unsupported_reasons`` hung in the worker's process (the draw
    filter, the split) hung the worker forever with no message. The call runs under the guard's
    deadline: the backend gets ``error:PluginTimeout`` once, is quarantined with the reason, and
    the worker fuzzes the others to its case budget."""
    backends = registry.select([], [CORRECT, f"{HOSTILE}:HangingChecksBackend"])
    config = WorkerConfig(
        backends=backends, isolation="none", shrink=False, max_cases=4, seed=1, chunk_size=4, plugin_deadline_s=1.0
    )
    t0 = time.monotonic()
    stats = Worker(config, MemorySink()).run()
    took_s = time.monotonic() - t0
    assert "hostile-hangs-checks" in stats.backends_quarantined, stats.backends_quarantined
    assert stats.backends_quarantined["hostile-hangs-checks"] == "unsupported_reasons() did not return within 1 s"
    statuses = stats.per_backend
    assert statuses[("standin-ok", "pass")] >= 1 and stats.cases >= 1, statuses
    assert statuses[("hostile-hangs-checks", "error")] <= 1, statuses
    assert took_s < 120, f"the run took {took_s:.0f} s: a hung check held it up"


def test_a_nan_or_negative_compile_time_is_stored_as_zero(tmp_path: Path) -> None:
    """Break 5: a plugin's NaN ``compile_ms`` reached the NOT NULL column as NULL and ended the
    worker with exit 1. A ``compile_ms`` that is no finite number >= 0 is taken as 0 (what it was
    is kept in the output's extra) and every result is stored."""
    url = f"sqlite:///{tmp_path / 'attnfuzz.db'}"
    migrations.upgrade(url)
    engine = make_engine(url)
    try:
        store = SqlStore(engine)
        build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
        backends = registry.select([], [f"{HOSTILE}:NanCompileBackend"])
        with Evaluator(backends, isolation="process") as evaluator:
            results = evaluator.evaluate(SMALL, phase="fuzz").results
        assert [(r.variant, r.status, r.compile_ms) for r in results] == [
            ("nan", "pass", 0.0), ("negative", "pass", 0.0), ("text", "pass", 0.0)
        ], results
        store.record_case_results(SMALL.to_json(), "fuzz", results, build_id, None)
    finally:
        engine.dispose()


def test_an_availability_that_raises_makes_only_that_backend_unavailable() -> None:
    """An ``availability`` that raised in a child killed the child at its start: every backend of
    the environment was unavailable with "died at start". Now only that backend is, with what it
    raised; the other backend of its child runs."""
    backends = registry.select([], [CORRECT, f"{HOSTILE}:RaisingAvailabilityBackend"])
    with ChildProcessExecutor(backends) as executor:
        availability = executor.availability()
    assert availability["standin-ok"] is None, availability
    assert availability["hostile-raises-availability"].startswith("availability() raised RuntimeError: planted"), availability


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (f"{HOSTILE}:StrVariantsBackend", "variants: expected a non-empty tuple of distinct non-empty str, got 'default'"),
        (f"{HOSTILE}:DictCapabilitiesBackend", "capabilities: expected a fuzzer.backends.base.Capabilities, got dict"),
        (f"{HOSTILE}:BadDeviceBackend", "device: expected 'cpu' or 'cuda', got 'gpu'"),
        ("tests.reliability.hostile_import:Backend", "importing tests.reliability.hostile_import failed: RuntimeError: planted"),
    ],
)
@pytest.mark.parametrize("command", ["backends", "fuzz"])
def test_a_plugin_declaration_or_import_error_is_one_clear_line(tmp_path: Path, command: str, spec: str, says: str) -> None:
    """Break 5: declaration and import errors of a plugin gave exit-1 tracebacks (or errors deep
    in the worker). Each is one line naming the spec and what is wrong, exit code 3 (a plugin
    that cannot be loaded), before anything runs."""
    from service.cli.main import app

    args = [command, "--backend", spec]
    if command == "fuzz":
        args += ["--db", f"sqlite:///{tmp_path / 'never.db'}", "--max-cases", "1", "--workers", "1"]
    result = CliRunner().invoke(app, args)
    words = " ".join(result.output.split())  # the message may wrap at the terminal's width
    assert result.exit_code == 3, result.output
    assert words.startswith("error: ") and spec in words and says in words, result.output
    assert "Traceback" not in result.output and result.output.count("error: ") == 1, result.output
