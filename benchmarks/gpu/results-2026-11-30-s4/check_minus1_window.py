"""CPU check of the new bucket `fa4 / minus1_unbounded / out:mismatch` of the fourth-session run
(2026-11-30, `campaign/`): what the seed's mechanism predicts for the minimised case, against the
float64 oracle.

Case (minimised, confirmed twice): b1 sq1 sk2 h1/1 d64 fp16 bshd, window (1, unbounded),
bottom-right, not causal, forward only, inputs `make_inputs` seed 0. The `minus1_unbounded`
variant passes the unbounded right side as `-1` (the FA2 / TE convention). flash-attention #2490
made FA4 treat `-1` as a real bound, so the kernel's mask is the keys j with
`i + sk - sq - 1 <= j <= i + sk - sq - 1`, here key 0 only, where the case sees keys 0 and 1.

The database of that run was not brought back (a scripting mistake ended the device call), so the
kernel's stored error metrics are not available here: this shows that the mechanism gives a
mismatch of this size and kind, not that it reproduces the kernel's numbers.

Run: PYTHONPATH=. python benchmarks/gpu/results-2026-11-30-s4/check_minus1_window.py
"""

import torch

from oracle.config import AttentionCase
from oracle.inputs import make_inputs
from oracle.reference import reference

case = AttentionCase(batch_size=1, seqlen_q=1, seqlen_k=2, num_heads=1, num_heads_kv=1, head_dim=64, head_dim_v=64,
                     dtype="float16", qkv_format="bshd", window_size_left=1, window_size_right=None, causal=False,
                     causal_alignment="bottom_right", backward=False, seed=0)
inputs = make_inputs(case)
ref = reference(case, inputs, engine="torch")
v = inputs.v.double()[0, :, 0]  # [Sk, D]
model = v[0].half().double()  # softmax over the single key 0: out = v[0] (rounded to fp16 by the kernel)
err = model - ref.out[0, 0, 0]
print(f"oracle sees keys 0..1; model (right bound -1) sees key 0 only")
print(f"rel_l2 = {float(err.norm() / ref.out.norm()):.6f}, max_abs = {float(err.abs().max()):.6f}")
print(f"oracle lse = {float(ref.lse[0, 0, 0]):.6f}, model lse = "
      f"{float(inputs.q.double()[0, 0, 0] @ inputs.k.double()[0, 0, 0] * case.softmax_scale):.6f}")
