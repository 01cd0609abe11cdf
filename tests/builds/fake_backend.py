"""A backend adapter for the fake builds (`tests.builds.fakebuilds`): ``fake-kernel``.

Load it with ``--backend tests.builds.fake_backend:FakeKernelBackend``. It imports
``attnfuzz_fakekernel`` lazily, so the build's version on ``PYTHONPATH`` decides what runs, and
names it in ``packages`` so the build's ``attnfuzz-fakekernel`` version is recorded.

Variants: ``native`` (None = unbounded, the causal flag) and ``te_style`` (what
TransformerEngine sends: ``causal=True, window_size=(-1, 0)`` for causal cases, ``-1`` for each
unbounded side otherwise).
"""

from __future__ import annotations

from typing import Any, ClassVar

from fuzzer.backends.base import Backend, BackendOutput, Capabilities, run_with_grad
from oracle.config import AttentionCase


class FakeKernelBackend(Backend):
    name = "fake-kernel"
    device = "cpu"
    environment = "fake-kernel"
    variants: ClassVar[tuple[str, ...]] = ("native", "te_style")
    packages: ClassVar[tuple[str, ...]] = ("attnfuzz-fakekernel", "attnfuzz-fakedep", "torch")
    capabilities = Capabilities(
        dtypes=("float32",), qkv_formats=("bshd",), max_head_dim=64, windows=True, lse=True, max_seqlen=64
    )

    def availability(self) -> str | None:
        try:
            import attnfuzz_fakekernel  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - any import failure makes the build unusable
            return f"cannot import attnfuzz_fakekernel: {type(exc).__name__}: {exc}"
        return None

    def run(self, case: AttentionCase, inputs: Any, variant: str) -> BackendOutput:
        import attnfuzz_fakekernel as lib

        left, right = case.window_size_left, case.window_size_right
        if variant == "te_style":
            left = -1 if left is None else left
            right = 0 if case.causal else (-1 if right is None else right)
        offset = case.seqlen_k - case.seqlen_q if case.causal_alignment == "bottom_right" else 0

        def call(q, k, v):
            return lib.attention(
                q, k, v, causal=case.causal, window_size=(left, right), softmax_scale=case.softmax_scale, offset=offset
            )

        out, lse, dq, dk, dv = run_with_grad(call, case, inputs)
        return BackendOutput(out=out, lse=lse, dq=dq, dk=dk, dv=dv, selected_kernel=f"fakekernel {lib.__version__}")
