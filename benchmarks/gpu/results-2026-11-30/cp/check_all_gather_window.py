"""Hand check (CPU) of the te-fused all_gather bucket of 2026-11-30: a model of TE's KV all-gather
context parallelism for the minimised case, against what the campaign stored.

Case (minimised, stored twice as `out:mismatch`, non-CP twin passing): b1 sq8 sk8 h1/1 d128 fp16
sbhd, window (0, 1), not causal, cp_size 2, all_gather, forward only, inputs `make_inputs` seed 0.

Model of `AttnFuncWithCPAndKVAllGather` (TE's context_parallel.py): rank r holds chunks r and
2*cp-1-r of length 2 (dual chunk swap); for each local chunk `get_kv_seq_info_after_all_gather`
keeps the gathered keys [end - 2 - left, end + right) (clipped to the sequence) and rewrites the
window to (left + seq_end - end, end + right - seq_end); FusedAttention then runs on that slice
with attn_mask_type "no_mask" (TE appends "_bottom_right" only for causal masks). The window is
applied either top-left (query i of the chunk against key i of the slice) or bottom-right (query
i against key i + len(keys) - len(queries)). Every score in float64.

Run: PYTHONPATH=. python benchmarks/gpu/results-2026-11-30/cp/check_all_gather_window.py
"""

import math

import torch

from oracle.config import AttentionCase
from oracle.inputs import make_inputs
from oracle.reference import reference

STORED = {"rel_l2": 0.701367535211165, "max_abs": 2.6309205847836314, "worst_index": [0, 0, 0, 52]}

case = AttentionCase(batch_size=1, seqlen_q=8, seqlen_k=8, num_heads=1, num_heads_kv=1, head_dim=128, head_dim_v=128,
                     dtype="float16", qkv_format="sbhd", window_size_left=0, window_size_right=1, causal=False,
                     backward=False, seed=0, cp_size=2, cp_comm_type="all_gather")
inputs = make_inputs(case)
ref = reference(case, inputs, engine="torch").out  # [B, S, H, D] float64
q, k, v = (t.double()[0, :, 0] for t in (inputs.q, inputs.k, inputs.v))  # [S, D]
cp, chunk = 2, case.seqlen_q // 4
left, right = case.window_size_left, case.window_size_right


def model(alignment: str) -> torch.Tensor:
    out = torch.zeros_like(ref[0, :, 0])
    for chunk_id in range(2 * cp):
        end = (chunk_id + 1) * chunk
        seq_end = min(2 * cp * chunk, end + right)
        seq_start = max(0, end - chunk - left)
        w_left, w_right = left + seq_end - end, end + right - seq_end
        rows = range(end - chunk, end)
        keys = torch.arange(seq_start, seq_end)
        offset = len(keys) - chunk if alignment == "bottom_right" else 0
        for i, row in enumerate(rows):
            local = torch.arange(len(keys))
            visible = (local >= i + offset - w_left) & (local <= i + offset + w_right)
            s = (q[row] @ k[keys].T) * case.softmax_scale
            s = s.masked_fill(~visible, -math.inf)
            out[row] = torch.softmax(s, dim=-1) @ v[keys]
    return out


for alignment in ("top_left", "bottom_right"):
    out = model(alignment).half().double()  # the kernel returns fp16
    err = out - ref[0, :, 0]
    rel_l2 = float(err.norm() / ref.norm())
    flat = int(err.abs().argmax())
    print(f"{alignment:12} rel_l2 {rel_l2:.6f}  max_abs {float(err.abs().max()):.6f} at [0, {flat // 128}, 0, {flat % 128}]"
          f"  rows wrong: {[r for r in range(8) if float(err[r].abs().max()) > 1e-2]}")
print(f"stored       rel_l2 {STORED['rel_l2']:.6f}  max_abs {STORED['max_abs']:.6f} at {STORED['worst_index']}")
