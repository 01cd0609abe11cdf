"""A default CPU campaign finds a kernel that is wrong only under one input family, for each
family (issue 14, acceptance 3).

One worker fuzzes the nine planted backends of `tests.fuzzer.planted_inputs` together (default
draws, 100 cases, seed 2, in-process, no shrinking): every case runs on all nine, so one oracle
computation serves them all. Each backend recognises its family from the tensors only, so the test
shows both that the draw reaches the family and that the family's values reach the kernel; and it
checks the converse: every failure of a backend is on a case of its family.
"""

from __future__ import annotations

import pytest

from fuzzer import registry
from fuzzer.sinks import MemorySink
from fuzzer.worker import Worker, WorkerConfig
from oracle.config import AttentionCase

# backend class -> (backend name, does the case carry the family the backend is wrong under)
PLANTED = {
    "PlantedSplitExpBackend": ("planted-split-exp", lambda c: c.score_offset != 0),
    "PlantedSinkBackend": ("planted-sink", lambda c: c.attention_sink),
    "PlantedPeakedBackend": ("planted-peaked", lambda c: c.peaked_rows > 0),
    "PlantedLowRankBackend": ("planted-lowrank", lambda c: c.qk_rank > 0),
    "PlantedMassiveBackend": ("planted-massive", lambda c: c.massive_channels > 0),
    "PlantedSeqScaleBackend": ("planted-seqscale", lambda c: c.seq_scale_log2 > 0),
    "PlantedDoutFlushBackend": ("planted-dout-ftz", lambda c: c.dout_distribution == "tiny"),
    "PlantedDoutSaturateBackend": ("planted-dout-saturate", lambda c: c.dout_distribution == "large"),
    "PlantedDoutRowScaleBackend": ("planted-dout-rowscale", lambda c: c.dout_distribution == "sparse"),
}
# a tiny dout rounds to whole zero rows in float16 (2**-27 is below its subnormals): a sparse dout too
ALSO_WRONG_UNDER = {"planted-dout-rowscale": lambda c: c.dout_distribution == "tiny" and c.dtype == "float16"}


@pytest.fixture(scope="module")
def campaign():
    sink = MemorySink()
    specs = [f"tests.fuzzer.planted_inputs:{cls}" for cls in PLANTED]
    config = WorkerConfig(
        backends=registry.select([], specs), max_cases=100, time_budget_s=None, seed=2, shrink=False,
        isolation="none", replay_known=False,
    )
    stats = Worker(config, sink).run()
    return sink, stats


@pytest.mark.parametrize("cls", list(PLANTED))
def test_a_kernel_wrong_only_under_one_input_family_is_found_by_a_default_campaign(campaign, cls):
    sink, stats = campaign
    name, has_family = PLANTED[cls]
    assert stats.cases == 100
    failing = {r.case_id for r in sink.results.values() if r.backend == name and r.status == "fail"}
    cases = {case_id: AttentionCase.from_json(sink.cases[case_id]["config"]) for case_id in failing}
    found = [c for c in cases.values() if has_family(c)]
    assert found, f"{name}: no failure on a case of its family in {stats.cases} cases"
    assert any(key[0] == name for key in sink.buckets), sorted(sink.buckets)
    also = ALSO_WRONG_UNDER.get(name, lambda c: False)
    elsewhere = [c.describe() for c in cases.values() if not has_family(c) and not also(c)]
    assert not elsewhere, f"{name} failed outside its family: {elsewhere[:3]}"
    ran = sum(1 for r in sink.results.values() if r.backend == name and r.status in ("pass", "fail"))
    assert ran >= 50  # the family is found among many cases the backend ran, not by running few


def test_minimisation_keeps_the_family_a_failure_needs_and_drops_the_others():
    from fuzzer.minimise import minimise

    case = AttentionCase(
        batch_size=2, seqlen_q=20, seqlen_k=24, num_heads=2, head_dim=32, seed=11, qk_rank=4, massive_channels=2,
        attention_sink=True, seq_scale_log2=2, peaked_rows=0.5, dout_distribution="sparse",
    )
    outcome = minimise(case, lambda c: c.attention_sink and c.seqlen_k >= 2, deadline_s=60)
    assert outcome.status == "minimised", outcome
    assert outcome.case.input_families == {"attention_sink": True}
    assert (outcome.case.seqlen_k, outcome.case.seed) == (2, 0)
