"""Float64 tensor-core probe for the CUDA oracle engine (`oracle._cuda_fwd`), on one GPU.

Usage::

    python benchmarks/gpu/dmma_probe.py [--json OUT] [--configs 4,32,2 8,16,2 ...]

1. Throughput of each DMMA shape (``mma.sync`` m8n8k4, and the sm_90 m16n8k4 / m16n8k8 /
   m16n8k16), TFLOP/s: every warp runs 8 independent accumulator chains; the figure is
   ``2 * m * n * k * mmas / seconds`` over the whole GPU.
2. Fragment layout check of m16n8k16 float64: one warp multiplies random 16x16 and 16x8 float64
   matrices loaded with the layout `oracle._cuda_fwd` assumes; max |error| against torch.
3. Kernel-only time of the attention forward (``dense_forward`` on float64 copies, and
   ``direct_forward`` on the bf16 inputs; no error scales) at b4 s4096 h16 d128 causal for each
   tile config (`oracle._cuda_fwd.TileConfig` fields, comma-separated), with its float64 TFLOP/s
   (``4 * visible scores * head_dim``), and the largest relative difference from the torch path
   over a set of small cases (GQA, softcap, windows, unsafe shift, odd sizes; out, lse, error
   scales, both paths): a config is only worth timing if that stays at float64 rounding. A config
   written ``W,N,B:noexp`` is timed with the scores' ``exp`` replaced by a multiply (wrong results,
   no accuracy check): what the float64 exp costs.
4. With ``--profile``: the torch profiler's table of ``oracle.reference.reference(engine="cuda")``
   at the same size (what the time outside the kernel goes to).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

SHAPES = {  # name: (m, n, k, a regs, b regs, c regs)
    "m8n8k4": (8, 8, 4, 1, 1, 2),
    "m16n8k4": (16, 8, 4, 2, 1, 4),
    "m16n8k8": (16, 8, 8, 4, 2, 4),
    "m16n8k16": (16, 8, 16, 8, 4, 4),
}

_THROUGHPUT = r"""
extern "C" __global__ void dmma_loop(double* out, int iterations) {
    double acc[8][C];
    double a[A], b[B];
    for (int i = 0; i < A; ++i) a[i] = 1.0 + 1e-9 * (threadIdx.x + i);
    for (int i = 0; i < B; ++i) b[i] = 1.0 - 1e-9 * (threadIdx.x + i);
    for (int c = 0; c < 8; ++c) for (int i = 0; i < C; ++i) acc[c][i] = 0.0;
    for (int it = 0; it < iterations; ++it) {
        #pragma unroll
        for (int c = 0; c < 8; ++c) { MMA(acc[c], a, b); }
    }
    double s = 0.0;
    for (int c = 0; c < 8; ++c) for (int i = 0; i < C; ++i) s += acc[c][i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""

_MMA_MACROS = {
    "m8n8k4": 'asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};" '
              ': "+d"(d[0]), "+d"(d[1]) : "d"(a[0]), "d"(b[0]));',
    "m16n8k4": 'asm volatile("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5}, {%6}, '
               '{%0,%1,%2,%3};" : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3]) : "d"(a[0]), "d"(a[1]), '
               '"d"(b[0]));',
    "m16n8k8": 'asm volatile("mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5,%6,%7}, '
               '{%8,%9}, {%0,%1,%2,%3};" : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3]) : "d"(a[0]), '
               '"d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));',
    "m16n8k16": 'asm volatile("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, '
                '{%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, {%0,%1,%2,%3};" : "+d"(d[0]), "+d"(d[1]), '
                '"+d"(d[2]), "+d"(d[3]) : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), '
                '"d"(a[6]), "d"(a[7]), "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));',
}

_LAYOUT = r"""
// A [16][16] row-major, B [16][8] row-major (k, n), D [16][8]
extern "C" __global__ void layout_check(const double* A, const double* B, double* D) {
    int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    double a[8], b[4], d[4] = {0, 0, 0, 0};
    for (int i = 0; i < 8; ++i) a[i] = A[(g + 8 * (i & 1)) * 16 + t + 4 * (i >> 1)];
    for (int i = 0; i < 4; ++i) b[i] = B[(t + 4 * i) * 8 + g];
    dmma16816(d, a, b);
    for (int e = 0; e < 4; ++e) D[(g + 8 * (e >> 1)) * 8 + 2 * t + (e & 1)] = d[e];
}
"""


def throughput(shape: str) -> float:
    m, n, k, a, b, c = SHAPES[shape]
    source = (f"#define A {a}\n#define B {b}\n#define C {c}\n"
              f"#define MMA(d, a, b) do {{ {_MMA_MACROS[shape]} }} while (0)\n" + _THROUGHPUT)
    kernel = torch.cuda._compile_kernel(source, "dmma_loop")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks, threads, iterations = sms * 8, 128, 4096
    out = torch.empty(blocks * threads, dtype=torch.float64, device="cuda")
    kernel(grid=(blocks, 1, 1), block=(threads, 1, 1), args=[out, 16])
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    kernel(grid=(blocks, 1, 1), block=(threads, 1, 1), args=[out, iterations])
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3
    mmas = blocks * (threads // 32) * iterations * 8
    return 2 * m * n * k * mmas / seconds / 1e12


def layout_error() -> float:
    from oracle._cuda_fwd import _DMMA_SOURCE  # the kernel's own MMA helper

    kernel = torch.cuda._compile_kernel(_DMMA_SOURCE + _LAYOUT, "layout_check")
    a = torch.randn(16, 16, dtype=torch.float64, device="cuda")
    b = torch.randn(16, 8, dtype=torch.float64, device="cuda")
    d = torch.full((16, 8), float("nan"), dtype=torch.float64, device="cuda")
    kernel(grid=(1, 1, 1), block=(32, 1, 1), args=[a, b, d])
    torch.cuda.synchronize()
    return float((d - a @ b).abs().max())


def dense_for(size: str):
    from benchmarks.oracle_bench import make_random_inputs, parse_size
    from oracle import _dense
    from oracle import reference as R
    from oracle.masks import key_bounds

    case = parse_size(size)
    inputs = make_random_inputs(case, "cuda")
    lo, hi = key_bounds(case, case.seqlen_q, case.seqlen_k, torch.device("cuda"))
    rows = R.choose_block_q(case.batch_size, case.num_heads, case.seqlen_q, case.seqlen_k, 2,
                            R.DEFAULT_MEMORY_BUDGET_BYTES["cuda"])
    dense = _dense.Dense(
        q=_dense.grouped_rows(inputs.q, case.num_heads_kv).mul_(case.softmax_scale), k=_dense.kv_rows(inputs.k),
        v=_dense.kv_rows(inputs.v), lo=lo, hi=hi, blocks=_dense.schedule(lo, hi, rows), batch_size=case.batch_size,
        seqlen_q=case.seqlen_q, seqlen_k=case.seqlen_k, num_heads_kv=case.num_heads_kv, group=case.group_size,
        scale=case.softmax_scale, softcap=case.softcap, rho=1.0,
    )
    visible = float((hi - lo).clamp(min=0).sum()) * case.group_size * dense.q.shape[0]
    return case, dense, 4.0 * visible * case.head_dim / 1e12


SMALL_CASES = [
    dict(causal=True, causal_alignment="bottom_right", seqlen_q=37, seqlen_k=20),
    dict(window_size_left=5, window_size_right=3, seqlen_q=50, seqlen_k=70, causal_alignment="bottom_right"),
    dict(num_heads=4, num_heads_kv=2, head_dim_v=24, softcap=2.7, causal=True, seqlen_q=70, seqlen_k=50),
    dict(seqlen_q=1000, seqlen_k=1000, head_dim=128, causal=True),
    dict(seqlen_q=129, seqlen_k=257, head_dim=72, head_dim_v=128, num_heads=8, num_heads_kv=2),
    dict(seqlen_q=200, seqlen_k=200, input_distribution="large_logits"),
    dict(seqlen_q=64, seqlen_k=3, head_dim=64, causal=True),
]


def small_case_error() -> float:
    """Largest relative difference (to max |value|) of the CUDA engine from the torch path."""
    from oracle.config import AttentionCase
    from oracle.inputs import make_inputs
    from oracle.reference import reference

    worst = 0.0
    for fields in SMALL_CASES:
        for backward in (False, True):
            case = AttentionCase(**{"batch_size": 2, "num_heads": 2, "head_dim": 32, "backward": backward, **fields})
            inputs = make_inputs(case, "cuda")
            fast, plain = reference(case, inputs, engine="cuda"), reference(case, inputs, engine="torch")
            pairs = [(fast.out, plain.out), (fast.lse, plain.lse)]
            pairs += [(fast.error_scales[n], plain.error_scales[n]) for n in ("out", "lse")]
            for a, b in pairs:
                finite = torch.isfinite(b)
                if not torch.equal(finite, torch.isfinite(a)):
                    return float("inf")
                scale = float(b[finite].abs().max()) if bool(finite.any()) else 1.0
                worst = max(worst, float((a[finite] - b[finite]).abs().max()) / max(scale, 1e-300) if bool(finite.any()) else 0.0)
    return worst


def time_ms(fn, repeats: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--size", default="b4,s4096,h16,d128,causal")
    parser.add_argument("--configs", nargs="*", default=["8,32,1", "8,16,1"])
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--skip-dmma", action="store_true")
    args = parser.parse_args()
    report: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    report["dmma_tflops"] = {}
    for shape in ([] if args.skip_dmma else SHAPES):
        try:
            report["dmma_tflops"][shape] = round(throughput(shape), 2)
        except Exception as exc:  # noqa: BLE001 - a probe reports what failed
            report["dmma_tflops"][shape] = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(shape, report["dmma_tflops"][shape], flush=True)
    try:
        report["layout_max_abs_error_m16n8k16"] = layout_error()
    except Exception as exc:  # noqa: BLE001
        report["layout_max_abs_error_m16n8k16"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    print("layout", report["layout_max_abs_error_m16n8k16"], flush=True)

    from oracle import _cuda_fwd, _triton_fwd
    from oracle._dense import dense_forward as torch_dense_forward

    case, dense, tflop = dense_for(args.size)
    from benchmarks.oracle_bench import make_random_inputs

    inputs = make_random_inputs(case, "cuda")
    lo, hi = dense.lo, dense.hi
    plain = torch_dense_forward(dense, False)
    report["size"], report["tflop"] = args.size, tflop
    report["torch_path_ms"] = time_ms(lambda: torch_dense_forward(dense, False))
    try:
        report["triton_fused_ms"] = time_ms(lambda: _triton_fwd.dense_forward(dense, False, "fused"))
    except Exception as exc:  # noqa: BLE001
        report["triton_fused_ms"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    report["configs"] = {}
    source = _cuda_fwd._SOURCE
    for config in args.configs:
        # "W,N,B[,QK,PV]:noexp": timing only, exp() of the scores replaced by a scaling (wrong
        # results): how much of the kernel's time the float64 exp takes
        config, _, diag = config.partition(":")
        _cuda_fwd._SOURCE = source.replace("exp(s[j][e] - shift_use[h])", "(s[j][e] - shift_use[h]) * 1e-3") \
            if diag == "noexp" else source
        _cuda_fwd._kernel.cache_clear()
        os.environ["ATTNFUZZ_CUDA_CONFIG"] = config
        tile = _cuda_fwd._config()
        if _cuda_fwd.smem_bytes(case.head_dim, case.head_dim_v, tile) * tile.min_blocks > 228 * 1024:
            report["configs"][config] = "does not fit the shared memory of one SM"
            continue
        try:
            fast = _cuda_fwd.dense_forward(dense, False)
            diff = max(float((fast["out"] - plain["out"]).abs().max()),
                       float((fast["lse"] - plain["lse"]).abs().max()))
            ms = time_ms(lambda: _cuda_fwd.dense_forward(dense, False))
            direct = lambda: _cuda_fwd.direct_forward(case, inputs.q, inputs.k, inputs.v, lo, hi, 1.0, False)
            direct_ms = time_ms(direct)
            if diag:
                report["configs"][f"{config}:{diag}"] = {"dense_ms": ms, "direct_ms": direct_ms}
                print(config, diag, report["configs"][f"{config}:{diag}"], flush=True)
                continue
            report["configs"][config] = {"dense_ms": ms, "dense_tflops": tflop / (ms / 1e3), "max_abs_diff": diff,
                                         "direct_ms": direct_ms, "direct_tflops": tflop / (direct_ms / 1e3),
                                         "max_rel_diff_small_cases": small_case_error()}
        except Exception as exc:  # noqa: BLE001
            report["configs"][config] = f"{type(exc).__name__}: {str(exc)[:500]}"
        print(config, report["configs"][config], flush=True)
    os.environ.pop("ATTNFUZZ_CUDA_CONFIG", None)
    _cuda_fwd._SOURCE = source
    _cuda_fwd._kernel.cache_clear()
    if args.profile:
        from oracle.reference import reference

        for engine in ("cuda", "triton"):
            reference(case, inputs, engine=engine, backward=False)
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                reference(case, inputs, engine=engine, backward=False)
                torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=40)
            report[f"profile_{engine}"] = table
            print(table, flush=True)
    print(json.dumps(report, indent=2, default=str))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2, default=str)


if __name__ == "__main__":
    main()
