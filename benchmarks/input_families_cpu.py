"""Short CPU campaigns, one per input family, over the real CPU backends: false failures?

For each family (`oracle.inputs`), a worker fuzzes ``torch-cpu-math`` and ``torch-cpu-flash``
(in-process, no shrinking) with every drawn case forced into that family (the family's own
parameters, and the input distributions it goes with, drawn as `fuzzer.strategies.input_specs`
draws them; everything else as usual), and
prints the cases, the results by status and every failure bucket with its worst error ratio.
``default`` is the unforced draw (every family mixed, as `attnfuzz fuzz` draws them).
Both backends are PyTorch's own kernels, so a failure is either a real PyTorch CPU defect or a
false failure of the oracle / error model: each one has to be looked at.

    .venv/bin/python benchmarks/input_families_cpu.py [--cases 40] [--family score_offset ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import strategies as st  # noqa: E402

import fuzzer.strategies as strategies  # noqa: E402
from fuzzer import registry  # noqa: E402
from fuzzer.sinks import MemorySink  # noqa: E402
from fuzzer.worker import Worker, WorkerConfig  # noqa: E402
from oracle.config import INPUT_DISTRIBUTIONS, MAX_SCORE_OFFSET, MAX_SEQ_SCALE_LOG2, SCORE_OFFSET_MODES  # noqa: E402


def _family(draw, name: str, head_dim: int) -> dict:
    if name == "score_offset":
        offset = draw(st.one_of(st.sampled_from(strategies.SCORE_OFFSETS), st.floats(-MAX_SCORE_OFFSET, MAX_SCORE_OFFSET)))
        return {"score_offset": offset, "score_offset_mode": draw(st.sampled_from(SCORE_OFFSET_MODES))}
    if name == "qk_rank":
        return {"qk_rank": draw(st.integers(1, min(8, head_dim)))}
    if name == "massive_channels":
        return {"massive_channels": draw(st.integers(1, min(4, head_dim)))}
    if name == "attention_sink":
        return {"attention_sink": True}
    if name == "seq_scale_log2":
        return {"seq_scale_log2": draw(st.integers(1, MAX_SEQ_SCALE_LOG2))}
    if name == "peaked_rows":
        return {"peaked_rows": draw(st.sampled_from([0.125, 0.5, 1.0]))}
    if name.startswith("dout_"):
        return {"dout_distribution": name[len("dout_"):]}
    raise SystemExit(f"unknown family {name!r}")


FAMILIES = ("default", "score_offset", "qk_rank", "massive_channels", "attention_sink", "seq_scale_log2", "peaked_rows",
            "dout_tiny", "dout_large", "dout_sparse")


def forced(name: str):
    @st.composite
    def specs(draw, *, head_dim: int, backward: bool = True, dtype: str = "bfloat16") -> dict:
        if name == "massive_channels" and dtype == "float32":  # as input_specs: not drawn in fp32
            return {"input_distribution": "normal"}
        # as `input_specs` draws them: LLM-like features on normal inputs only
        llm_like = name not in ("score_offset",) and not name.startswith("dout_")
        distributions = INPUT_DISTRIBUTIONS[:1] if llm_like else INPUT_DISTRIBUTIONS
        return {"input_distribution": draw(st.sampled_from(distributions)), **_family(draw, name, head_dim)}

    return specs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--family", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-work", type=int, default=2**20)
    args = parser.parse_args()
    original = strategies.input_specs
    try:
        for name in args.family:
            strategies.input_specs = original if name == "default" else forced(name)
            sink = MemorySink()
            config = WorkerConfig(
                backends=registry.select(["torch-cpu-math", "torch-cpu-flash"]), max_cases=args.cases,
                time_budget_s=None, seed=args.seed, shrink=False, isolation="none", max_work=args.max_work,
                replay_known=False,
            )
            start = time.perf_counter()
            stats = Worker(config, sink).run()
            statuses = Counter(r.status for r in sink.results.values())
            worst = {}
            for r in sink.results.values():
                if r.status == "fail":
                    key = (r.backend, r.variant, r.signature)
                    worst[key] = max(worst.get(key, 0.0), r.error_ratio or float("inf"))
            print(f"{name:18s} cases={stats.cases:4d} {dict(statuses)} {time.perf_counter() - start:6.1f}s")
            for key, ratio in sorted(worst.items()):
                print(f"    FAIL {key} worst error ratio {ratio:.3g}")
    finally:
        strategies.input_specs = original


if __name__ == "__main__":
    main()
