"""Where a fuzz worker's main thread spends its samples, by step, from a py-spy raw profile.

Usage::

    py-spy record -r 200 -f raw -o raw.txt -- attnfuzz fuzz --time-budget 20 --corpus '' --no-shrink
    python benchmarks/pyspy_split.py raw.txt [--cases N] [--rate 200]

Only the stacks under ``Worker.run`` count (imports and other threads are left out). Each stack
goes to the first step whose frame it holds, in the order of `STEPS` (so the storage inside a
case's evaluation counts as storage, not evaluation). With ``--cases`` (the run's case count) and
``--rate`` (py-spy's samples per second) it also prints milliseconds per case. py-spy counts a
thread blocked in C with the GIL released (a GPU synchronisation, a pipe wait) as busy unless
``--idle`` detection sees it, so "waiting for the child" rows are waits, not work.
"""

from __future__ import annotations

import argparse
import collections

STEPS = (
    ("storage", "Worker._record"),
    ("late results", "Background.collect_late"),
    ("shrinking", "Shrinker.drain"),
    ("inputs", "Evaluator._inputs"),
    ("comparison preparation", "PreparedReference.__init__"),
    ("oracle", "reference (oracle/reference.py"),
    ("judging", "Evaluator._judge_outcomes"),
    ("waiting for the child", "_ChildRun.result"),
    ("waiting for the child (lanes)", "_ChildRun.partial"),
    ("submitting", "submit_run"),
    ("drawing", "ConjectureData.draw"),
    ("evaluation, other", "Evaluator.evaluate"),
    ("worker step, other", "Worker.evaluate"),
    ("Hypothesis engine and loop", "Worker._run_chunk"),
)


def split(path: str) -> tuple[collections.Counter, int]:
    """``(samples by step, samples under Worker.run)`` of the py-spy raw file ``path``."""
    counts: collections.Counter = collections.Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if "Worker.run" not in stack or not n.isdigit():
                continue
            total += int(n)
            for step, frame in STEPS:
                if frame in stack:
                    counts[step] += int(n)
                    break
            else:
                counts["other"] += int(n)
    return counts, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("raw")
    parser.add_argument("--cases", type=int, default=0, help="the run's case count, for ms per case")
    parser.add_argument("--rate", type=float, default=200.0, help="py-spy's samples per second")
    args = parser.parse_args()
    counts, total = split(args.raw)
    print(f"{total} samples under Worker.run")
    for step, n in counts.most_common():
        per_case = f"  {n / args.rate / args.cases * 1000:6.2f} ms/case" if args.cases else ""
        print(f"{step:32s} {n:7d} {n / total * 100 if total else 0:5.1f}%{per_case}")


if __name__ == "__main__":
    main()
