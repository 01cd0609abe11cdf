"""Run `oracle.reference.reference(engine="cuda")` once at one size (after a warm-up call), for an
outside profiler (``ncu --kernel-name attn_fwd_f64 --launch-skip 1 --launch-count 1``) or a quick
timing of the k/v conversion and the attention kernel with CUDA events.

Usage: ``python benchmarks/gpu/oracle_once.py [--size b4,s4096,h16,d128,causal] [--time]``
(the tile config comes from ``ATTNFUZZ_CUDA_CONFIG`` as in `oracle._cuda_fwd`).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main() -> None:
    from benchmarks.gpu.dmma_probe import time_ms
    from benchmarks.oracle_bench import make_random_inputs, parse_size
    from oracle import _cuda_fwd
    from oracle.reference import reference

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="b4,s4096,h16,d128,causal")
    parser.add_argument("--time", action="store_true", help="median CUDA-event times of the pieces, ms")
    args = parser.parse_args()
    case = parse_size(args.size)
    inputs = make_random_inputs(case, "cuda")
    reference(case, inputs, engine="cuda", backward=False)  # compile, warm the allocator
    torch.cuda.synchronize()
    if not args.time:
        reference(case, inputs, engine="cuda", backward=False)
        torch.cuda.synchronize()
        return

    print("config", _cuda_fwd._config())
    pad = _cuda_fwd._pad(case.head_dim, 16)
    print("kv_float64(k) ms", round(time_ms(lambda: _cuda_fwd._kv_float64(inputs.k, pad), repeats=7), 4))
    print("k.to(float64) ms", round(time_ms(lambda: inputs.k.to(torch.float64), repeats=7), 4))
    print("reference ms", round(time_ms(lambda: reference(case, inputs, engine="cuda", backward=False), repeats=7), 4))


if __name__ == "__main__":
    main()
