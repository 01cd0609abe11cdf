"""Build the STAND-IN database the tests of the issue report use (CPU only, no GPU). docs/example-issue-report.md itself now comes from the H200 campaign database of 2026-12-01 (see its first line).

The seed's bucket, FA4 ``te_style`` ``out:all_zero``, as the real store records it: the build
fingerprint of the H200 runs (labelled stand-in in ``device_name``), the first case and the
minimised case (b1 sq1 sk1 h1 d128 bf16 causal, forward, as minimised on the H200 in
docs/gpu-campaigns.md), and on the minimised case the results of FA4's other variants and of TE
and SDPA. Every figure is real: the kernels' outputs are stood in for on the CPU (FA4 after
flash-attention #2490 with TE's causal window ``(-1, 0)``: out all zeros, lse ``-inf``; the others:
the float64 reference rounded to bf16) and judged by `oracle.compare.compare_outputs`, exactly as a
worker judges them, so the stored figures and allowances are the worker's.

Regenerate the example (from the repository root)::

    rm -f /tmp/standin.db && .venv/bin/python docs/make_example_issue_report.py /tmp/standin.db
    (echo "$STANDIN_NOTE"; echo; .venv/bin/attnfuzz report --db /tmp/standin.db --bucket 1 --format markdown) \
        > docs/example-issue-report.md

with ``STANDIN_NOTE`` the first line of the committed file (a blockquote saying it is a stand-in).

With a GPU database, the same report of its seed bucket (``attnfuzz report --db DB`` lists the
bucket ids)::

    .venv/bin/attnfuzz report --db GPU.db --bucket ID --format markdown > docs/example-issue-report.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fuzzer.results import BuildFingerprint, CaseResult  # noqa: E402
from oracle.compare import compare_outputs  # noqa: E402
from oracle.config import AttentionCase  # noqa: E402
from oracle.inputs import make_inputs  # noqa: E402
from oracle.reference import reference  # noqa: E402
from service.db import migrations  # noqa: E402
from service.db.engine import make_engine  # noqa: E402
from service.db.store import SqlStore  # noqa: E402

BUILD = BuildFingerprint(
    torch="2.11.0+cu130", cuda="13.0", cudnn="9.13.0", flash_attn_4="4.0.0b36", flash_attn="2.8.3",
    transformer_engine="2.20.2", nvidia_cutlass_dsl="4.3.0", triton="3.5.0", python="3.11.14",
    device_name="NVIDIA H200 (STAND-IN: CPU-generated example)", compute_capability="9.0", driver="580.95.05",
)
FIRST = AttentionCase(batch_size=2, seqlen_q=130, seqlen_k=130, num_heads=4, num_heads_kv=2, head_dim=128,
                      dtype="bfloat16", causal=True, causal_alignment="bottom_right", backward=False, seed=17)
MINIMISED = AttentionCase(batch_size=1, seqlen_q=1, seqlen_k=1, num_heads=1, head_dim=128, dtype="bfloat16",
                          causal=True, causal_alignment="top_left", backward=False, seed=17)
VERSIONS = {
    "fa4": "flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.3.0 torch==2.11.0+cu130",
    "te-fa4": "flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.3.0 torch==2.11.0+cu130 transformer-engine==2.20.2",
    "te-fused": "torch==2.11.0+cu130 transformer-engine==2.20.2 runtime:cudnn==9.13.0",
    "torch-sdpa-math": "torch==2.11.0+cu130",
}
# (backend, variant, planted all-zero?, returns lse?)
TASKS = [
    ("fa4", "te_style", True, True),
    ("fa4", "native", False, True),
    ("fa4", "causal_as_window", False, True),
    ("te-fa4", "mask_type", True, False),
    ("te-fused", "mask_type", False, False),
    ("torch-sdpa-math", "is_causal", False, False),
]


def judged(case: AttentionCase, backend: str, variant: str, zero: bool, with_lse: bool) -> CaseResult:
    """The result a worker stores for the stood-in kernel output (see the module docstring)."""
    ref = reference(case, make_inputs(case), backward=False)
    out = torch.zeros_like(ref.out, dtype=torch.bfloat16) if zero else ref.out.to(torch.bfloat16)
    lse = None
    if with_lse:
        lse = torch.full_like(ref.lse, -torch.inf, dtype=torch.float32) if zero else ref.lse.to(torch.float32)
    verdict = compare_outputs(case, ref, out=out, lse=lse)
    return CaseResult(
        case.case_id, backend, variant, "pass" if verdict.passed else "fail",
        signature=verdict.primary_signature, signatures=verdict.signatures,
        metrics={name: tv.to_json() for name, tv in verdict.tensors.items()},
        error_ratio=verdict.error_ratio if verdict.error_ratio != float("inf") else None,
        backend_version=VERSIONS[backend], phase="fuzz",
        selected_kernel="FlashAttention (flash_attn_func_v4)" if backend == "te-fa4" else None,
    )


def build(url: str) -> int:
    """Fill the database at ``url``; returns the FA4 te_style bucket's id."""
    migrations.upgrade(url)
    engine = make_engine(url)
    try:
        store = SqlStore(engine)
        build_id = store.register_build(BUILD)
        store.record_case(FIRST.to_json(), "fuzz")
        update = store.record_result(judged(FIRST, "fa4", "te_style", True, True), build_id, None)
        store.record_case(MINIMISED.to_json(), "minimised")
        store.record_minimised(update.bucket_id, MINIMISED.to_json(), FIRST.case_id, "minimised: 12 shrink runs")
        for backend, variant, zero, with_lse in TASKS:
            result = judged(MINIMISED, backend, variant, zero, with_lse)
            store.record_result(result, build_id, None)
        return update.bucket_id
    finally:
        engine.dispose()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python docs/make_example_issue_report.py DATABASE_PATH")
    bucket_id = build(f"sqlite:///{Path(sys.argv[1]).resolve()}")
    print(f"bucket {bucket_id}: attnfuzz report --db {sys.argv[1]} --bucket {bucket_id} --format markdown")
