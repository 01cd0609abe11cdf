"""`fuzzer.loop.compile_budget`: the compile gate, the kernel templates and the crash quarantine,
without a worker (the budget is handed its backends, figures and clocks)."""

from __future__ import annotations

import dataclasses

from fuzzer.loop import compile_budget
from fuzzer.loop.compile_budget import CompileBudget, is_compile_failure, kernel_class
from fuzzer.loop.stats import WorkerStats
from fuzzer.results import CaseResult
from fuzzer.strategies import KernelTemplate
from oracle.config import AttentionCase
from tests.fuzzer.planted_jit import CheapJitBackend, PlantedJitBackend
from tests.fuzzer.standins import CorrectBackend


class SameLane(PlantedJitBackend):  # the environment of planted-jit: one child, one lane
    name = "planted-jit-same-lane"


class OwnLane(PlantedJitBackend):
    name = "planted-jit-own-lane"
    environment = "planted-jit-own-lane"


CASE = AttentionCase(seqlen_q=3, seqlen_k=4, head_dim=8, dtype="float32", backward=False)


def budget(backends, *, jit_share=0.2, lanes=False, elapsed_s=100.0, stats=None) -> CompileBudget:
    return CompileBudget(
        backends={b.name: b for b in backends}, usable=lambda: list(backends), stats=stats or WorkerStats(),
        jit_share=jit_share, lanes_on=lambda: lanes, fuzz_elapsed_s=lambda: elapsed_s,
    )


def test_the_allowance_is_the_share_of_the_fuzzing_seconds_and_none_without_a_budget():
    assert budget([PlantedJitBackend()], jit_share=0.2, elapsed_s=50.0).allowance_s() == 10.0
    assert budget([PlantedJitBackend()], jit_share=1.0).allowance_s() is None
    assert budget([PlantedJitBackend()], jit_share=None).allowance_s() is None


def test_without_lanes_the_jit_backends_count_together_and_each_past_its_fair_part_is_held():
    backends = [PlantedJitBackend(), SameLane(), OwnLane(), CheapJitBackend()]
    b = budget(backends)
    b.stats.compile_by_backend.update({"planted-jit": 6.0, "planted-jit-same-lane": 6.0, "planted-jit-own-lane": 9.0,
                                       "planted-jit-cheap": 0.5})
    assert b.over_budget(10.0) == {"planted-jit", "planted-jit-same-lane", "planted-jit-own-lane"}  # fair part 2.5
    assert b.over_budget(30.0) == set()
    assert b.over_budget(None) == set()


def test_with_lanes_each_lane_is_held_against_the_whole_allowance_and_binds_only_its_own_draws():
    backends = [PlantedJitBackend(), SameLane(), OwnLane(), CheapJitBackend()]
    b = budget(backends, lanes=True, jit_share=0.1, elapsed_s=100.0)  # allowance 10 s
    b.stats.compile_by_backend.update({"planted-jit": 6.0, "planted-jit-same-lane": 6.0, "planted-jit-own-lane": 9.0})
    assert b.over_budget(10.0) == {"planted-jit", "planted-jit-same-lane"}
    assert b.states() == {"planted-jit": "over", "planted-jit-same-lane": "over", "planted-jit-own-lane": "under",
                          "planted-jit-cheap": "under"}


def test_a_chunk_takes_the_templates_of_its_jit_targets_with_the_share_of_their_state():
    jit, plain = PlantedJitBackend(), CorrectBackend()
    b = budget([jit, plain], jit_share=0.1, elapsed_s=100.0)
    b.track_kernels(CASE, [CaseResult(CASE.case_id, jit.name, "native", "pass", compile_ms=500.0)])
    assert list(b.templates[jit.name]) == [KernelTemplate.of(CASE)]
    assert b.stats.compile_by_backend[jit.name] == 0.5 and len(b.stats.kernel_keys[jit.name]) == 1
    assert b.kernel_classes[jit.name] == {kernel_class(CASE)}
    commons = b.chunk_commons([jit.name, plain.name], {"max_seqlen": 8})
    assert commons[plain.name] == {"max_seqlen": 8}
    assert commons[jit.name]["template_share"] == compile_budget.TEMPLATE_SHARE_UNDER
    b.stats.compile_s = 11.0  # past the 10 s allowance: over
    assert b.chunk_commons([jit.name], {})[jit.name]["template_share"] == compile_budget.TEMPLATE_SHARE_OVER
    assert b.stats.template_chunks == {"under": 1, "over": 1}
    assert budget([jit], jit_share=None).chunk_commons([jit.name], {"x": 1}) == {jit.name: {"x": 1}}


def test_over_the_budget_a_new_kernel_of_a_class_already_run_is_gated_and_a_new_class_is_built():
    jit, plain = PlantedJitBackend(), CorrectBackend()
    b = budget([jit, plain], jit_share=0.1, elapsed_s=100.0)
    b.track_kernels(CASE, [CaseResult(CASE.case_id, jit.name, "native", "pass")])
    b.stats.compile_by_backend[jit.name] = 20.0
    assert b.gated_tasks(CASE) is None  # its kernel is built: nothing left out
    same_class = dataclasses.replace(CASE, head_dim=16, head_dim_v=16)
    tasks = b.gated_tasks(same_class)
    assert tasks is not None and all(name != jit.name for name, _ in tasks) and (plain.name, "native") in tasks
    assert b.stats.compile_gated[jit.name] >= 1
    new_class = dataclasses.replace(same_class, causal=True)
    assert b.gated_tasks(new_class) is None and b.stats.compile_novel[jit.name] >= 1


def test_a_crash_quarantines_every_variant_s_key_and_drops_the_case_s_template():
    jit = PlantedJitBackend()
    b = budget([jit], jit_share=None)
    b.track_kernels(CASE, [CaseResult(CASE.case_id, jit.name, "native", "pass")])
    crashed = CaseResult(CASE.case_id, jit.name, "native", "crash", signature="crash", signatures=("crash",))
    b.note_crashes(CASE, [crashed])
    assert b.is_crashed(jit, CASE, "native")
    assert KernelTemplate.of(CASE) not in b.templates[jit.name]
    assert not b.is_crashed(jit, dataclasses.replace(CASE, head_dim=16, head_dim_v=16), "native")
    tasks = b.gated_tasks(dataclasses.replace(CASE, seqlen_k=9))
    assert tasks == [] and b.stats.crash_quarantined[jit.name] >= 1


def test_a_jit_compile_failure_is_named_by_its_exception_type_and_only_for_jit_backends():
    assert is_compile_failure(PlantedJitBackend(), "error:MLIRError")
    assert not is_compile_failure(PlantedJitBackend(), "error:ValueError")
    assert not is_compile_failure(CorrectBackend(), "error:MLIRError")
    assert not is_compile_failure(None, "error:MLIRError")
