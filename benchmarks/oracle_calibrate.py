"""Measure the error ratios of real and emulated kernels with every tolerance factor set to 1.

Usage::

    python benchmarks/oracle_calibrate.py [--cases 2000] [--seed 3] [--max-seqlen 1024] [--json OUT]

Draws random cases (`oracle.calibration.random_case`), runs PyTorch SDPA (math and CPU flash) and
the FlashAttention-2 emulation on CPU, and prints per dtype, kernel and tensor the largest
``err_backend / err_baseline`` observed, next to the factor in `oracle.compare.TOLERANCE_FACTORS`
(the margin is factor / observed). The figures recorded in `oracle.compare`'s docstring come from
this script.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from oracle.calibration import calibrate  # noqa: E402
from oracle.compare import TENSOR_NAMES, TOLERANCE_FACTORS  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--max-seqlen", type=int, default=1024)
    parser.add_argument("--json", help="write the table to this file")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")  # SDPA explains at length why a kernel was not chosen
    start = time.perf_counter()
    table = calibrate(args.cases, seed=args.seed, max_seqlen=args.max_seqlen)
    elapsed = time.perf_counter() - start
    lines = [f"{args.cases} cases, seed {args.seed}, max_seqlen {args.max_seqlen}, {elapsed:.0f} s",
             f"{'dtype':10} {'kernel':14} " + " ".join(f"{name:>16}" for name in TENSOR_NAMES)]
    for dtype in TOLERANCE_FACTORS:
        for kernel in sorted({key[0] for key in table}):
            cells = []
            for name in TENSOR_NAMES:
                entry = table.get((kernel, dtype, name))
                cells.append(f"{entry['max_ratio']:7.3f} ({entry['cases']:4d})" if entry else f"{'-':>16}")
            lines.append(f"{dtype:10} {kernel:14} " + " ".join(f"{cell:>16}" for cell in cells))
        factors = " ".join(f"{TOLERANCE_FACTORS[dtype][name]:>16g}" for name in TENSOR_NAMES)
        lines.append(f"{dtype:10} {'factor':14} {factors}")
    sys.stdout.write("\n".join(lines) + "\n")
    if args.json:
        rows = [{"kernel": k, "dtype": d, "tensor": t, **v} for (k, d, t), v in sorted(table.items())]
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
