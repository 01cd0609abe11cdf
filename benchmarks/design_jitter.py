"""Is a `wrong` bucket's rule failure beyond what two correct kernels of its design can differ by?

A design's second opinion (`oracle.emulate.explain_failure`) applies FlashAttention's test rule,
``||kernel - ref|| <= 2 ||emulation - ref|| + allowed`` per tensor, against ONE float32 emulation of
the backend's declared design. Two correct kernels of that design sum their float32 scores in
different orders, so an intermediate held in the dtype (``scores``, ``probs``, ...) may round to a
neighbouring value in one and not in the other. This script measures how far that alone moves the
rule: for each bucket it emulates the design once as `emulate` does (A), then ``--trials`` times with
q and k multiplied entry by entry by ``1 + e * 2**-23``, ``e`` drawn from {-1, 0, 1} (one float32
ulp: a different summation order changes a float32 score by about as much) (B), and prints the
largest ratio of the rule of B against A per tensor, beside the kernel's stored rule ratios. Every
tensor of the emulation is shown, ``lse`` too where the backend returns none (te-unfused): read the
tensors the kernel's rule names.

A kernel ratio far above the largest B-against-A ratio is not explained by rounding order; one
within it is a design limit the single emulation cannot see.

CPU only (the cases are rebuilt with `oracle.inputs.make_inputs` from their seeds). Usage::

    gunzip -k .gpu-runs/2026-12-06-99d443e-default/campaign.db.gz
    python benchmarks/design_jitter.py .gpu-runs/2026-12-06-99d443e-default/campaign.db 44 50 91

Results of 2026-12-06 (this 2-core CPU, torch 2.13.0):
`benchmarks/gpu/results/2026-12-06-99d443e-default/groups.md`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fuzzer.registry import discover  # noqa: E402
from oracle.compare import PreparedReference, compare_outputs_batch  # noqa: E402
from oracle.config import AttentionCase  # noqa: E402
from oracle.emulate import design_rule, emulate  # noqa: E402
from oracle.inputs import make_inputs  # noqa: E402
from oracle.reference import reference  # noqa: E402


def jitter(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``x`` in float32 times ``1 + e * 2**-23`` entry by entry, ``e`` uniform in {-1, 0, 1}."""
    x = x.float()
    return x * (1 + torch.randint(-1, 2, x.shape, generator=generator).float() * 2.0**-23)


def bucket_rows(db: str) -> dict[int, dict]:
    """The buckets of ``attnfuzz report --db DB --json`` by id (design limits left out)."""
    done = subprocess.run(
        [sys.executable, "-m", "service.cli.main", "report", "--db", db, "--json"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )
    return {b["id"]: b for b in json.loads(done.stdout)["buckets"]}


def measure(bucket: dict, trials: int) -> dict:
    """Emulation A against the float64 oracle, and the worst rule ratio of B against A per tensor."""
    backend, _ = discover()[bucket["backend"]]
    design = backend.design
    case = AttentionCase.from_json(bucket["case_json"])
    inputs = make_inputs(case)
    prepared = PreparedReference(case, reference(case, inputs), inputs)
    a = emulate(case, inputs, design)
    a_tensors = {n: t for n, t in a.tensors().items() if t is not None}
    a_verdict = compare_outputs_batch(case, prepared, [a_tensors])[0]
    worst: dict[str, float] = {}
    for trial in range(trials):
        g = torch.Generator().manual_seed(trial)
        b = emulate(case, dataclasses.replace(inputs, q=jitter(inputs.q, g), k=jitter(inputs.k, g)), design)
        for name, t in b.tensors().items():
            if t is not None:
                worst[name] = max(worst.get(name, 0.0), design_rule(prepared.tensor(name), t, a_tensors[name]).ratio)
    kernel = {n: r["ratio"] for n, r in ((bucket.get("second_opinion") or {}).get("rule") or {}).items()}
    return {
        "bucket": bucket["id"], "backend": bucket["backend"], "design": design.name, "case": bucket["case"],
        "emulation_vs_oracle": {n: tv.error_ratio for n, tv in a_verdict.tensors.items()},
        "jitter_rule_worst": worst, "kernel_rule": kernel,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("db", help="a campaign's SQLite file (or SQLAlchemy URL)")
    parser.add_argument("buckets", nargs="+", type=int, help="bucket ids")
    parser.add_argument("--trials", type=int, default=6, help="jittered emulations per bucket (default 6)")
    parser.add_argument("--json", action="store_true", help="print JSON lines")
    args = parser.parse_args(argv)
    rows = bucket_rows(args.db)
    missing = [b for b in args.buckets if b not in rows]
    if missing:
        parser.error(f"buckets: {missing} are not buckets of {args.db} outside the design limits")
    for bid in args.buckets:
        m = measure(rows[bid], args.trials)
        if args.json:
            print(json.dumps(m))
            continue
        fmt = lambda d: ", ".join(f"{k} {v:.3g}" for k, v in d.items())  # noqa: E731
        print(f"bucket {bid} {m['backend']} ({m['design']}): {m['case']}")
        print(f"  emulation against the oracle (error ratio): {fmt(m['emulation_vs_oracle'])}")
        print(f"  rule of a one-ulp jittered emulation against it, worst of {args.trials}: {fmt(m['jitter_rule_worst'])}")
        print(f"  the kernel's rule against the emulation (stored): {fmt(m['kernel_rule']) or '-'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
