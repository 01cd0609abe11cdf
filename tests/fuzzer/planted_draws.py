"""A planted backend for the case-space tests (tests/fuzzer/test_draws.py).

`LongRowBackend` ("planted-long-row"): correct attention (float32 math with an explicit mask, as
in `tests.fuzzer.standins`), except for decode-like cases, ``seqlen_q <= 16`` with ``seqlen_k >
1024``: there it attends to the first 1024 keys only, as a split-KV kernel that drops its last
split would. Its capabilities are a plain plugin's (every dtype, dense layouts, head dims to 256,
the default soft ``max_seqlen`` of 4096), nothing that points the fuzzer at long rows.
"""

from __future__ import annotations

from fuzzer.backends.base import Backend, BackendOutput, Capabilities, run_with_grad
from tests.fuzzer.standins import attention_with_band

SPLIT = 1024
FEW_QUERIES = 16


def is_planted_region(case) -> bool:
    """Where `LongRowBackend` is wrong: ``seqlen_q <= 16`` and ``seqlen_k > 1024``."""
    return case.seqlen_q <= FEW_QUERIES and case.seqlen_k > SPLIT


class LongRowBackend(Backend):
    name = "planted-long-row"
    environment = "planted-long-row"
    device = "cpu"
    variants = ("native",)
    capabilities = Capabilities(
        dtypes=("float32", "bfloat16", "float16"),
        qkv_formats=("bshd", "sbhd"),
        max_head_dim=256,
        head_dim_v_differs=True,
        windows=True,
        lse=True,
    )

    def run(self, case, inputs, variant):
        offset = case.seqlen_k - case.seqlen_q if case.causal_alignment == "bottom_right" else 0
        right = case.window_size_right
        if case.causal:
            right = 0 if right is None else min(right, 0)
        keys = SPLIT if is_planted_region(case) else case.seqlen_k

        def fn(q, k, v):
            return attention_with_band(q, k[:, :keys], v[:, :keys], case.softmax_scale, case.window_size_left, right, offset)

        out, lse, dq, dk, dv = run_with_grad(fn, case, inputs)
        return BackendOutput(out=out, lse=lse, dq=dq, dk=dk, dv=dv)
