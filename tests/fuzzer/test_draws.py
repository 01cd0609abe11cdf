"""Issue 14 items 1-2: backend-aware (targeted) draws, the case space (a work budget on
seqlen_q * seqlen_k, decode-like shapes, device defaults) and per-backend coverage, live and in
``attnfuzz report``.

Every Hypothesis run here is derandomised (the ``ci`` profile, or explicit settings) and every
worker run has a fixed ``seed``, so nothing depends on the machine's speed or luck.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from fuzzer import registry
from fuzzer.backends.base import Backend, Capabilities
from fuzzer.coverage import count_case, reason_keys, target_plan, top_reasons
from fuzzer.results import BuildFingerprint, CaseResult
from fuzzer.sinks import MemorySink
from fuzzer.strategies import CPU_BOUNDS, GPU_BOUNDS, StrategyArgumentError, attention_cases, default_bounds
from fuzzer.worker import Reporter, Worker, WorkerConfig, WorkerError
from oracle.config import AttentionCase
from tests.fuzzer.planted_draws import LongRowBackend, is_planted_region

PLANTED = "tests.fuzzer.planted_draws:LongRowBackend"
NARROW = "tests.fuzzer.standins:CorrectBackend"  # float32 only, head_dim <= 64, max_seqlen 64


# ------------------------------------------------------------------------------ the target policy
def test_equal_backends_take_turns_and_the_rotation_moves_the_first():
    names = ["a", "b", "c"]
    assert target_plan(names, {}, {}, 6) == ["a", "b", "c", "a", "b", "c"]
    assert target_plan(names, {}, {}, 3, rotation=1) == ["b", "c", "a"]
    assert target_plan(names, {}, {}, 3, rotation=5) == ["c", "a", "b"]


def test_the_backend_with_the_fewest_runnable_cases_is_favoured():
    plan = target_plan(["a", "b", "c"], {"a": 10, "b": 0, "c": 4}, {}, 8)
    assert plan[0] == "b"
    counts = Counter(plan)
    assert counts["b"] > counts["c"] > counts["a"]
    assert plan == ["b", "b", "b", "b", "b", "c", "b", "c"]  # b catches up with c, then they alternate


def test_a_backend_whose_drawn_cases_never_run_is_not_the_target_forever():
    # b ran nothing but 30 cases were drawn for it already: a (5 run) is the target again
    plan = target_plan(["a", "b"], {"a": 5, "b": 0}, {"a": 5, "b": 30}, 10)
    assert Counter(plan) == {"a": 10}
    # without the drawn counts b would have taken every slot
    assert Counter(target_plan(["a", "b"], {"a": 5, "b": 0}, {}, 5)) == {"b": 5}


def test_the_policy_refuses_empty_inputs():
    with pytest.raises(ValueError, match="names"):
        target_plan([], {}, {}, 3)
    with pytest.raises(ValueError, match="slots"):
        target_plan(["a"], {}, {}, 0)


# ------------------------------------------------------------------- draws inside a target's caps
class _Declared(Backend):
    """A backend that is exactly its capabilities (the base class's checks)."""

    variants = ("default",)

    def __init__(self, caps: Capabilities):
        self.capabilities = caps  # type: ignore[misc]

    def run(self, case, inputs, variant):  # pragma: no cover - never run
        raise NotImplementedError


def _capability_sets() -> list[Capabilities]:
    """Every built-in backend's declared capabilities (CUDA ones included: they are class data),
    the planted plugin's and the narrow stand-in's."""
    sets = [backend.capabilities for backend, _ in registry.discover().values()]
    from tests.fuzzer.standins import CAPS

    return sets + [LongRowBackend.capabilities, CAPS]


CAPABILITY_SETS = _capability_sets()
BOUNDS = [CPU_BOUNDS, GPU_BOUNDS]


@settings(max_examples=300, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_cases_drawn_for_a_target_stay_inside_its_capabilities_and_the_bounds(data):
    caps = data.draw(st.sampled_from(CAPABILITY_SETS), label="caps")
    bounds = data.draw(st.sampled_from(BOUNDS), label="bounds")
    max_cp_size = data.draw(st.sampled_from([1, 4]), label="max_cp_size")
    case = data.draw(
        attention_cases(
            capabilities=caps,
            max_batch_size=2,
            max_heads_kv=4,
            max_seqlen=bounds.max_seqlen,
            max_work=bounds.max_work,
            max_elements=bounds.max_elements,
            max_cp_size=max_cp_size,
        ),
        label="case",
    )
    assert _Declared(caps).unsupported_reasons(case, "default") == []
    if case.cp_size > 1:
        assert caps.cp and case.cp_size <= max_cp_size
        return  # CP lengths are multiples of 2 * cp_size (tests/fuzzer/test_cp_strategies.py)
    max_seqlen = bounds.max_seqlen or caps.max_seqlen
    assert case.seqlen_q <= max_seqlen and case.seqlen_k <= max_seqlen
    widest = max(case.head_dim, case.head_dim_v)
    work = case.batch_size * case.num_heads * case.seqlen_q * case.seqlen_k * widest
    assert work <= bounds.max_work or case.seqlen_q * case.seqlen_k == 1
    assert case.seqlen_q == 1 or case.batch_size * case.seqlen_q * case.num_heads * widest <= bounds.max_elements
    assert case.seqlen_k == 1 or case.batch_size * case.seqlen_k * case.num_heads_kv * widest <= bounds.max_elements


def test_a_target_without_float32_or_softcap_never_gets_them():
    caps = Capabilities(dtypes=("bfloat16",), head_dim_multiple=8, max_head_dim=128, softcap=False)

    @settings(max_examples=200, derandomize=True, database=None, deadline=None)
    @given(attention_cases(capabilities=caps, max_work=2**23, max_elements=2**18))
    def check(case):
        assert case.dtype == "bfloat16" and case.softcap is None
        assert case.head_dim % 8 == 0 and case.head_dim <= 128 and case.head_dim_v == case.head_dim

    check()


# ------------------------------------------------------------------------------- the case space
FIND = settings(max_examples=3000, database=None, derandomize=True, phases=[Phase.generate])  # first hit, no shrink


@pytest.mark.parametrize(
    "edges",
    [(8191, 8192), (4095, 4096, 4097), (2047, 2048, 2049), (1023, 1024, 1025)],
    ids=["8192", "4096", "2048", "1024"],
)
def test_decode_shapes_reach_the_long_row_edges_under_the_gpu_defaults(edges):
    caps = Capabilities(dtypes=("bfloat16",), qkv_formats=("bshd", "thd"), head_dim_multiple=8)
    strategy = attention_cases(
        capabilities=caps,
        max_batch_size=2,
        max_seqlen=GPU_BOUNDS.max_seqlen,
        max_work=GPU_BOUNDS.max_work,
        max_elements=GPU_BOUNDS.max_elements,
    )
    found = find(strategy, lambda c: c.seqlen_q <= 16 and c.seqlen_k in edges, settings=FIND)
    assert found.seqlen_q <= 16 and found.seqlen_k in edges


def test_under_the_cpu_defaults_the_old_per_length_bound_is_gone():
    """The old bound (each length <= sqrt(max_work / (batch*heads*head_dim))) never drew
    seqlen_k > 1024 on CPU; the product budget does, for a plugin with the default max_seqlen."""
    strategy = attention_cases(
        capabilities=LongRowBackend.capabilities,
        max_batch_size=2,
        max_work=CPU_BOUNDS.max_work,
        max_elements=CPU_BOUNDS.max_elements,
    )
    found = find(strategy, is_planted_region, settings=FIND)
    assert found.seqlen_k > 1024 and found.seqlen_q <= 16
    work = found.batch_size * found.num_heads * found.seqlen_q * found.seqlen_k * max(found.head_dim, found.head_dim_v)
    assert work > (found.batch_size * found.num_heads * max(found.head_dim, found.head_dim_v)) * 1024  # > sqrt bound


def test_device_defaults_and_explicit_bounds():
    cpu = registry.select(["torch-cpu-math"])
    config = WorkerConfig(backends=cpu, isolation="none")
    assert (config.max_seqlen, config.max_work, config.max_elements) == (None, 2**23, 2**18)
    assert config.draw == "targeted"
    gpu = WorkerConfig(backends=cpu, isolation="none", device="cuda")
    assert (gpu.max_seqlen, gpu.max_work, gpu.max_elements) == (8192, 2**32, 2**25)
    explicit = WorkerConfig(backends=cpu, isolation="none", device="cuda", max_seqlen=100, max_work=7, max_elements=9)
    assert (explicit.max_seqlen, explicit.max_work, explicit.max_elements) == (100, 7, 9)
    assert default_bounds("cpu") == CPU_BOUNDS
    with pytest.raises(StrategyArgumentError, match="device"):
        default_bounds("tpu")
    with pytest.raises(WorkerError, match="draw.*targeted, union"):
        WorkerConfig(backends=cpu, isolation="none", draw="everything")
    with pytest.raises(StrategyArgumentError, match="max_elements"):
        attention_cases(capabilities=Capabilities(), max_elements=0)


# --------------------------------------------------------------------------------- the worker
class _StopWhenFound(Reporter):
    """Ends the run (``max_cases`` reached) as soon as a bucket of ``backend`` is new."""

    def __init__(self, backend: str):
        self.backend = backend
        self.worker = None

    def on_start(self, worker):
        self.worker = worker

    def on_new_bucket(self, key, case):
        if key[0] == self.backend:
            self.worker.config.max_cases = 0


def test_a_default_cpu_campaign_finds_a_kernel_wrong_only_for_long_rows_with_few_queries():
    """The default CPU settings (targeted draws, CPU_BOUNDS) over a CPU backend and the plugin.
    With ``seed=8`` it is found within a few cases; ``max_cases`` bounds the run if the draws
    change (about 3% of the plugin's cases are in the planted region; 1024-key rows under the
    earlier per-length bound: none in 1,835 cases)."""
    backends = registry.select(["torch-cpu-math"], [PLANTED])
    sink = MemorySink()
    config = WorkerConfig(
        backends=backends, isolation="none", seed=8, max_cases=250, time_budget_s=None, replay_known=False,
        shrink_deadline_s=60, shrink_share=1.0,
    )
    stats = Worker(config, sink, reporter=_StopWhenFound("planted-long-row")).run()
    planted = [k for k in sink.buckets if k[0] == "planted-long-row"]
    assert planted, f"not found in {stats.cases} cases; buckets: {sorted(sink.buckets)}"
    bucket = sink.buckets[planted[0]]
    assert bucket.minimised_case is not None, bucket.note
    minimal = AttentionCase.from_json(bucket.minimised_case)
    # shrunk to the edge of the planted region (b1 sq1 sk1025 h1/1 d8 when written)
    assert is_planted_region(minimal) and minimal.seqlen_k < 2 * 1024, minimal.describe()
    assert (minimal.batch_size, minimal.num_heads) == (1, 1), minimal.describe()
    failing = [r for r in sink.results.values() if r.backend == "planted-long-row" and r.status == "fail"]
    for result in failing:
        case = AttentionCase.from_json(sink.cases[result.case_id]["config"])
        assert is_planted_region(case), case.describe()  # wrong only where it was planted
    passing = [r for r in sink.results.values() if r.backend == "planted-long-row" and r.status == "pass"]
    assert passing  # and right elsewhere
    # every draw had a target: the cases run and the draws answered from an earlier run of the same case
    assert stats.runnable["planted-long-row"] >= 1 and sum(stats.targeted.values()) == stats.cases + stats.repeated


def test_targeted_draws_run_a_narrow_backend_far_more_often_than_union_draws():
    backends = registry.select(["torch-cpu-math"], [NARROW])
    runs = {}
    for draw in ("targeted", "union"):
        config = WorkerConfig(
            backends=backends, isolation="none", seed=3, max_cases=24, time_budget_s=None, shrink=False,
            replay_known=False, draw=draw, max_seqlen=128, chunk_size=12,
        )
        runs[draw] = Worker(config, MemorySink()).run()
    targeted, union = runs["targeted"], runs["union"]
    assert union.cases == targeted.cases == 24
    assert not union.targeted  # union draws have no target
    assert set(targeted.targeted) == {"torch-cpu-math", "standin-ok"}
    # the narrow stand-in runs float32, head_dim <= 64, seqlen <= 64 only: most union draws miss it
    assert targeted.runnable["standin-ok"] >= 2 * max(1, union.runnable["standin-ok"])
    assert targeted.runnable["standin-ok"] >= targeted.targeted["standin-ok"] // 2
    reasons = dict(top_reasons(union.unsupported, "standin-ok", 5))
    assert any(r.startswith("dtype") or r.startswith("head_dim N >") for r in reasons), reasons


# ------------------------------------------------------------------------ coverage bookkeeping
def test_reasons_are_split_and_a_fields_own_value_is_not_a_new_reason():
    assert reason_keys("head_dim 191 not a multiple of 8; softcap") == ["head_dim N not a multiple of 8", "softcap"]
    assert reason_keys("head_dim_v 275 > 256") == ["head_dim_v N > 256"]
    assert reason_keys("") == ["(no reason given)"]
    runnable, reasons = Counter(), Counter()
    results = [
        CaseResult("c1", "a", "v1", "unsupported", detail="dtype float32 not in ('bfloat16',)"),
        CaseResult("c1", "a", "v2", "pass"),
        CaseResult("c1", "b", "v1", "unsupported", detail="head_dim 191 not a multiple of 8; softcap"),
        CaseResult("c1", "b", "v2", "unsupported", detail="head_dim 191 not a multiple of 8"),
    ]
    count_case(results, runnable, reasons)
    assert runnable == {"a": 1}
    assert top_reasons(reasons, "b") == [("head_dim N not a multiple of 8", 2), ("softcap", 1)]


def test_report_shows_cases_run_and_top_unsupported_reasons_per_backend(tmp_path):
    from typer.testing import CliRunner

    from service.db import migrations
    from service.cli.main import app
    from service.db.engine import make_engine
    from service.db.store import SqlStore

    url = f"sqlite:///{tmp_path / 'coverage.db'}"
    migrations.upgrade(url)
    engine = make_engine(url)
    store = SqlStore(engine)
    build = store.register_build(BuildFingerprint(torch="2.13.0"))
    for n in (1, 2, 3):
        case = AttentionCase(seqlen_q=n, seqlen_k=n, num_heads=1, head_dim=8 * n + 1, dtype="float32")
        store.record_case(case.to_json(), "fuzz")
        store.record_result(CaseResult(case.case_id, "wide", "native", "pass"), build, None)
        detail = f"dtype float32 not in ('bfloat16',); head_dim {case.head_dim} not a multiple of 8"
        store.record_result(CaseResult(case.case_id, "narrow", "native", "unsupported", detail=detail), build, None)
        if n == 3:
            store.record_result(CaseResult(case.case_id, "narrow", "other", "pass"), build, None)
    engine.dispose()
    result = CliRunner().invoke(app, ["report", "--json", "--db", url], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    coverage = {c["backend"]: c for c in json.loads(result.output)["coverage"]}
    assert coverage["wide"] == {"backend": "wide", "cases": 3, "cases_run": 3, "top_unsupported": []}
    assert coverage["narrow"]["cases"] == 3 and coverage["narrow"]["cases_run"] == 1
    assert coverage["narrow"]["top_unsupported"] == [
        {"reason": "dtype float32 not in ('bfloat16',)", "results": 3},
        {"reason": "head_dim N not a multiple of 8", "results": 3},
    ]
    table = CliRunner().invoke(app, ["report", "--db", url], env={"COLUMNS": "250"})
    assert table.exit_code == 0 and "coverage per backend" in table.output
    assert "head_dim N not a multiple of 8 (3)" in table.output


def test_the_live_display_and_summary_show_runnable_cases_and_reasons():
    from rich.console import Console

    from service.cli.fuzz_display import RichReporter, _coverage_data

    backends = registry.select(["torch-cpu-math"], [NARROW])
    config = WorkerConfig(backends=backends, isolation="none", seed=5, max_cases=6, time_budget_s=None,
                          shrink=False, replay_known=False, max_seqlen=64)
    stats = Worker(config, MemorySink()).run()
    data = _coverage_data(stats)
    assert set(data) == {"torch-cpu-math", "standin-ok"}
    assert data["torch-cpu-math"]["cases_run"] == stats.runnable["torch-cpu-math"] >= 1
    assert sum(row["drawn_for"] for row in data.values()) == stats.cases == 6
    console = Console(width=250, record=True)
    console.print(RichReporter(None, 6)._render(stats))
    text = console.export_text()
    assert "cases run" in text and "top unsupported reasons" in text
    # the narrow stand-in refuses the draws for torch-cpu-math (bf16/fp16, larger head dims);
    # torch-cpu-math's own variant reasons are no results any more (Backend.applicable_variants)
    top = top_reasons(stats.unsupported, "standin-ok", 1) or top_reasons(stats.unsupported, "torch-cpu-math", 1)
    assert top and top[0][0][:30] in text
    assert dataclasses.is_dataclass(stats)


def test_no_drawn_case_is_refused_by_the_oracle_memory_bound(monkeypatch):
    """``max_elements`` is cut to what the oracle's bound allows: with a 16 MiB bound, large
    batches, many heads and the GPU defaults, every draw still constructs (AttentionCase
    refuses a case over the bound) and fits."""
    monkeypatch.setenv("ATTNFUZZ_MAX_ORACLE_BYTES", str(2**24))
    caps = Capabilities(dtypes=("bfloat16",), qkv_formats=("bshd", "thd"), max_head_dim=512, head_dim_v_differs=True)
    strategy = attention_cases(capabilities=caps, max_batch_size=8, max_heads_kv=16, max_seqlen=GPU_BOUNDS.max_seqlen,
                               max_work=GPU_BOUNDS.max_work, max_elements=GPU_BOUNDS.max_elements)

    @settings(max_examples=150, derandomize=True, database=None, deadline=None)
    @given(strategy)
    def check(case):
        assert case.oracle_working_set_bytes <= 2**24

    check()


class _FinickyBackend(Backend):
    """A stand-in with a rule its Capabilities do not declare: it refuses head_dim < 32 (as
    cuDNN SDPA refuses head_dim < 16), and it has a second variant that encodes causal cases
    only (like FA4's ``causal_as_window``)."""

    name = "standin-finicky"
    device = "cpu"
    variants = ("native", "causal_only")
    capabilities = Capabilities(dtypes=("float32",), max_head_dim=64, max_seqlen=32, backward=False)

    def unsupported_reasons(self, case, variant):
        reasons = super().unsupported_reasons(case, variant)
        if case.head_dim < 32:
            reasons.append(f"head_dim {case.head_dim} < 32")
        return reasons + self.inapplicable_reasons(case, variant)

    def inapplicable_reasons(self, case, variant):
        return ["causal_only: the case is not causal"] if variant == "causal_only" and not case.causal else []

    def run(self, case, inputs, variant):  # correct: the oracle's own formula
        from oracle.reference import reference

        ref = reference(case, inputs, backward=False)
        from fuzzer.backends.base import BackendOutput

        return BackendOutput(out=ref.out.to(inputs.q.dtype), lse=ref.lse.float())


def test_every_case_drawn_for_a_backend_runs_on_it_even_under_rules_its_capabilities_omit():
    """A draw for a target is filtered to cases the target runs (`fuzzer.loop.draws.target_runs`):
    with a head_dim rule outside its Capabilities, every case drawn for the stand-in runs on it
    (without the filter about half of the head dims up to 64 are below 32)."""
    backend = _FinickyBackend()
    config = WorkerConfig(backends=[(backend, "tests.fuzzer.test_draws:_FinickyBackend")], isolation="none", seed=3,
                          max_cases=25, time_budget_s=None, shrink=False, replay_known=False)
    stats = Worker(config, MemorySink()).run()
    assert stats.cases == 25 and stats.targeted["standin-finicky"] == 25 + stats.repeated  # a repeat is drawn, not run again
    assert stats.runnable["standin-finicky"] == 25, dict(stats.unsupported)


def test_a_variant_with_no_distinct_call_leaves_no_result_unless_no_variant_applies():
    """`Backend.applicable_variants`: a non-causal case gets no ``causal_only`` result (counted
    as not applicable); if every variant were inapplicable, each would still be answered."""
    from fuzzer.evaluate import Evaluator

    backend = _FinickyBackend()
    plain = AttentionCase(seqlen_q=4, seqlen_k=4, head_dim=32, dtype="float32", backward=False)
    causal = dataclasses.replace(plain, causal=True)
    assert backend.applicable_variants(plain) == ("native",)
    assert backend.applicable_variants(causal) == ("native", "causal_only")
    evaluator = Evaluator([(backend, "tests.fuzzer.test_draws:_FinickyBackend")], isolation="none")
    runnable, unsupported, left_out = evaluator.split_applicable(plain)
    assert runnable == [("standin-finicky", "native")] and not unsupported and left_out == {"standin-finicky": 1}
    runnable, unsupported, left_out = evaluator.split_applicable(causal)
    assert len(runnable) == 2 and not left_out
    # asked for by name, the inapplicable variant is answered: unsupported, with its reason
    runnable, unsupported, _ = evaluator.split_applicable(plain, [("standin-finicky", "causal_only")])
    assert not runnable and "not causal" in unsupported[0].detail

    class NothingApplies(_FinickyBackend):
        def inapplicable_reasons(self, case, variant):
            return ["never"]

    assert NothingApplies().applicable_variants(plain) == ("native", "causal_only")
