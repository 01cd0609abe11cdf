"""fuzzer/cp/campaign.py without processes: the matrix covers the seed's configuration under every
comm type and can be laid out; a run writes one judged JSON line per task with its non-CP twin."""

from __future__ import annotations

import io
import json

import pytest

from fuzzer.backends.cp_cpu import PlantedWindowCPUBackend, RingAttentionCPUBackend
from fuzzer.backends.cp_layout import cp_twin, cp_unsupported_reasons
from fuzzer.backends.te import TEFA4Backend
from fuzzer.cp.campaign import cp_matrix, run_campaign, summary
from fuzzer.cp.executor import CPTaskOutcome
from fuzzer.executor import TaskOutcome
from oracle.errors import CaseValidationError


@pytest.mark.parametrize("cp_size", [2, 4])
def test_the_matrix_holds_the_seed_configuration_for_every_comm_type_and_can_be_laid_out(cp_size):
    cases = list(cp_matrix(cp_size))
    seed_like = {c.cp_comm_type for c in cases if c.causal and c.qkv_format == "bshd" and c.head_dim == 128
                 and c.batch_size == 2 and c.seqlen_q == 1024 and c.window_size_left is None and c.head_dim_v == 128
                 and c.num_heads == c.num_heads_kv and c.dtype == "bfloat16"}
    assert seed_like == ({"p2p", "all_gather", "a2a"} | ({"a2a+p2p"} if cp_size >= 4 else set()))
    assert all(cp_unsupported_reasons(c) == [] for c in cases)
    assert all(c.backward and c.cp_size == cp_size for c in cases)
    assert {c.qkv_format for c in cases} == {"bshd", "sbhd", "thd"}


def test_te_fa4_is_asked_the_seed_configuration_under_cp():
    supported = [c for c in cp_matrix(2) if not TEFA4Backend().unsupported_reasons(c, "mask_type")]
    assert {c.cp_comm_type for c in supported if c.causal and c.qkv_format == "bshd"} == {"p2p", "all_gather", "a2a"}


def test_a_matrix_length_that_cannot_be_split_is_rejected():
    with pytest.raises(CaseValidationError):
        list(cp_matrix(2, seqlen=0))


class CannedExecutor:
    """Answers every task with the backend's own non-CP run as both the CP and the twin output."""

    def __init__(self, backends):
        self.backends = {b.name: b for b, _ in backends}
        self.calls = []

    def run(self, case, inputs, tasks, timeout_s):
        self.calls.append((case, tasks))
        outcomes = []
        for name, variant in tasks:
            output = self.backends[name].run(cp_twin(case), inputs, variant)
            twin = TaskOutcome(name, variant, "ok", output=output)
            outcomes.append(CPTaskOutcome(name, variant, "ok", output=output, non_cp=twin))
        return outcomes


def test_a_run_writes_one_judged_line_per_task_with_the_twin_and_flags_the_blind_spot():
    backends = [(RingAttentionCPUBackend(), "x:y"), (PlantedWindowCPUBackend(), "x:z")]
    case = next(c for c in cp_matrix(2, seqlen=16, head_dim=8, dtype="float32") if c.causal)
    out = io.StringIO()
    executor = CannedExecutor(backends)
    rows = run_campaign(backends, [case], device="cpu", timeout_s=10.0, out=out, executor=executor)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines == rows and len(rows) == 2 and executor.calls[0][1] == [("cp-cpu-ring", "default"), ("cp-cpu-planted-window", "default")]
    ring, planted = (r["result"] for r in rows)
    assert (ring["status"], planted["status"]) == ("pass", "fail")
    assert planted["metrics"]["cp"]["agree_but_both_wrong"] is True
    assert rows[1]["non_cp_result"]["case_id"] == cp_twin(case).case_id
    assert summary(rows).splitlines()[-1] == "2 tasks, 1 fail under CP, 1 agree with non-CP while both fail the oracle"
