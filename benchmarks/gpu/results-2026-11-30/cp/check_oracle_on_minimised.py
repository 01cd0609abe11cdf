"""Is the oracle right on the minimised cases of the 2026-11-30 CP campaign? (CPU only.)

For each minimised case (read out of that campaign's cp.db; CP cases are judged against the
oracle of the full sequence, so the check is the same with or without CP) this compares
`oracle.reference.reference` with the independent naive float64 implementation of
`benchmarks/gpu/results-2026-11-29/check_by_hand.py` (full score matrices, masks written from first
principles, gradients by autograd) on every tensor. A failure the campaign reported is the
kernel's only if the oracle agrees with the naive computation.

Run: PYTHONPATH=. python benchmarks/gpu/results-2026-11-30/cp/check_oracle_on_minimised.py
"""

import importlib.util
from pathlib import Path

from oracle.config import AttentionCase
from oracle.inputs import make_inputs
from oracle.reference import reference

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("check_by_hand", HERE.parents[1] / "results-2026-11-29" / "check_by_hand.py")
check_by_hand = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_by_hand)

COMMON = dict(batch_size=1, num_heads_kv=1, causal_alignment="top_left", input_distribution="normal", seed=0)
MINIMISED = {
    "te-fa4 p2p out:mismatch": dict(seqlen_q=4, seqlen_k=4, num_heads=1, head_dim=192, dtype="bfloat16", qkv_format="thd",
                                    seqlens_q=[4], seqlens_k=[4], causal=True, backward=False, cp_size=2, cp_comm_type="p2p"),
    "te-fa4 out:all_zero": dict(seqlen_q=1, seqlen_k=1, num_heads=1, head_dim=192, dtype="bfloat16", qkv_format="thd",
                                seqlens_q=[1], seqlens_k=[1], causal=True, backward=False),
    "te-fa4 a2a dq:mismatch": dict(seqlen_q=68, seqlen_k=4, num_heads=2, num_heads_kv=2, head_dim=80, dtype="float16",
                                   qkv_format="bshd", backward=True, cp_size=2, cp_comm_type="a2a"),
    "te-fa4 a2a dk:mismatch": dict(seqlen_q=68, seqlen_k=68, num_heads=4, num_heads_kv=2, head_dim=40, dtype="float16",
                                   qkv_format="bshd", window_size_left=0, window_size_right=1, backward=True,
                                   input_distribution="near_constant", cp_size=2, cp_comm_type="a2a"),
    "te-fused p2p dq:mismatch": dict(seqlen_q=2, seqlen_k=2, num_heads=1, head_dim=192, dtype="bfloat16", qkv_format="thd",
                                     seqlens_q=[2], seqlens_k=[2], causal=True, backward=True, cp_size=2, cp_comm_type="p2p"),
    "te-fused all_gather out:mismatch": dict(seqlen_q=8, seqlen_k=8, num_heads=1, head_dim=128, dtype="float16",
                                             qkv_format="sbhd", window_size_left=0, window_size_right=1, backward=False,
                                             cp_size=2, cp_comm_type="all_gather"),
    "te-fa4 error:CUDADialectError": dict(seqlen_q=1, seqlen_k=1, num_heads=1, head_dim=112, head_dim_v=224,
                                          dtype="float16", qkv_format="bshd", causal=True, backward=True),
}

for name, fields in MINIMISED.items():
    case = AttentionCase(**{**COMMON, **fields})
    inputs = make_inputs(case)
    ours = reference(case, inputs, engine="torch")
    theirs = check_by_hand.naive(case, inputs)
    worst = {}
    for tensor in ("out", "lse", "dq", "dk", "dv"):
        a, b = getattr(ours, tensor), theirs.get(tensor)
        if a is None or b is None:
            continue
        finite = b.isfinite()
        assert bool((a.isfinite() == finite).all()), (name, tensor, "different rows see no key")
        worst[tensor] = float((a[finite] - b[finite]).abs().max()) if bool(finite.any()) else 0.0
    print(f"{name:34} {case.case_id}  max |oracle - naive|: " + ", ".join(f"{t} {e:.1e}" for t, e in worst.items()))
