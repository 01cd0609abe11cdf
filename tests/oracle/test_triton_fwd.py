"""Tests of `oracle._triton_fwd`, the optional fused float64 forward, against the torch path."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import oracle.reference
from oracle import _triton_fwd
from oracle.config import AttentionCase
from oracle.inputs import make_inputs
from oracle.reference import reference

FLOAT64_CLOSE = dict(rtol=1e-10, atol=1e-12)

CASES = [
    dict(causal=True, causal_alignment="bottom_right", seqlen_q=37, seqlen_k=20),
    dict(window_size_left=5, window_size_right=3, seqlen_q=50, seqlen_k=70, causal_alignment="bottom_right"),
    dict(num_heads=4, num_heads_kv=2, head_dim_v=24, softcap=2.7, causal=True, seqlen_q=70, seqlen_k=50),
    dict(num_heads=6, num_heads_kv=1, head_dim=20, seqlen_q=70, seqlen_k=30, window_size_left=3, window_size_right=0),
]

_SCRIPT = """
import json, os, sys, torch
from oracle.config import AttentionCase
from oracle.inputs import make_inputs
from oracle.reference import reference
report = []
for variant, fields in [(v, f) for v in ("hybrid", "fused") for f in json.loads(sys.argv[1])]:
    os.environ["ATTNFUZZ_TRITON_VARIANT"] = variant
    case = AttentionCase(**{"batch_size": 2, "num_heads": 2, "head_dim": 32, "backward": False, **fields})
    inputs = make_inputs(case)
    fused, plain = reference(case, inputs, engine="triton"), reference(case, inputs, engine="torch")
    finite = torch.isfinite(plain.lse)
    report.append({
        "engine": fused.engine,
        "out": float((fused.out - plain.out).abs().max()),
        "lse": float((fused.lse[finite] - plain.lse[finite]).abs().max()),
        "same_empty_rows": bool(torch.equal(torch.isinf(fused.lse), ~finite)),
        "scales": max(float((fused.error_scales[n] - plain.error_scales[n]).abs().max()) for n in ("out", "lse")),
    })
json.dump(report, sys.stdout)
"""


@pytest.mark.slow
def test_triton_forward_in_the_interpreter_matches_the_torch_path():
    triton = pytest.importorskip("triton")
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 9):
        pytest.skip("Triton < 3.9's interpreter passes scalar arguments as 1-d arrays, which `range` "
                    "rejects (TypeError seen with 3.6); the kernels are tested on CUDA instead")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    completed = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(CASES)], env=env, cwd=root, capture_output=True, text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    report = json.loads(completed.stdout)
    assert len(report) == 2 * len(CASES)
    for fields, row in zip(CASES + CASES, report):
        assert row["engine"] == "triton", fields
        assert row["same_empty_rows"], fields
        assert max(row["out"], row["lse"], row["scales"]) < 1e-12, (fields, row)


def test_engine_triton_refuses_what_it_cannot_run():
    pytest.importorskip("triton")
    case = AttentionCase(batch_size=2, seqlen_q=3, seqlen_k=3, qkv_format="thd", head_dim=8)
    with pytest.raises(oracle.reference.ReferenceInputError, match="thd"):
        reference(case, make_inputs(case), engine="triton")
    assert _triton_fwd.unsupported_reason(AttentionCase(head_dim=512), torch.zeros(1)) is not None


def test_a_failing_triton_forward_falls_back_to_torch_and_is_recorded(monkeypatch):
    def broken(dense, want_scales):
        raise RuntimeError("planted launch failure")

    monkeypatch.setattr(oracle.reference, "TRITON_AUTO_DEVICE_TYPES", ("cpu",))
    monkeypatch.setattr(oracle.reference, "triton_fallback_error", None)
    monkeypatch.setattr(_triton_fwd, "unsupported_reason", lambda case, q: None)
    monkeypatch.setattr(_triton_fwd, "dense_forward", broken)
    case = AttentionCase(seqlen_q=5, seqlen_k=5, head_dim=8, causal=True)
    inputs = make_inputs(case)
    result = reference(case, inputs)
    assert result.engine == "torch"
    assert "planted launch failure" in oracle.reference.triton_fallback_error
    torch.testing.assert_close(result.out, reference(case, inputs, engine="torch").out, **FLOAT64_CLOSE)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("variant", _triton_fwd.VARIANTS)
@pytest.mark.parametrize("fields", CASES + [dict(seqlen_q=1000, seqlen_k=1000, head_dim=128, causal=True),
                                            dict(seqlen_q=300, seqlen_k=900, head_dim=256, head_dim_v=64),
                                            dict(seqlen_q=200, seqlen_k=200, input_distribution="large_logits",
                                                 softcap=30.0)])
def test_triton_forward_on_cuda_matches_the_torch_path(fields, variant, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("ATTNFUZZ_TRITON_VARIANT", variant)
    case = AttentionCase(**{"batch_size": 2, "num_heads": 2, "head_dim": 32, "backward": True, **fields})
    inputs = make_inputs(case, "cuda")
    fused, plain = reference(case, inputs, engine="triton"), reference(case, inputs, engine="torch")
    assert fused.engine == "triton", oracle.reference.triton_fallback_error
    for name in ("out", "lse", "dq", "dk", "dv"):
        torch.testing.assert_close(getattr(fused, name), getattr(plain, name), **FLOAT64_CLOSE)
    for name, scale in plain.error_scales.items():
        torch.testing.assert_close(fused.error_scales[name], scale, **FLOAT64_CLOSE)
