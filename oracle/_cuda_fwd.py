"""Optional float64 attention forward on Hopper's float64 tensor cores: the ``engine="cuda"`` of
`oracle.reference` (its default on sm_90+). One idea over 600 lines: this one kernel, its CUDA source
and its launcher.

Why a hand-written kernel: Triton lowers a float64 ``tl.dot`` to the Ampere DMMA shape
``mma.sync.m8n8k4`` (LLVM's NVPTX backend has no intrinsic for the sm_90 shapes), which runs at
half the H200's float64 tensor rate; sm_90 adds ``mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64``
(PTX ISA 7.8, "Matrix shape" table of ``mma``). Measured on an H200 with
`benchmarks/gpu/dmma_probe.py` (2026-11-30, TFLOP/s over the GPU): m8n8k4 31.9, m16n8k4 63.9,
m16n8k8 65.2, m16n8k16 66.1. This module is a FlashAttention-2-style forward (Dao,
arXiv:2307.08691, Algorithm 1) written in CUDA C++ around m16n8k16, compiled at first use with
NVRTC through ``torch.cuda._compile_kernel`` (no nvcc, no build step; one compile per
``(head_dim, head_dim_v, tile config, dtypes)`` key, cached for the process).

Two entry points, one kernel (strided: it reads any layout with a contiguous last dimension):

* `dense_forward`: `oracle._triton_fwd.dense_forward`'s contract — the grouped float64 layout of
  `oracle._dense.Dense` (``q [B*Hkv, Sq*G, D]`` pre-multiplied by softmax_scale, ``k [B*Hkv,
  Sk, D]``, ``v [B*Hkv, Sk, Dv]``, per-token key bounds ``lo``/``hi [Sq] int64``); used when the
  backward follows (it needs the grouped copies anyway).
* `direct_forward`: forward only, straight on the canonical ``[B, S, H, D]`` inputs in their own
  dtype (q is converted and scaled in float64 as the kernel stages it), writing ``out [B, Sq, H,
  Dv]`` and ``lse [B, H, Sq]`` in place; k and v become contiguous float64 copies with rows
  zero-padded to ``D_PAD``/``DV_PAD``, made together with ``max_j ||k_j||`` and ``max_j ||v_j||`` by
  one small kernel (`_kv_float64`).

Arithmetic: float64 throughout (products and sums in the DMMA unit are IEEE float64 fused
multiply-adds; ``exp``/``log``/``tanh``/``sqrt`` are CUDA's float64 functions); every bf16, fp16
and fp32 input converts to float64 exactly. Outputs: ``out``, natural-log ``lse`` (``-inf`` on rows
that see no key, whose ``out`` is 0), and per row ``||P_i||``, ``||out_i||`` and the score bound
for the error scales. Softmax shift, chosen per warp: the Cauchy-Schwarz bound ``||q_i|| *
softmax_scale * max_j ||k_j||`` (capped by softcap; `oracle._dense.shift_bound`) when no row of
the warp exceeds `oracle._dense.SAFE_SHIFT_BOUND`, else the online maximum with rescaling (FA2
Algorithm 1 lines 9-10). Both give the softmax to float64 rounding.

Kernel layout: one CTA of ``NWARPS`` warps takes ``16 * NWARPS`` grouped rows of one (batch, kv
head); Q stays in shared memory (each row's offset in Q computed once), K and V tiles of
``BLOCK_N`` keys stream through 16-byte cp.async chunks of zero-padded rows (only the key is
bounds-checked), K(n+1) fetched during P V(n) and V(n+1) during Q K(n+1)^T, the first tiles while Q
is staged; each warp owns 16 rows, keeps its output accumulator (``16 x head_dim_v``) and score
tile (``16 x BLOCK_N``) in registers, and feeds the score accumulator straight back as the A
operand of ``P @ V`` by ordering keys inside each 8-key chunk as ``(2t, 2t + 1) -> (t, t + 4)`` (no
shuffles; the order of a sum's terms is all that changes). Only key tiles inside ``[min lo, max
hi)`` of the CTA's rows are visited; CTAs run heaviest first. Shared-memory rows are padded so that
fragment loads are free of bank conflicts.

Measured on an H200 (b4 s4096 h16 d128 causal bf16, 2026-11-30, 6a49b49;
`benchmarks/gpu/results/2026-11-30-6a49b49-oracle/manifest.json`): the default tile
``TileConfig(8, 32, 1)`` runs `dense_forward` in 8.5-8.6 ms and `direct_forward` (its k/v copies
included) in 8.6-9.0 ms, about 32 TFLOP/s of float64 (48% of the m16n8k16 rate; Nsight Compute: 2
warps per scheduler, the float64 tensor pipe active 51% of cycles before the last changes);
`oracle.reference.reference(engine="cuda")` takes 8.7-9.0 ms in all (error scales included),
5.3-5.5x faster than the naive float64 reference (47.8-48.0 ms) and 1.5x faster than the Triton
engine. Variants measured and removed: 4-warp CTAs two per SM with one K/V buffer 11.2 ms, two
accumulator chains per score tile 9.8 ms, a transposed V tile with 16-byte loads 11.5-12.0 ms, bf16
K/V converted in the kernel 9.9-11.6 ms, 16-byte Q/K/V fragment loads through permuted indices
(register spills, +5-13%), a table-driven exp (Tang 1989) and exp interleaved with P V by 16-key
chunk (no gain).

Limits: compute capability 9.0 or newer (sm_90 DMMA shapes), ``head_dim``/``head_dim_v`` <= 128
(register budget), bshd/sbhd, a torch with ``torch.cuda._compile_kernel``. `unsupported_reason`
says which one fails; `oracle.reference` then falls back to Triton, then to the torch path.
"""

from __future__ import annotations

import functools
import math
import os
from typing import NamedTuple

import torch

from oracle._dense import SAFE_SHIFT_BOUND, forward_scale_formulas, forward_scales

MAX_HEAD_DIM = 128


def _compiler():
    return getattr(torch.cuda, "_compile_kernel", None)


def unsupported_reason(case, q: torch.Tensor) -> str | None:
    """None when the kernel can run ``case`` on ``q``'s device, else why not (one line)."""
    if case.is_varlen:
        return "qkv_format thd is not supported by the CUDA forward"
    if max(case.head_dim, case.head_dim_v) > MAX_HEAD_DIM:
        return f"head_dim {max(case.head_dim, case.head_dim_v)} > {MAX_HEAD_DIM}"
    if q.device.type != "cuda":
        return f"tensors are on {q.device.type}, not CUDA"
    if getattr(torch.version, "hip", None):
        return "ROCm build of torch (the kernel uses NVIDIA PTX)"
    if _compiler() is None:
        return f"torch {torch.__version__} has no torch.cuda._compile_kernel (NVRTC)"
    major, _ = torch.cuda.get_device_capability(q.device)
    if major < 9:
        return f"compute capability {major}.x < 9.0 (mma.sync m16n8k16 float64 needs sm_90)"
    return None


# How an input element becomes a float64, exactly (both kernels): ELEM_KIND 0 float64, 1 float32,
# 2 bfloat16 bits (the top half of a float32), 3 float16 bits (`_KIND`).
_ELEMENT_SOURCE = r"""
#if ELEM_KIND == 0
typedef double elem_t;
#define ELEM_F64(x) ((double)(x))
#elif ELEM_KIND == 1
typedef float elem_t;
#define ELEM_F64(x) ((double)(x))
#else
typedef unsigned short elem_t;
__device__ __forceinline__ double elem_to_f64(unsigned short x) {
    float f;
#if ELEM_KIND == 2
    f = __uint_as_float(((unsigned int)x) << 16);
#else
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
#endif
    return (double)f;
}
#define ELEM_F64(x) elem_to_f64(x)
#endif
"""

# The sm_90 float64 MMA (PTX ISA "Matrix shape" m16n8k16 .f64): D += A B, A 16x16 row-major in
# a[0..7], B 16x8 column-major in b[0..3], D 16x8 in d[0..3] (fragment layouts: PTX ISA, "Matrix
# Fragments for mma.m16n8k16 with floating point type"); also used by benchmarks/gpu/dmma_probe.py.
_DMMA_SOURCE = r"""
__device__ __forceinline__ void dmma16816(double (&d)[4], const double (&a)[8], const double (&b)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5,%6,%7,%8,%9,%10,%11}, "
        "{%12,%13,%14,%15}, {%0,%1,%2,%3};\n"
        : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
        : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]), "d"(a[7]),
          "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
}
"""

_SOURCE = _ELEMENT_SOURCE + _DMMA_SOURCE + r"""
#define NTHREADS (NWARPS * 32)
#define BLOCK_M (NWARPS * 16)
#define NT (BLOCK_N / 8)
#define NTV (DV_PAD / 8)
#define QS (D_PAD + 4)
#define VS (DV_PAD + 2)

__device__ __forceinline__ void cp_async16(double* dst, const double* src, bool ok) {
    unsigned int saddr = (unsigned int)__cvta_generic_to_shared(dst);
    int size = ok ? 16 : 0;  // src-size 0: the 16 bytes are zero-filled
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(saddr), "l"(src), "r"(size));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }


// O += P V for keys 16 kc .. 16 kc + 15 of the tile, the A operand straight from the score
// accumulators: inside each 8-key chunk the MMA's k index t (t + 4) is key 2t (2t + 1), which is
// where the C layout left them
#define PV_CHUNK(KC) do { \
    double a_[8]; \
    _Pragma("unroll") \
    for (int jj = 0; jj < 4; ++jj) { \
        const int tile = 2 * (KC) + (jj >> 1); \
        a_[2 * jj] = s[tile][jj & 1]; \
        a_[2 * jj + 1] = s[tile][(jj & 1) + 2]; \
    } \
    _Pragma("unroll") \
    for (int j = 0; j < NTV; ++j) {  /* b_i = V[key 16 KC + 8(i>>1) + 2t + (i&1)][8j + g] */ \
        const double* vcol = Vs + ((KC) * 16 + 2 * t) * VS + j * 8 + g; \
        const double b[4] = {vcol[0], vcol[VS], vcol[8 * VS], vcol[9 * VS]}; \
        dmma16816(o[j], a_, b); \
    } \
} while (0)

// Strides are in elements. Grouped row r of a CTA column = (token r / group, group member r % group);
// blockIdx.y = batch * num_heads_kv + kv head. Q/OUT: (batch, kv head, token, member); K/V: (batch,
// kv head, key); per-row values: LSE with the l_* strides, PNORM and SHIFT with the r_* strides.
extern "C" __global__ void __launch_bounds__(NTHREADS, MIN_BLOCKS)
attn_fwd_f64(const elem_t* __restrict__ Q, const double* __restrict__ K, const double* __restrict__ V,
             const long long* __restrict__ LO, const long long* __restrict__ HI,
             double* __restrict__ OUT, double* __restrict__ LSE, double* __restrict__ PNORM,
             double* __restrict__ ONORM, double* __restrict__ SBOUND, const double* __restrict__ KMAX,
             const long long* __restrict__ STRIDES,
             int seqlen_q, int seqlen_k, int num_heads_kv, int group, int head_dim, int head_dim_v,
             double scale, int has_softcap, double softcap, int allow_shift) {
    // STRIDES (elements): q (batch, kv head, token, member), k and v (batch, kv head, key),
    // out (4 like q), lse (4), per-row values PNORM/ONORM/SBOUND (4).
    // KMAX[batch * num_heads_kv + kv head] = max_j ||k_j||. Outputs per row besides out and lse:
    // PNORM = ||P_i|| / l_i, ONORM = ||out_i||, SBOUND = ||q_i|| scale max||k|| (Cauchy-Schwarz).
    // (read where used, so that the loop does not keep 22 64-bit strides in registers)
    #define STRIDE(i) __ldg(STRIDES + (i))
    const long long k_ss = STRIDE(6), v_ss = STRIDE(9);
    extern __shared__ double smem[];
    double* Qs = smem;
    double* Ks = Qs + BLOCK_M * QS;
    double* Vs = Ks + BLOCK_N * QS;  // [key][dim_v], row stride VS
    __shared__ int s_kstart, s_kend;
    __shared__ long long s_qrow[BLOCK_M];  // element offset of each row of the Q tile in Q, -1 past the end

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int rows_total = seqlen_q * group;
    const int m0 = (gridDim.x - 1 - blockIdx.x) * BLOCK_M;  // heaviest (causal) blocks first
    const long long batch = blockIdx.y / num_heads_kv, kvh = blockIdx.y % num_heads_kv;
    const double* Kb = K + batch * STRIDE(4) + kvh * STRIDE(5);
    const double* Vb = V + batch * STRIDE(7) + kvh * STRIDE(8);

    if (tid == 0) { s_kstart = seqlen_k; s_kend = 0; }
    __syncthreads();
    {
        const long long q_ss = STRIDE(2), q_sg = STRIDE(3);
        for (int r = tid; r < BLOCK_M; r += NTHREADS) {  // one division by group per row
            const int row = m0 + r;
            long long offset = -1;
            if (row < rows_total) {
                const int token = row / group;
                offset = token * q_ss + (row - token * group) * q_sg;
                const long long lo = LO[token], hi = HI[token];
                if (lo < hi) { atomicMin(&s_kstart, (int)lo); atomicMax(&s_kend, (int)hi); }
            }
            s_qrow[r] = offset;
        }
        __syncthreads();
    }
    const int kstart = (s_kstart / BLOCK_N) * BLOCK_N, kend = s_kend;
    // K and V rows hold D_PAD / DV_PAD float64 (zero-padded, 16-byte aligned: `_launch` checks):
    // 16-byte cp.async chunks, only the key is bounds-checked
    #define ISSUE_TILE(DST, ROW, SRC, SRC_ROW, PAD, N0) do { \
        _Pragma("unroll") \
        for (int idx = tid; idx < BLOCK_N * ((PAD) / 2); idx += NTHREADS) { \
            const int r = idx / ((PAD) / 2), c = 2 * (idx - r * ((PAD) / 2)), key = (N0) + r; \
            const bool ok = key < seqlen_k; \
            cp_async16((DST) + r * (ROW) + c, (SRC) + (ok ? key * (SRC_ROW) + c : 0), ok); \
        } \
        cp_async_commit(); \
    } while (0)
    #define ISSUE_K(N0) ISSUE_TILE(Ks, QS, Kb, k_ss, D_PAD, N0)
    #define ISSUE_V(N0) ISSUE_TILE(Vs, VS, Vb, v_ss, DV_PAD, N0)
    if (kstart < kend) {  // the first K and V tiles load while Q is staged
        ISSUE_K(kstart);
        ISSUE_V(kstart);
    }
    {
        const elem_t* Qb = Q + batch * STRIDE(0) + kvh * STRIDE(1);
        #pragma unroll 8
        for (int idx = tid; idx < BLOCK_M * D_PAD; idx += NTHREADS) {
            const int r = idx / D_PAD, c = idx - r * D_PAD;
            const long long offset = s_qrow[r];
            Qs[r * QS + c] = (offset >= 0 && c < head_dim) ? ELEM_F64(Qb[offset + c]) * scale : 0.0;
        }
    }
    __syncthreads();

    // this thread's two rows: warp*16 + g (half 0) and warp*16 + g + 8 (half 1)
    int row_of[2], lo_of[2], hi_of[2];
    double shift_of[2], m_of[2], l_of[2], l2_of[2];
    const double k_max = KMAX[blockIdx.y];
    bool safe = true;
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        int row = m0 + warp * 16 + g + 8 * h;
        row_of[h] = row;
        bool ok = row < rows_total;
        lo_of[h] = ok ? (int)LO[row / group] : 0;
        hi_of[h] = ok ? (int)HI[row / group] : 0;
        // ||q_i|| (q already scaled) from the staged tile: each of the 4 threads of the row sums
        // every 4th column
        double sq = 0.0;
        for (int c = t; c < D_PAD; c += 4) { const double x = Qs[(warp * 16 + g + 8 * h) * QS + c]; sq += x * x; }
        sq += __shfl_xor_sync(0xffffffff, sq, 1);
        sq += __shfl_xor_sync(0xffffffff, sq, 2);
        const double bound = sqrt(sq) * k_max;  // >= |s_ij| for every key j
        if (ok && t == 0)
            SBOUND[batch * STRIDE(18) + kvh * STRIDE(19) + (row / group) * STRIDE(20) + (row % group) * STRIDE(21)] = bound;
        shift_of[h] = has_softcap ? fmin(bound, softcap) : bound;
        safe = safe && (!ok || lo_of[h] >= hi_of[h] || shift_of[h] <= SAFE_SHIFT_BOUND);
        m_of[h] = -CUDART_INF;
        l_of[h] = 0.0;
        l2_of[h] = 0.0;
    }
    // warp-uniform choice of softmax shift: the bound where it cannot underflow (oracle._dense.
    // shift_bound), else the online maximum; both give the same softmax
    const int shift_given = allow_shift && __all_sync(0xffffffff, safe);
    int warp_lo_all = min(lo_of[0], lo_of[1]), warp_hi_all = max(hi_of[0], hi_of[1]);
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        warp_lo_all = min(warp_lo_all, __shfl_xor_sync(0xffffffff, warp_lo_all, off));
        warp_hi_all = max(warp_hi_all, __shfl_xor_sync(0xffffffff, warp_hi_all, off));
    }

    double o[NTV][4];
    #pragma unroll
    for (int j = 0; j < NTV; ++j) { o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0; }

    // float64 K/V through cp.async (zero-filled outside the tensors): K(n+1) is fetched while
    // P V(n) runs and V(n+1) while Q K(n+1)^T runs (FA2-style single buffers)
    cp_async_wait_all();  // K(kstart), V(kstart)
    __syncthreads();
    for (int n0 = kstart; n0 < kend; n0 += BLOCK_N) {
        const bool more = n0 + BLOCK_N < kend;
        // warp-uniform `active`: does any of this warp's rows see a key of this tile?
        const bool active = warp_lo_all < n0 + BLOCK_N && warp_hi_all > n0;
        double s[NT][4];
        #pragma unroll
        for (int j = 0; j < NT; ++j) { s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0; }
        if (active) {
            #pragma unroll
            for (int kk = 0; kk < D_PAD; kk += 16) {
                double a[8];
                const double* qa = Qs + (warp * 16 + g) * QS + kk + t;
                #pragma unroll
                for (int i = 0; i < 8; ++i) a[i] = qa[(i & 1) * 8 * QS + (i >> 1) * 4];
                #pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const double* kb2 = Ks + (j * 8 + g) * QS + kk + t;
                    const double b[4] = {kb2[0], kb2[4], kb2[8], kb2[12]};
                    dmma16816(s[j], a, b);
                }
            }
        }
        cp_async_wait_all();  // V(n)
        __syncthreads();      // K(n) is free, V(n) visible
        if (more) ISSUE_K(n0 + BLOCK_N);
        if (active) {
            // softcap, mask, exp; s becomes p
            double shift_use[2];
            #pragma unroll
            for (int j = 0; j < NT; ++j) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int h = e >> 1, col = n0 + j * 8 + 2 * t + (e & 1);
                    double x = s[j][e];
                    if (has_softcap) x = softcap * tanh(x / softcap);
                    s[j][e] = (col >= lo_of[h] && col < hi_of[h]) ? x : -CUDART_INF;
                }
            }
            if (shift_given) {
                shift_use[0] = shift_of[0];
                shift_use[1] = shift_of[1];
            } else {  // online maximum (FA2 Algorithm 1 lines 9-10)
                double alpha[2];
                #pragma unroll
                for (int h = 0; h < 2; ++h) {
                    double mx = -CUDART_INF;
                    #pragma unroll
                    for (int j = 0; j < NT; ++j) mx = fmax(mx, fmax(s[j][2 * h], s[j][2 * h + 1]));
                    mx = fmax(mx, __shfl_xor_sync(0xffffffff, mx, 1));
                    mx = fmax(mx, __shfl_xor_sync(0xffffffff, mx, 2));
                    const double m_new = fmax(m_of[h], mx);
                    const double m_use = m_new == -CUDART_INF ? 0.0 : m_new;  // nothing visible yet
                    alpha[h] = exp(m_of[h] - m_use);
                    m_of[h] = m_new;
                    shift_use[h] = m_use;
                    l_of[h] *= alpha[h];
                    l2_of[h] *= alpha[h] * alpha[h];
                }
                #pragma unroll
                for (int j = 0; j < NTV; ++j) {
                    o[j][0] *= alpha[0]; o[j][1] *= alpha[0];
                    o[j][2] *= alpha[1]; o[j][3] *= alpha[1];
                }
            }
            #pragma unroll
            for (int j = 0; j < NT; ++j) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int h = e >> 1;
                    const double p = exp(s[j][e] - shift_use[h]);  // exp(-inf) = 0 on masked keys
                    s[j][e] = p;
                    l_of[h] += p;
                    l2_of[h] += p * p;
                }
            }
        }
        if (active) {
            #pragma unroll
            for (int kc = 0; kc < BLOCK_N / 16; ++kc) PV_CHUNK(kc);  // O += P V
        }
        cp_async_wait_all();  // K(n+1)
        __syncthreads();      // V(n) is free, K(n+1) visible
        if (more) ISSUE_V(n0 + BLOCK_N);
    }

    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        double l = l_of[h], l2 = l2_of[h];
        l += __shfl_xor_sync(0xffffffff, l, 1);
        l += __shfl_xor_sync(0xffffffff, l, 2);
        l2 += __shfl_xor_sync(0xffffffff, l2, 1);
        l2 += __shfl_xor_sync(0xffffffff, l2, 2);
        const bool empty = l == 0.0;
        const double l_safe = empty ? 1.0 : l;
        const int row = row_of[h];
        if (row < rows_total) {
            const long long token = row / group, member = row % group;
            double* orow = OUT + batch * STRIDE(10) + kvh * STRIDE(11) + token * STRIDE(12) + member * STRIDE(13);
            double osq = 0.0;
            #pragma unroll
            for (int j = 0; j < NTV; ++j) {
                const double x0 = o[j][2 * h] / l_safe, x1 = o[j][2 * h + 1] / l_safe;
                const int col = j * 8 + 2 * t;
                if (col < head_dim_v) orow[col] = x0;
                if (col + 1 < head_dim_v) orow[col + 1] = x1;
                osq += x0 * x0 + x1 * x1;  // padded columns hold 0
            }
            osq += __shfl_xor_sync(0x0000000f << (lane & 28), osq, 1);
            osq += __shfl_xor_sync(0x0000000f << (lane & 28), osq, 2);
            if (t == 0) {
                const double base = shift_given ? shift_of[h] : m_of[h];
                const long long at = batch * STRIDE(18) + kvh * STRIDE(19) + token * STRIDE(20) + member * STRIDE(21);
                LSE[batch * STRIDE(14) + kvh * STRIDE(15) + token * STRIDE(16) + member * STRIDE(17)] =
                    empty ? -CUDART_INF : base + log(l_safe);
                PNORM[at] = sqrt(l2) / l_safe;
                ONORM[at] = sqrt(osq);
            }
        }
    }
}
"""

_KV_SOURCE = _ELEMENT_SOURCE + r"""
// X [B, S, H, D] (strides X_STRIDES, last dim contiguous, element kind ELEM_KIND) -> Y contiguous float64
// [B, S, H, pad], exact, zeros past D; NMAX[b * H + h] = the bits of max_s ||x[b, s, h, :]|| (float64;
// norms are >= 0, so their bit patterns order as the values: atomicMax on the bits).
extern "C" __global__ void kv_to_f64(const elem_t* __restrict__ X, double* __restrict__ Y,
                                     unsigned long long* __restrict__ NMAX, const long long* __restrict__ X_STRIDES,
                                     int seqlen, int heads, int dim, int pad, int vec4) {
    // grid (ceil(seqlen / 256), heads, batch): warp w takes rows s0 .. s0 + 31 of one (batch, head),
    // keeps the largest norm and makes one atomicMax
    const int b = blockIdx.z, h = blockIdx.y, lane = threadIdx.x & 31;
    const int s0 = blockIdx.x * 256 + (threadIdx.x >> 5) * 32;
    if (s0 >= seqlen) return;
    const elem_t* xb = X + b * X_STRIDES[0] + h * X_STRIDES[2];
    const long long s_stride = X_STRIDES[1];
    double best = 0.0;
    #pragma unroll 4
    for (int i = 0; i < 32; ++i) {
        const int s = s0 + i;
        if (s < seqlen) {
            const elem_t* x = xb + s * s_stride;
            double* y = Y + (((long long)b * seqlen + s) * heads + h) * pad;
            double sq = 0.0;
            if (vec4) {  // dim % 4 == 0, 4-element-aligned rows (pad % 4 == 0 always)
                for (int c = 4 * lane; c < pad; c += 128) {
                    double v[4] = {0.0, 0.0, 0.0, 0.0};
                    if (c < dim) {
#if ELEM_KIND == 0
                        const double2 p = *(const double2*)(x + c), q = *(const double2*)(x + c + 2);
                        v[0] = p.x; v[1] = p.y; v[2] = q.x; v[3] = q.y;
#elif ELEM_KIND == 1
                        const float4 p = *(const float4*)(x + c);
                        v[0] = p.x; v[1] = p.y; v[2] = p.z; v[3] = p.w;
#else
                        const ushort4 p = *(const ushort4*)(x + c);
                        v[0] = ELEM_F64(p.x); v[1] = ELEM_F64(p.y); v[2] = ELEM_F64(p.z); v[3] = ELEM_F64(p.w);
#endif
                    }
                    *(double2*)(y + c) = make_double2(v[0], v[1]);
                    *(double2*)(y + c + 2) = make_double2(v[2], v[3]);
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) sq = fma(v[e], v[e], sq);
                }
            } else {
                for (int c = lane; c < pad; c += 32) {
                    const double v = c < dim ? ELEM_F64(x[c]) : 0.0;
                    y[c] = v;
                    sq = fma(v, v, sq);
                }
            }
            #pragma unroll
            for (int off = 16; off > 0; off >>= 1) sq += __shfl_xor_sync(0xffffffff, sq, off);
            const double norm = sqrt(sq);
            best = (norm > best || norm != norm) ? norm : best;  // NaN sticks
        }
    }
    if (lane == 0) atomicMax(NMAX + (long long)b * heads + h, (unsigned long long)__double_as_longlong(best));
}
"""


@functools.lru_cache(maxsize=None)
def _kv_kernel(x_kind: int, capability: str):
    return _compiler()(f"#define ELEM_KIND {x_kind}\n" + _KV_SOURCE, "kv_to_f64", compute_capability=capability)


def _kv_float64(x: torch.Tensor, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x64, norm_max)``: a contiguous float64 copy of ``x [B, S, H, D]`` (exact) with its last
    dimension zero-padded to ``pad`` (``[B, S, H, pad]``, a multiple of 8 >= D), and ``max_s
    ||x[b, s, h]||`` as ``[B, H]`` float64, in one pass over ``x`` (one kernel; NaN propagates)."""
    batch, seqlen, heads, dim = x.shape
    if x.stride(-1) != 1:
        raise RuntimeError(f"k/v need a contiguous last dimension, have stride {x.stride(-1)}")
    if pad < dim or pad % 8:
        raise RuntimeError(f"pad must be a multiple of 8 >= {dim}, got {pad}")
    y = torch.empty(batch, seqlen, heads, pad, dtype=torch.float64, device=x.device)
    nmax = torch.zeros(batch, heads, dtype=torch.int64, device=x.device)  # bits of +0.0
    if batch * seqlen * heads:
        major, minor = torch.cuda.get_device_capability(x.device)
        vec4 = dim % 4 == 0 and all(st % 4 == 0 for st in x.stride()[:3]) and x.data_ptr() % (4 * x.element_size()) == 0
        with torch.cuda.device(x.device):
            _kv_kernel(_KIND[x.dtype], f"{major}{minor}")(
                grid=(math.ceil(seqlen / 256), heads, batch), block=(256, 1, 1),
                args=[x, y, nmax, _strides_on(x.device, tuple(x.stride()[:3])), seqlen, heads, dim, pad, int(vec4)],
            )
    return y, nmax.view(torch.float64)


_PRELUDE = (
    "#define CUDART_INF __longlong_as_double(0x7ff0000000000000ULL)\n"
    "#define SAFE_SHIFT_BOUND 170.0\n"  # oracle._dense.SAFE_SHIFT_BOUND (checked in _kernel)
)

# torch dtype -> ELEM_KIND of the kernels (how an input element becomes a float64, exactly)
_KIND = {torch.float64: 0, torch.float32: 1, torch.bfloat16: 2, torch.float16: 3}


def _pad(n: int, multiple: int) -> int:
    return max(multiple, -(-n // multiple) * multiple)


class TileConfig(NamedTuple):
    """Compile-time shape of the kernel (see the module docstring)."""

    warps: int  # NWARPS: warps per CTA, 16 query rows each
    block_n: int  # BLOCK_N: keys per tile, a multiple of 16
    min_blocks: int  # MIN_BLOCKS: CTAs per SM the register budget is set for


# The fastest config that stayed at float64 rounding on an H200 (benchmarks/gpu/dmma_probe.py,
# b4 s4096 h16 d128 causal; figures in the module docstring).
DEFAULT_CONFIG = TileConfig(8, 32, 1)


def _config() -> TileConfig:
    """The tile config; override with ``ATTNFUZZ_CUDA_CONFIG=W,N,B``."""
    override = os.environ.get("ATTNFUZZ_CUDA_CONFIG")
    if override:
        return TileConfig(*(int(x) for x in override.split(",")))
    return DEFAULT_CONFIG


def smem_bytes(head_dim: int, head_dim_v: int, config: TileConfig) -> int:
    """Dynamic shared memory of one CTA, bytes: float64 Q tile (``16 * warps`` rows), K tile and V
    tile (``block_n`` keys), with the row padding that keeps fragment loads free of bank conflicts."""
    d_pad, dv_pad = _pad(head_dim, 16), _pad(head_dim_v, 8)
    return 8 * ((16 * config.warps + config.block_n) * (d_pad + 4) + config.block_n * (dv_pad + 2))


@functools.lru_cache(maxsize=None)
def _kernel(d_pad: int, dv_pad: int, config: TileConfig, q_kind: int, capability: str):
    if f"{SAFE_SHIFT_BOUND:.1f}" not in _PRELUDE:
        raise RuntimeError("SAFE_SHIFT_BOUND of the kernel differs from oracle._dense's")
    defines = (
        f"#define D_PAD {d_pad}\n#define DV_PAD {dv_pad}\n#define NWARPS {config.warps}\n"
        f"#define BLOCK_N {config.block_n}\n#define MIN_BLOCKS {config.min_blocks}\n#define ELEM_KIND {q_kind}\n"
    )
    kernel = _compiler()(_PRELUDE + defines + _SOURCE, "attn_fwd_f64", compute_capability=capability)
    if not hasattr(kernel, "set_shared_memory_config"):
        raise RuntimeError(f"torch {torch.__version__}: compiled kernels cannot raise their shared-memory limit")
    kernel.set_shared_memory_config(smem_bytes(d_pad, dv_pad, config))
    return kernel


def _row_norm_max(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``max`` over ``dim`` of the float64 row norms of ``x`` (0 where ``dim`` is empty)."""
    norms = torch.linalg.vector_norm(x, dim=-1, dtype=torch.float64)
    if norms.shape[dim] == 0:
        return norms.sum(dim=dim)
    return norms.amax(dim=dim)


@functools.lru_cache(maxsize=256)
def _strides_on(device: torch.device, strides: tuple[int, ...]) -> torch.Tensor:
    """The kernel's ``STRIDES`` as an int64 tensor on ``device`` (64-bit: the launcher passes Python
    ints as 32-bit), kept per strides so that a repeated shape costs no host-to-device copy (which
    would wait for the stream)."""
    return torch.tensor(strides, dtype=torch.int64).to(device)


def _padded_rows(x: torch.Tensor, pad: int) -> torch.Tensor:
    """``x [..., D]`` float64 as a contiguous ``[..., pad]`` (zeros past D): rows the kernel copies in
    16-byte chunks."""
    x = x.contiguous()
    return x if x.shape[-1] == pad else torch.nn.functional.pad(x, (0, pad - x.shape[-1]))


def _launch(q, k, v, lo, hi, *, batch, num_heads_kv, group, seqlen_q, seqlen_k, head_dim_v, q_strides, k_strides,
            v_strides, out, o_strides, lse, l_strides, rows_shape, r_strides, k_max, scale, softcap):
    """One launch; returns the per-row values ``(p_norm, out_norm, score_bound)`` of ``rows_shape``.
    ``k``/``v`` rows hold D_PAD / DV_PAD float64 (zero-padded, 16-byte aligned rows)."""
    head_dim = q.shape[-1]
    d_pad, dv_pad = _pad(head_dim, 16), _pad(head_dim_v, 8)
    if q.stride(-1) != 1:
        raise RuntimeError(f"q needs a contiguous last dimension, has stride {q.stride(-1)}")
    for name, x, pad, row_strides in (("k", k, d_pad, k_strides), ("v", v, dv_pad, v_strides)):
        if x.shape[-1] != pad or x.stride(-1) != 1 or x.data_ptr() % 16 or any(st % 2 for st in row_strides):
            raise RuntimeError(f"{name} must have 16-byte aligned rows of {pad} float64 (zero-padded), has shape "
                               f"{tuple(x.shape)} and strides {tuple(x.stride())}")
    if q.dtype not in _KIND or k.dtype != torch.float64 or v.dtype != torch.float64:
        raise RuntimeError(f"unsupported dtypes: q {q.dtype} (allowed: {list(_KIND)}), k {k.dtype}, v {v.dtype} (float64)")
    config = _config()
    major, minor = torch.cuda.get_device_capability(q.device)
    rows_total = seqlen_q * group
    per_row = [torch.empty(rows_shape, dtype=torch.float64, device=q.device) for _ in range(3)]  # every row written
    strides = _strides_on(q.device, (*q_strides, *k_strides, *v_strides, *o_strides, *l_strides, *r_strides))
    with torch.cuda.device(q.device):
        kernel = _kernel(d_pad, dv_pad, config, _KIND[q.dtype], f"{major}{minor}")
        if rows_total and batch * num_heads_kv:
            kernel(
                grid=(math.ceil(rows_total / (16 * config.warps)), batch * num_heads_kv, 1),
                block=(32 * config.warps, 1, 1),
                args=[
                    q, k, v, lo.contiguous(), hi.contiguous(), out, lse, *per_row,
                    k_max.contiguous(), strides, seqlen_q, seqlen_k, num_heads_kv, group, head_dim, head_dim_v,
                    float(scale), int(softcap is not None), float(softcap if softcap is not None else 1.0),
                    int(os.environ.get("ATTNFUZZ_CUDA_SHIFT") != "0"),  # 0: always the online maximum (tests)
                ],
                shared_mem=smem_bytes(d_pad, dv_pad, config),
            )
    return per_row


@torch.no_grad()
def dense_forward(d, want_scales: bool) -> dict[str, torch.Tensor]:
    """The CUDA forward of one `oracle._dense.Dense`: same outputs as `oracle._dense.dense_forward`.

    Returns grouped ``out [B*Hkv, Sq*G, Dv]``, ``lse [B*Hkv, Sq*G]`` (float64, natural log,
    ``-inf`` where no key is visible) and with ``want_scales`` the error scales of
    `oracle._dense.forward_scales`.

    Raises:
        RuntimeError: NVRTC compile or launch failure (the caller falls back to Triton / torch).
    """
    bh, rows_total, head_dim = d.q.shape
    head_dim_v = d.v.shape[-1]
    device = d.q.device
    d_pad, dv_pad = _pad(head_dim, 16), _pad(head_dim_v, 8)
    q, k, v = d.q.contiguous(), _padded_rows(d.k, d_pad), _padded_rows(d.v, dv_pad)
    out = torch.empty(bh, rows_total, head_dim_v, dtype=torch.float64, device=device)
    lse = torch.empty(bh, rows_total, dtype=torch.float64, device=device)
    g = d.group
    per_row = (rows_total, 0, g, 1)
    p_norm, _, _ = _launch(
        q, k, v, d.lo, d.hi, batch=bh, num_heads_kv=1, group=g, seqlen_q=d.seqlen_q, seqlen_k=d.seqlen_k,
        head_dim_v=head_dim_v, q_strides=(rows_total * head_dim, 0, g * head_dim, head_dim),
        k_strides=(d.seqlen_k * d_pad, 0, d_pad), v_strides=(d.seqlen_k * dv_pad, 0, dv_pad),
        out=out, o_strides=(rows_total * head_dim_v, 0, g * head_dim_v, head_dim_v), lse=lse, l_strides=per_row,
        rows_shape=(bh, rows_total), r_strides=per_row, k_max=_row_norm_max(d.k, 1),
        scale=1.0, softcap=d.softcap,  # d.q is already scaled
    )
    result = {"out": out, "lse": lse}
    if want_scales:
        result.update(forward_scales(d, out, lse, p_norm))
    return result


@torch.no_grad()
def direct_forward(case, q, k, v, lo, hi, rho: float, want_scales: bool) -> dict[str, torch.Tensor]:
    """Forward straight from the canonical input tensors, with no grouped float64 copies.

    The kernel reads ``q [B, Sq, H, D]`` in its own dtype (float64/32, bfloat16, float16: each
    element converts to float64 exactly), multiplies it by softmax_scale in float64 as it stages it,
    reads float64 copies of ``k``/``v [B, Sk, Hkv, D(v)]`` made in their own layout, and writes
    ``out [B, Sq, H, Dv]`` and ``lse [B, H, Sq]`` (float64) in place, with the per-row values the
    error scales need (``||P_i||``, ``||out_i||``, the score bound): the grouped copies, the scaling
    pass, the ungrouping and the norm passes of `oracle._dense.Dense` are skipped. Same
    arithmetic as `dense_forward`.

    Args:
        case: the case (bshd/sbhd; mask fields are already in ``lo``/``hi``).
        q, k, v: canonical tensors (any strides with a contiguous last dimension).
        lo, hi: ``[Sq] int64`` key bounds of `oracle.masks.key_bounds`, on q's device.
        rho: float32 unit roundoff / unit roundoff of the case dtype (`oracle._dense.Dense.rho`).
        want_scales: also return ``out_scale [B, Sq, H]`` and ``lse_scale [B, H, Sq]`` (the
            formulas of `oracle._dense.forward_scale_formulas`).

    Returns:
        ``{"out", "lse"[, "out_scale", "lse_scale"]}``, float64.

    Raises:
        RuntimeError: NVRTC compile or launch failure, or an unsupported dtype / layout.
    """
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv, head_dim_v = k.shape[1], k.shape[2], v.shape[-1]
    group = heads // heads_kv
    f64 = torch.float64
    # K and V are read once per 16 * NWARPS query rows: contiguous float64 copies (exact, rows
    # zero-padded to D_PAD / DV_PAD) let the kernel cp.async them in 16-byte chunks; made in one pass
    # with max_j ||k_j|| and max_j ||v_j|| ([B, Hkv]); q stays in its dtype (read once)
    (k, k_max), (v, v_max) = _kv_float64(k, _pad(head_dim, 16)), _kv_float64(v, _pad(head_dim_v, 8))
    out = torch.empty(batch, seqlen_q, heads, head_dim_v, dtype=f64, device=q.device)
    lse = torch.empty(batch, heads, seqlen_q, dtype=f64, device=q.device)
    qs, ks, vs = q.stride(), k.stride(), v.stride()
    p_norm, out_norm, score_bound = _launch(
        q, k, v, lo, hi, batch=batch, num_heads_kv=heads_kv, group=group, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
        head_dim_v=head_dim_v, q_strides=(qs[0], group * qs[2], qs[1], qs[2]), k_strides=(ks[0], ks[2], ks[1]), v_strides=(vs[0], vs[2], vs[1]),
        out=out, o_strides=(seqlen_q * heads * head_dim_v, group * head_dim_v, heads * head_dim_v, head_dim_v),
        lse=lse, l_strides=(heads * seqlen_q, group * seqlen_q, 1, seqlen_q),
        rows_shape=(batch, seqlen_q, heads), r_strides=(seqlen_q * heads, group, heads, 1),
        k_max=k_max.reshape(-1), scale=case.softmax_scale, softcap=case.softcap,
    )
    result = {"out": out, "lse": lse}
    if want_scales:
        accumulation = (hi - lo).clamp(min=0).to(f64).sqrt()[None, :, None]  # sqrt(n_i), [1, Sq, 1]
        result["out_scale"], result["lse_scale"] = forward_scale_formulas(
            rho=rho,
            p_norm=p_norm,
            v_max=v_max.repeat_interleave(group, dim=1)[:, None, :],  # [B, 1, H]
            score_bound=score_bound,
            accumulation=accumulation,
            out_norm=out_norm,
            lse=lse,
            lse_bound=(score_bound + accumulation).transpose(1, 2),  # [B, H, Sq]
        )
    return result


__all__ = ["DEFAULT_CONFIG", "MAX_HEAD_DIM", "TileConfig", "dense_forward", "direct_forward", "smem_bytes",
           "unsupported_reason"]
