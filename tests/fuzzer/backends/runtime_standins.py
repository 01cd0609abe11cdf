"""Stand-in backends for the runtime-attribution tests (one cuDNN per process, issue 15).

They run on the CPU with `tests.fuzzer.standins.CorrectBackend`'s correct attention and report,
through `Backend.runtime_versions`, what their child process sees:

* `ReportingBackend` ("standin-runtime"): a stand-in version query (``cudnn`` = ``9.19.0``, or
  the ``VERSION`` file beside the first ``LD_LIBRARY_PATH`` entry: a fake cuDNN build's) and
  the variables the executor must have set before the child started: the first
  ``LD_LIBRARY_PATH`` entry, ``CUDNN_PATH`` and FA4's compile-cache variables (it is
  ``jit_compiled``).
* `TwoCudnnBackend` ("standin-two-cudnn"): its ``availability`` maps two *real* files named
  ``libcudnn.so.9`` from the two directories of ``$ATTNFUZZ_TEST_TWO_CUDNN`` (``dir1:dir2``; each
  is a copy of a small shared object), so ``/proc/self/maps`` genuinely holds two cuDNN builds.
* `LazyCudnnBackend` ("standin-lazy-cudnn"): maps one such file during its first ``run`` (a
  library loaded lazily by a kernel call), which the child must report with that outcome.
"""

from __future__ import annotations

import ctypes
import os

from fuzzer.environment import FA4_CACHE_DIR_ENV, FA4_CACHE_ENABLED_ENV
from tests.fuzzer.standins import CorrectBackend

TWO_CUDNN_ENV = "ATTNFUZZ_TEST_TWO_CUDNN"


class ReportingBackend(CorrectBackend):
    name = "standin-runtime"
    environment = "standin-runtime"
    jit_compiled = True

    def runtime_versions(self) -> dict[str, str]:
        first = os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)[0]
        version_file = os.path.join(first, "VERSION") if first else ""
        version = "9.19.0"  # a stand-in for cudnnGetVersion: a fake cuDNN build says its own
        if version_file and os.path.isfile(version_file):
            with open(version_file) as fh:
                version = fh.read().strip()
        return {
            "cudnn": version,
            "ld_library_path_first": os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)[0],
            "cudnn_path": os.environ.get("CUDNN_PATH", ""),
            "fa4_cache_enabled": os.environ.get(FA4_CACHE_ENABLED_ENV, ""),
            "fa4_cache_dir": os.environ.get(FA4_CACHE_DIR_ENV, ""),
        }


class TwoCudnnBackend(CorrectBackend):
    name = "standin-two-cudnn"
    environment = "standin-two-cudnn"

    def availability(self) -> str | None:
        for directory in os.environ[TWO_CUDNN_ENV].split(os.pathsep):
            ctypes.CDLL(os.path.join(directory, "libcudnn.so.9"))
        return None


class LazyCudnnBackend(CorrectBackend):
    name = "standin-lazy-cudnn"
    environment = "standin-lazy-cudnn"
    watch_runtime_libraries = True  # a CPU stand-in: ask the child to watch its map as for CUDA

    def run(self, case, inputs, variant):
        ctypes.CDLL(os.path.join(os.environ[TWO_CUDNN_ENV].split(os.pathsep)[0], "libcudnn.so.9"))
        return super().run(case, inputs, variant)
