"""Backends used by the fuzzer tests: real attention on the CPU with planted faults.

* `PlantedWindowBackend` ("planted-fa4"): correct attention, except that it resolves windows the
  way flash-attention after PR #2490 does: ``-1`` is a real bound, so the TE-style causal encoding
  ``causal=True, window_size=(-1, 0)`` gives an empty band: all-zero output and ``-inf`` lse.
* `CrashingBackend` ("standin-crash"): segfaults (a real SIGSEGV) when seqlen_q == 3.
* `TwoVariantCrashBackend` ("standin-crash-two"): variants ``first`` and ``second``, both
  segfault when seqlen_q == 3; ``first`` prints to stdout.
* `HangingBackend` ("standin-hang"): sleeps for an hour when seqlen_q == 5.
* `ChattyBackend` ("standin-chatty"): writes 24 MiB to its stdout and stderr when seqlen_q == 3.
* `SometimesCrashingBackend` ("standin-crash-some"): segfaults on one case in 16 (by case_id),
  whatever its shape: a backend that crashes now and then during a long run.
* `CorrectBackend` ("standin-ok"): correct attention everywhere.
* `CudaFatalBackend` ("standin-cuda-fatal"): raises the text of a CUDA illegal memory access when
  seqlen_q == 3 (the executor treats the child's context as poisoned: crash, restart).
* `MemoryHogBackend` ("standin-memhog"): when seqlen_q == 4, allocates host memory in 16 MiB
  blocks until it fails or is killed. A safety net keeps the machine safe: it first lowers its own
  ``RLIMIT_AS`` to its current size + ``$ATTNFUZZ_STANDIN_HOG_BYTES`` (default 1 GiB), so it ends
  with ``MemoryError`` unless the executor's memory limit kills it first.
* `GateBackend` ("standin-gate"): variants ``native`` (correct) and ``buggy`` (all-zero output on
  causal cases, NaN output on cases with a left window). With ``$ATTNFUZZ_GATE_DIR`` set, every
  call appends ``<case_id> <variant> <pid>`` to ``calls.log`` there, and a call whose case has a
  ``block-<case_id>`` file (or any call while ``block-all`` exists) first writes
  ``blocked-<case_id>`` and then waits until that block file is removed: the tests use it to kill a
  worker in the middle of a case, a shrink or a replay.
* `MarkerWaitBackend` ("standin-marker-wait", environment ``envA``) and `MarkerMakeBackend`
  ("standin-marker-make", environment ``envB``): correct attention. The maker first creates
  ``made-<case_id>`` in ``$ATTNFUZZ_MARKER_DIR``; the waiter first waits (bounded:
  ``$ATTNFUZZ_MARKER_WAIT_S`` seconds, default 20) for that file and says in
  ``output.extra["saw_marker"]`` whether it appeared: concurrency of two children shown without
  timing (run one after the other, the waiter, first, cannot see it).

All compute in float32 with PyTorch's math kernel and an explicit mask, so they are cheap.
"""

from __future__ import annotations

import ctypes
import math
import os
import resource
import time
from pathlib import Path

import torch

from fuzzer.backends.base import Backend, BackendOutput, Capabilities, run_with_grad

CAPS = Capabilities(
    dtypes=("float32",),
    qkv_formats=("bshd",),
    max_head_dim=64,
    windows=True,
    lse=True,
    max_seqlen=64,
)


# What the newer stand-ins accept: every dtype and dense layout (they compute in float32 on the
# canonical layout), so they run on most cases drawn next to the real CPU backends.
WIDE_CAPS = Capabilities(
    dtypes=("float32", "bfloat16", "float16"),
    qkv_formats=("bshd", "sbhd"),
    max_head_dim=256,
    head_dim_v_differs=True,
    windows=True,
    lse=True,
    max_seqlen=64,
)


def attention_with_band(q, k, v, scale, left, right, offset):
    """Attention over [b, s, h, d] tensors where row i sees keys j with
    i + offset - left <= j <= i + offset + right (None = unbounded). Returns (out, lse)."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    if hk != h:
        k = k.repeat_interleave(h // hk, dim=2)
        v = v.repeat_interleave(h // hk, dim=2)
    i = torch.arange(sq).unsqueeze(1)
    j = torch.arange(sk).unsqueeze(0)
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if right is not None:
        keep &= j <= i + offset + right
    if left is not None:
        keep &= j >= i + offset - left
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale
    scores = scores.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1).masked_fill(torch.isneginf(lse).unsqueeze(-1), 0.0))
    probs = probs.masked_fill(~keep, 0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v.float())
    return out.to(q.dtype), lse


def _resolve_like_fa4_after_2490(causal, window_left, window_right):
    """The post-#2490 resolver: widen only if BOTH bounds are negative, then apply causal."""
    if window_left is not None and window_right is not None and window_left < 0 and window_right < 0:
        window_left = window_right = None
    if causal:
        window_right = 0
    return window_left, window_right


class _Base(Backend):
    device = "cpu"
    capabilities = CAPS
    variants = ("native",)

    def _call(self, case, inputs, left, right):
        offset = case.seqlen_k - case.seqlen_q if case.causal_alignment == "bottom_right" else 0

        def fn(q, k, v):
            return attention_with_band(q, k, v, case.softmax_scale, left, right, offset)

        out, lse, dq, dk, dv = run_with_grad(fn, case, inputs)
        return BackendOutput(out=out, lse=lse, dq=dq, dk=dk, dv=dv)

    def _bounds(self, case):
        right = case.window_size_right
        if case.causal:
            right = 0 if right is None else min(right, 0)
        return case.window_size_left, right


class CorrectBackend(_Base):
    name = "standin-ok"
    environment = "standin"

    def run(self, case, inputs, variant):
        return self._call(case, inputs, *self._bounds(case))


class PlantedWindowBackend(_Base):
    """Variants: ``native`` (None = unbounded, causal flag) and ``te_window`` (-1 = unbounded, the
    causal mask sent as causal=True with window (-1, 0), as TransformerEngine does)."""

    name = "planted-fa4"
    environment = "planted"
    variants = ("native", "te_window")

    def run(self, case, inputs, variant):
        if variant == "native":
            return self._call(case, inputs, *self._bounds(case))
        # TE's encoding: -1 = unbounded; causal -> (-1, 0)
        left = -1 if case.window_size_left is None else case.window_size_left
        right = -1 if case.window_size_right is None else case.window_size_right
        if case.causal:
            right = 0
        left, right = _resolve_like_fa4_after_2490(case.causal, left, right)
        return self._call(case, inputs, left, right)


class CrashingBackend(_Base):
    name = "standin-crash"
    environment = "standin-crash"

    def run(self, case, inputs, variant):
        if case.seqlen_q == 3:
            ctypes.string_at(0)  # a real segmentation fault
        return self._call(case, inputs, *self._bounds(case))


class SometimesCrashingBackend(_Base):
    name = "standin-crash-some"
    environment = "standin-crash-some"
    capabilities = WIDE_CAPS

    def run(self, case, inputs, variant):
        if int(case.case_id, 16) % 16 == 0:
            ctypes.string_at(0)  # a real segmentation fault
        return self._call(case, inputs, *self._bounds(case))


class TwoVariantCrashBackend(_Base):
    """("standin-crash-two") variants ``first`` and ``second``: both segfault when seqlen_q ==
    3, and ``first`` prints a line to stdout on every call (a library that prints)."""

    name = "standin-crash-two"
    environment = "standin-crash-two"
    variants = ("first", "second")

    def run(self, case, inputs, variant):
        if variant == "first":
            print("standin-crash-two says hello on stdout", flush=True)
        if case.seqlen_q == 3:
            ctypes.string_at(0)  # a real segmentation fault
        return self._call(case, inputs, *self._bounds(case))


CHATTY_BYTES = 24 * 2**20
CHATTY_LAST_LINE = "standin-chatty: the last line"


class ChattyBackend(_Base):
    """("standin-chatty") when seqlen_q == 3, writes `CHATTY_BYTES` of numbered lines to fd 1 and
    fd 2 before it answers, ending with `CHATTY_LAST_LINE` on stderr: a library that prints
    without end (a child's log grew to 3.7 GB in 60 s so)."""

    name = "standin-chatty"
    environment = "standin-chatty"

    def run(self, case, inputs, variant):
        if case.seqlen_q == 3:
            block = b"".join(b"standin-chatty line %06d padding padding padding padding\n" % i for i in range(1024))
            for i in range(CHATTY_BYTES // len(block)):
                os.write(1 + i % 2, block)
            os.write(2, (CHATTY_LAST_LINE + "\n").encode())
        return self._call(case, inputs, *self._bounds(case))


class HangingBackend(_Base):
    name = "standin-hang"
    environment = "standin-hang"

    def run(self, case, inputs, variant):
        if case.seqlen_q == 5:
            time.sleep(3600)
        return self._call(case, inputs, *self._bounds(case))


class CudaFatalBackend(_Base):
    name = "standin-cuda-fatal"
    environment = "standin-cuda-fatal"

    def run(self, case, inputs, variant):
        if case.seqlen_q == 3:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return self._call(case, inputs, *self._bounds(case))


HOG_BLOCK_BYTES = 16 * 2**20


def _virtual_size_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


class MemoryHogBackend(_Base):
    name = "standin-memhog"
    environment = "standin-memhog"

    def run(self, case, inputs, variant):
        if case.seqlen_q == 4:
            headroom = int(os.environ.get("ATTNFUZZ_STANDIN_HOG_BYTES", str(2**30)))
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            resource.setrlimit(resource.RLIMIT_AS, (_virtual_size_bytes() + headroom, hard))
            blocks = []
            try:
                while True:
                    blocks.append(bytearray(HOG_BLOCK_BYTES))  # zero-filled: every page touched
            finally:
                blocks.clear()
                resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        return self._call(case, inputs, *self._bounds(case))


GATE_DIR_ENV = "ATTNFUZZ_GATE_DIR"
GATE_MAX_WAIT_S = 300.0


def _gate(case_id: str, variant: str) -> None:
    """Log the call; wait while a block file for it exists (see the module docstring)."""
    root = os.environ.get(GATE_DIR_ENV)
    if not root:
        return
    gate = Path(root)
    with open(gate / "calls.log", "a") as fh:
        fh.write(f"{case_id} {variant} {os.getpid()}\n")
    blocks = [gate / f"block-{case_id}", gate / "block-all"]
    if not any(b.exists() for b in blocks):
        return
    (gate / f"blocked-{case_id}").write_text(str(os.getpid()))
    deadline = time.monotonic() + GATE_MAX_WAIT_S
    while any(b.exists() for b in blocks) and time.monotonic() < deadline:
        time.sleep(0.05)  # this is the injected fault (a stuck kernel), not a test's synchronisation


class GateBackend(_Base):
    name = "standin-gate"
    environment = "standin-gate"
    capabilities = WIDE_CAPS
    variants = ("native", "buggy")

    def run(self, case, inputs, variant):
        _gate(case.case_id, variant)
        output = self._call(case, inputs, *self._bounds(case))
        if variant == "buggy" and case.causal:
            output.out.zero_()
        elif variant == "buggy" and case.window_size_left is not None:
            output.out.fill_(math.nan)
        return output


MARKER_DIR_ENV = "ATTNFUZZ_MARKER_DIR"
MARKER_WAIT_ENV = "ATTNFUZZ_MARKER_WAIT_S"


def marker_path(case_id: str) -> Path:
    """``$ATTNFUZZ_MARKER_DIR/made-<case_id>``: the file `MarkerMakeBackend` creates."""
    return Path(os.environ[MARKER_DIR_ENV]) / f"made-{case_id}"


class MarkerWaitBackend(_Base):
    name = "standin-marker-wait"
    environment = "envA"

    def run(self, case, inputs, variant):
        marker = marker_path(case.case_id)
        deadline = time.monotonic() + float(os.environ.get(MARKER_WAIT_ENV, "20"))
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)  # waits for the other child's file: the proof of concurrency, not a timing
        output = self._call(case, inputs, *self._bounds(case))
        output.extra["saw_marker"] = marker.exists()
        return output


class MarkerMakeBackend(_Base):
    name = "standin-marker-make"
    environment = "envB"

    def run(self, case, inputs, variant):
        marker_path(case.case_id).write_text(str(os.getpid()))
        return self._call(case, inputs, *self._bounds(case))


class StartWaitBackend(CorrectBackend):
    """Environment ``envA``: its `availability` (asked once, when its child starts) waits, bounded
    by ``$ATTNFUZZ_MARKER_WAIT_S`` seconds (default 20), for ``started-envB`` in
    ``$ATTNFUZZ_MARKER_DIR``, which `StartMakeBackend`'s child writes at its start; it reports
    "saw envB start" or "envB had not started" as its (un)availability reason, so a test sees
    whether the two children started side by side."""

    name = "standin-start-wait"
    environment = "envA"

    def availability(self):
        marker = Path(os.environ[MARKER_DIR_ENV]) / "started-envB"
        deadline = time.monotonic() + float(os.environ.get(MARKER_WAIT_ENV, "20"))
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return "saw envB start" if marker.exists() else "envB had not started"


class StartMakeBackend(CorrectBackend):
    """Environment ``envB``: writes ``started-envB`` in ``$ATTNFUZZ_MARKER_DIR`` when asked for
    its availability (at its child's start); available."""

    name = "standin-start-make"
    environment = "envB"

    def availability(self):
        (Path(os.environ[MARKER_DIR_ENV]) / "started-envB").write_text(str(os.getpid()))
        return None


class MLIRError(RuntimeError):
    """Named as CuTe DSL's compile failure (the exception type is what attnfuzz sees)."""


class FailingCompileJitBackend(_Base):
    """("standin-jit-compile-fails") a JIT backend whose kernel does not build for head_dim 8: every
    call at that head dim raises `MLIRError`, as FA4 4.0.0b36 did at head_dim 112 on the H200; a
    ``ValueError`` (not a compile failure) at head_dim 24."""

    name = "standin-jit-compile-fails"
    environment = "standin-jit-compile-fails"
    jit_compiled = True

    def run(self, case, inputs, variant):
        if case.head_dim == 8:
            raise MLIRError("failed to partition input with tiled_mma")
        if case.head_dim == 24:
            raise ValueError("a refusal that may depend on the lengths")
        return self._call(case, inputs, *self._bounds(case))
