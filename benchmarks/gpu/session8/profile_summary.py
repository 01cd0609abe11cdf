"""Summarise the cProfile files of a profiled campaign (the worker's and each child's,
``ATTNFUZZ_PROFILE_DIR``): per file, the top functions by cumulative and by own time.

Usage: ``python profile_summary.py PROFILE_DIR > summary.txt``
"""

from __future__ import annotations

import io
import pstats
import sys
from pathlib import Path


def main(directory: str) -> None:
    for path in sorted(Path(directory).glob("*.prof")):
        for key, n in (("cumulative", 45), ("tottime", 30)):
            buf = io.StringIO()
            try:
                stats = pstats.Stats(str(path), stream=buf)
            except Exception as exc:  # noqa: BLE001 - a truncated file: say so, go on
                print(f"== {path.name}: unreadable ({exc})")
                break
            stats.strip_dirs().sort_stats(key).print_stats(n)
            print(f"== {path.name} by {key}")
            print("\n".join(line for line in buf.getvalue().splitlines() if line.strip())[:12000])


if __name__ == "__main__":
    main(sys.argv[1])
