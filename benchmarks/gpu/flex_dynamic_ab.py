"""torch-flex's compilation with automatic dynamic shapes against ``dynamic=True``, on one GPU.

The adapter (`fuzzer.backends.sdpa.FlexBackend`) compiles ``flex_attention`` with
``torch.compile`` and automatic dynamic shapes: the first call of a kernel key compiles for its
exact sizes, a call with other sizes compiles again with those sizes symbolic. In the fifteenth
session's H200 campaigns its compiles took 265 s (8 kernel keys) and 322 s (5 keys) of a
480-600 s lane. This script runs one mode per process (fresh dynamo state and an empty inductor
cache of its own) on the same sequence of shapes, forward and backward, with a causal mask
captured as 0-dim tensors as the adapter does, and prints per call its seconds and the dynamo
graph count, and the largest error of ``out`` and ``dq`` against SDPA's math backend in float32.

    python3 benchmarks/gpu/flex_dynamic_ab.py            # both modes, one after the other
    python3 benchmarks/gpu/flex_dynamic_ab.py --mode auto|dynamic   # one mode (what the driver runs)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SHAPES = [  # (batch, seqlen_q, seqlen_k, heads): lengths and batch change as in a campaign
    (1, 128, 128, 4), (1, 200, 300, 4), (2, 64, 513, 4), (1, 1, 1000, 4), (3, 77, 77, 2), (1, 1024, 2048, 8),
]


def one_mode(mode: str, dtype_name: str, head_dim: int, stable: bool = False) -> list[dict]:
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    for limit in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 1024))
    compiled = torch.compile(flex_attention, dynamic=True if mode == "dynamic" else None)
    dtype = getattr(torch, dtype_name)
    rows = []
    # stable: one mask function for every call, its offset a 0-dim tensor filled in place (the
    # function object, and what it captures, stay the same); else a new closure per call
    stable_off = torch.zeros((), dtype=torch.int32, device="cuda")

    def stable_mask(bb, hh, q_idx, kv_idx):
        return kv_idx <= q_idx + stable_off
    for b, sq, sk, h in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, n, head_dim, device="cuda", dtype=dtype, generator=gen) for n in (sq, sk, sk))
        for t in (q, k, v):
            t.requires_grad_(True)
        off_t = torch.tensor(sk - sq, dtype=torch.int32, device="cuda")

        def mask_mod(bb, hh, q_idx, kv_idx):
            return kv_idx <= q_idx + off_t

        if stable:
            stable_off.fill_(sk - sq)
            mask_mod = stable_mask

        block_mask = create_block_mask(mask_mod, None, None, sq, sk, device="cuda")
        before = counters["stats"]["unique_graphs"]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        row = {"shape": [b, sq, sk, h]}
        try:
            out, lse = compiled(q, k, v, block_mask=block_mask, return_lse=True)
            dout = torch.ones_like(out)
            (dq,) = torch.autograd.grad(out, q, dout)
            torch.cuda.synchronize()
            row["seconds"] = round(time.perf_counter() - t0, 2)
            mask = torch.arange(sk, device="cuda")[None, :] <= torch.arange(sq, device="cuda")[:, None] + (sk - sq)
            qf, kf, vf = (t.detach().float().requires_grad_(True) for t in (q, k, v))
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.MATH):
                ref = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask)
            (dq_ref,) = torch.autograd.grad(ref, qf, dout.float())
            row["out_err"] = float((out.float() - ref).abs().max())
            row["dq_err"] = float((dq.float() - dq_ref).abs().max())
        except Exception as exc:  # a failed build is a finding of this A/B, not a crash of it
            row["seconds"] = round(time.perf_counter() - t0, 2)
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        row["graphs"] = counters["stats"]["unique_graphs"] - before
        rows.append(row)
        print(json.dumps({"mode": mode + ("+stable" if stable else ""), **row}), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("auto", "dynamic"))
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--stable", action="store_true", help="one mask function for every call (see one_mode)")
    args = parser.parse_args()
    if args.mode:
        one_mode(args.mode, args.dtype, args.head_dim, args.stable)
        return
    for mode in ("auto", "dynamic"):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            t0 = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, __file__, "--mode", mode, "--dtype", args.dtype, "--head-dim", str(args.head_dim)]
                + (["--stable"] if args.stable else []),
                env=env, capture_output=True, text=True,
            )
            print(proc.stdout, end="")
            if proc.returncode:
                print(proc.stderr[-2000:])
            print(f"== {mode}: {time.perf_counter() - t0:.1f} s in all (process start and imports included), rc {proc.returncode}", flush=True)


if __name__ == "__main__":
    main()
