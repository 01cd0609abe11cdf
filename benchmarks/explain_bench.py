"""The design explanation of failing results, as the fuzz and shrink phases run it against the
second opinion's, side by side in one process.

Usage::

    python benchmarks/explain_bench.py [--device cpu|cuda] [--cases 40] [--repeats 3] [--seed 0] [--json OUT]

Why: on the H200 (2026-12-04, 4c821b3, `docs/gpu-campaigns.md`) the default campaign ran 13,996
cases an hour against 16,800 before the design verdicts (24321c7); the oracle's seconds per case
rose 3.8x and the kernels' 2.5x while the explanations of failing results ran on the same GPU.
Before 2026-12-05 every failing result emulated its backend's whole design (the backward pass
included) and judged every tensor, and shrink candidates also ran one emulation per claim (the
mechanism's ablation). Now (`fuzzer.evaluate.OPINION_PHASES`) only the confirmation and replay
do that; a fuzz or shrink result emulates its failing tensors with the claims that reach them
(`oracle.emulate.design_for`).

Cases: ``--cases`` dense cases drawn from the CPU backends' capabilities with the input families
(`fuzzer.strategies.attention_cases`, Hypothesis with a fixed seed), each kept when its float64
oracle fits (`AttentionCase.check_resources`). Kernels: per case, the float32 emulation of each
built-in design (`fuzzer.backends` designs) with one planted defect in turn (none, a wrong ``out``
row, an all-zero ``dv`` on backward cases), so that every design's explanation has failures of the
forward and of the backward to explain. Each failing (kernel, design) pair is explained three
ways, interleaved over ``--repeats`` rounds with a fresh emulation cache per case and mode:

* ``opinion``: ``complete=True, ablate=True`` (the confirmation and the replay; the shrink phase
  before 2026-12-05);
* ``complete``: ``complete=True, ablate=False`` (the fuzz phase before 2026-12-05);
* ``fuzz``: ``complete=False, ablate=False`` (the fuzz and shrink phases now).

It prints the median seconds per round of each mode, the ratios ``complete / fuzz`` and
``opinion / fuzz``, and checks that the three modes give the same signatures for every pair.
Timings are compared only with each other (ratios in one run), never with fixed numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

MODES = {"opinion": (True, True), "complete": (True, False), "fuzz": (False, False)}


def _cases(n: int, seed: int) -> list:
    from hypothesis import HealthCheck, given, seed as hseed, settings

    from fuzzer.registry import select
    from fuzzer.strategies import attention_cases, merge_capabilities

    backends = [b for b, _ in select(["torch-cpu-math", "torch-cpu-flash"])]
    caps = merge_capabilities([b.capabilities for b in backends])
    found: list = []

    @hseed(seed)
    @settings(max_examples=4 * n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(attention_cases(capabilities=caps, max_work=2**22))
    def draw(case) -> None:
        if len(found) >= n or case.dtype == "float32" or case.qkv_format == "thd":
            return
        try:
            case.check_resources()
        except Exception:
            return
        found.append(case)

    draw()
    return found


def _designs() -> dict:
    from fuzzer.registry import discover

    designs = {}
    for backend, _ in discover().values():
        design = getattr(backend, "design", None)
        if design is not None and design.claims:
            designs.setdefault(design.key, design)
    return designs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    from oracle.compare import PreparedReference, compare_outputs
    from oracle.emulate import emulate, explain_failure
    from oracle.inputs import make_inputs
    from oracle.reference import reference

    designs = list(_designs().values())
    work = []  # (case, inputs, reference, [(kernel tensors, verdict)])
    for case in _cases(args.cases, args.seed):
        inputs = make_inputs(case, device=args.device)
        ref = reference(case, inputs, backward=case.backward)
        prepared = PreparedReference(case, ref, inputs=inputs)
        kernels = []
        for design in designs:
            for planted in (None, "out_row", "dv_zero"):
                if planted == "dv_zero" and not case.backward:
                    continue
                tensors = emulate(case, inputs, design).tensors()
                if planted == "out_row":
                    tensors["out"] = tensors["out"].clone()
                    tensors["out"].view(-1)[: case.head_dim_v] += 1.0
                elif planted == "dv_zero":
                    tensors["dv"] = torch.zeros_like(tensors["dv"])
                verdict = compare_outputs(case, prepared, **tensors)
                if not verdict.passed:
                    kernels.append((design, tensors, verdict))
        work.append((case, inputs, ref, kernels))
    pairs = sum(len(k) * len(designs) for *_, k in work)
    seconds: dict[str, list[float]] = {m: [] for m in MODES}
    signatures: dict[str, list] = {m: [] for m in MODES}
    for r in range(args.repeats):
        for mode in (list(MODES) if r % 2 == 0 else list(reversed(MODES))):
            complete, ablate = MODES[mode]
            got = []
            t0 = time.perf_counter()
            for case, inputs, ref, kernels in work:
                prepared = PreparedReference(case, ref, inputs=inputs)  # a fresh emulation cache
                for _, tensors, verdict in kernels:
                    for design in designs:
                        e = explain_failure(case, prepared, tensors, verdict, design, ablate=ablate, complete=complete)
                        got.append(e.signatures)
            if args.device == "cuda":
                torch.cuda.synchronize()
            seconds[mode].append(time.perf_counter() - t0)
            signatures[mode] = got
    same = signatures["fuzz"] == signatures["complete"] == signatures["opinion"]
    med = {m: statistics.median(v) for m, v in seconds.items()}
    figures = {
        "device": args.device, "torch": torch.__version__, "cases": len(work), "explained_pairs": pairs,
        "repeats": args.repeats, "median_s": med,
        "complete_over_fuzz": med["complete"] / med["fuzz"], "opinion_over_fuzz": med["opinion"] / med["fuzz"],
        "same_signatures": same,
    }
    print(json.dumps(figures, indent=1))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
