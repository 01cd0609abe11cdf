"""The size of drawn cases on CPU: the strategies of commit 992da02 (each length bounded by
``sqrt(max_work / (batch * heads * head_dim))``) and of this tree (`fuzzer.strategies`: the
product budget, decode-like shapes, `CPU_BOUNDS`), drawn side by side in one run.

For each it prints the modelled mean cost of a case on the CPU, the 90th percentile and the
largest, and how many cases are decode-like with a long row (``seqlen_q <= 16``, ``seqlen_k >
1024``). The model: 0.35 us per input element generated (q, k, v, out/dout) plus 8 ns per
multiply-add (oracle and backends), both measured with `oracle.inputs.make_inputs` and
`oracle.reference.reference` on the 2-core CI machine (one torch thread); it ranks strategies,
it does not time them. Draws are derandomised (the same cases every run).

    .venv/bin/python benchmarks/draw_cost.py [--examples 1500] [--old-commit 992da02]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fuzzer import registry  # noqa: E402
from fuzzer import strategies as new  # noqa: E402
from fuzzer.backends.base import Capabilities  # noqa: E402

US_PER_ELEMENT = 0.35
NS_PER_MAC = 8.0


def cost_s(case) -> float:
    """Modelled CPU seconds of one case (see the module docstring)."""
    dims = case.head_dim + case.head_dim_v
    elements = case.batch_size * (case.seqlen_q * case.num_heads + case.seqlen_k * case.num_heads_kv) * dims
    work = case.batch_size * case.num_heads * case.seqlen_q * case.seqlen_k * max(case.head_dim, case.head_dim_v)
    return US_PER_ELEMENT * 1e-6 * elements + NS_PER_MAC * 1e-9 * work


def sample(strategy, n: int) -> list:
    cases = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(case):
        cases.append(case)

    collect()
    return cases


def line(name: str, cases: list) -> float:
    costs = sorted(cost_s(c) for c in cases)
    long_rows = sum(1 for c in cases if c.seqlen_q <= 16 and c.seqlen_k > 1024)
    mean = statistics.mean(costs)
    print(f"{name:44s} mean {mean * 1e3:6.1f} ms  p90 {costs[int(0.9 * len(costs))] * 1e3:6.1f} ms  "
          f"max {costs[-1] * 1e3:6.0f} ms  long-row decode {long_rows}/{len(cases)}")
    return mean


def load_old(commit: str):
    text = subprocess.run(["git", "show", f"{commit}:fuzzer/strategies.py"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "old_strategies.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("old_strategies", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_strategies"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1500)
    parser.add_argument("--old-commit", default="992da02")
    args = parser.parse_args()
    old = load_old(args.old_commit)
    found = registry.discover()
    cpu = new.merge_capabilities([found[n][0].capabilities for n in ("torch-cpu-math", "torch-cpu-flash")])
    plugin = Capabilities(dtypes=("float32", "bfloat16", "float16"), qkv_formats=("bshd", "sbhd"),
                          head_dim_v_differs=True, windows=True, lse=True)  # default max_seqlen 4096
    common = dict(max_batch_size=2, max_heads_kv=4)  # the worker's defaults
    b = new.CPU_BOUNDS
    for label, caps in (("CPU backends", cpu), ("plugin, max_seqlen 4096", plugin)):
        before = line(f"{args.old_commit} {label} (max_work 2**24)",
                      sample(old.attention_cases(capabilities=caps, max_work=2**24, **common), args.examples))
        after = line(f"this tree {label} (CPU_BOUNDS)",
                     sample(new.attention_cases(capabilities=caps, max_work=b.max_work, max_elements=b.max_elements,
                                                **common), args.examples))
        print(f"{'':44s} ratio of mean cost (this tree / {args.old_commit}): {after / before:.2f}")


if __name__ == "__main__":
    main()
