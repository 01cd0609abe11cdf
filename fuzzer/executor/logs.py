"""A child's stdout and stderr: a pipe to a log file its worker keeps bounded (`ChildLog`), whose
last lines a crash or a hang reports.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from typing import Any

_STDERR_TAIL_LINES = 30


LOG_MAX_BYTES = 4 * 2**20
"""A child's log (its stderr and stdout, `ChildLog`) is kept under about this many bytes (plus
`LOG_KEEP_BYTES`): a plugin's child printing in a loop wrote 3.7 GB in 60 s (2026-12-03)."""
LOG_KEEP_BYTES = 64 * 2**10
"""When a child's log passes `LOG_MAX_BYTES` it starts again from its last this many bytes (the
tail is what a crash or a hang reports)."""
_LOG_CHUNK_BYTES = 65536


class ChildLog:
    """A child process's stderr and stdout, kept in the file ``path`` by this process, bounded.

    The child writes into a pipe (`child_end`, handed to the child with its other arguments and
    given to `log_output_to` there) and a thread of this process copies what comes to the file.
    Past ``max_bytes`` the file starts again with its last ``keep_bytes`` (from a line start),
    after a line saying how many bytes were dropped in all (`dropped_bytes`): a child printing
    without end costs at most about ``max_bytes + keep_bytes`` of disk, and its last lines are
    always there. What a child wrote before it died is still in the pipe and reaches the file
    (`tail` waits for it). Why not the file itself as the child's stderr, as before: nothing could
    bound a file a child appends to without losing its tail or racing its writes.

    Args:
        path: the log file (created when missing, appended to).
        max_bytes: the bound, bytes (> ``keep_bytes``).
        keep_bytes: what is kept when the bound is passed, bytes (>= 0).

    Raises:
        ValueError: ``keep_bytes`` is negative or not below ``max_bytes``.
    """

    def __init__(self, path: str, *, max_bytes: int = LOG_MAX_BYTES, keep_bytes: int = LOG_KEEP_BYTES):
        from multiprocessing.connection import Connection

        if not 0 <= keep_bytes < max_bytes:
            raise ValueError(f"keep_bytes must be >= 0 and below max_bytes ({max_bytes}), got {keep_bytes}")
        self.path = path
        self.max_bytes = max_bytes
        self.keep_bytes = keep_bytes
        self.dropped_bytes = 0
        self._note_bytes = 0  # the note at the file's start after a restart (not the child's bytes)
        self._file = open(path, "ab")
        self._size = self._file.tell()
        self._read_fd, write_fd = os.pipe()
        #: the pipe's write end, for the child (a `multiprocessing` connection: it can be passed
        #: to a ``spawn`` child among the process's arguments)
        self.child_end = Connection(write_fd, readable=False)
        self._read_bytes = 0  # taken from the pipe so far
        self._written_bytes = 0  # of those, in the file (or dropped)
        self._thread = threading.Thread(target=self._pump, name="attnfuzz-child-log", daemon=True)
        self._thread.start()

    def started(self) -> None:
        """Close this process's copy of the pipe's write end, once the child was started with it:
        the copying then ends when the child (and whatever it started that keeps its stderr)
        has ended."""
        self.child_end.close()

    def _pump(self) -> None:
        try:
            while True:
                try:
                    chunk = os.read(self._read_fd, _LOG_CHUNK_BYTES)
                except OSError:
                    break
                self._read_bytes += len(chunk)
                if not chunk:
                    break
                self._write(chunk)
                self._written_bytes += len(chunk)
        finally:
            os.close(self._read_fd)
            self._file.close()

    def _write(self, chunk: bytes) -> None:
        try:
            self._file.write(chunk)
            self._file.flush()
            self._size += len(chunk)
            if self._size > self.max_bytes:
                self._restart()
        except OSError:  # a full disk, the directory removed: the log is best effort
            pass

    def _restart(self) -> None:
        """Start the file again from its last ``keep_bytes`` (from a line start), after a line
        saying how much was dropped."""
        with open(self.path, "rb") as fh:
            fh.seek(max(self._size - self.keep_bytes, self._note_bytes))  # the child's bytes, not an earlier note
            kept = fh.read()
        newline = kept.find(b"\n")
        if 0 <= newline < len(kept) - 1:
            kept = kept[newline + 1 :]
        self.dropped_bytes += self._size - self._note_bytes - len(kept)
        note = (
            f"[attnfuzz: {self.dropped_bytes} bytes of this log dropped in all, to keep it under "
            f"{self.max_bytes} bytes; its last part follows]\n"
        ).encode()
        self._file.seek(0)
        self._file.truncate()
        self._file.write(note + kept)
        self._file.flush()
        self._size = len(note) + len(kept)
        self._note_bytes = len(note)

    def _pending(self) -> int:
        """Bytes in the pipe not read yet (0 when the pipe is closed)."""
        import fcntl
        import struct
        import termios

        try:
            return struct.unpack("i", fcntl.ioctl(self._read_fd, termios.FIONREAD, b"\0\0\0\0"))[0]
        except OSError:
            return 0

    def settle(self, timeout_s: float = 2.0, *, ended: bool = False) -> None:
        """Wait (at most ``timeout_s`` seconds) until what the child wrote so far is in the file.

        Args:
            timeout_s: the bound, seconds.
            ended: the child has ended: wait for the pipe's end (exact); else for the bytes
                in the pipe now (to within one chunk being copied as this is called).
        """
        if ended:
            self._thread.join(timeout_s)
            return
        if not self._thread.is_alive():
            return
        target = self._read_bytes + self._pending()
        if self._written_bytes >= target:
            return
        deadline = time.monotonic() + timeout_s
        while self._written_bytes < target and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)  # the copying thread is one write away

    def tail(self, lines: int = _STDERR_TAIL_LINES, *, ended: bool = False) -> str:
        """The last ``lines`` lines of the log, once `settle` d (``ended``: as there)."""
        self.settle(ended=ended)
        return _tail(self.path, lines)


def log_output_to(log: Any) -> None:
    """Send this process's stderr (fd 2 and ``sys.stderr``, line-buffered) and its stdout (fd 1
    and ``sys.stdout``) into ``log``, the write end of its parent's `ChildLog`
    (`ChildLog.child_end`, a connection), which is closed here: what the parent reads back as the
    stderr tail of a crash or a hang. Stdout too: a library that prints (FA4's CuTe DSL prints
    launch errors to fd 1) must not write into the worker's own stdout, which ``attnfuzz fuzz
    --json`` keeps for its JSON (on the H200, 2026-12-01, FA4's messages came before the JSON
    document)."""
    fd = log.fileno()
    os.dup2(fd, 2)
    os.dup2(fd, 1)
    log.close()
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)


def _tail(path: str, lines: int = _STDERR_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 16384))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(deque(text.splitlines(), maxlen=lines))
