"""The worker's side of one backend child process: its process, the worker's end of its pipe
and its log, and how the worker waits on it, reads how it died and ends it.

A child that dies (segfault, abort, a CUDA fatal error that poisons its context) turns the
backend call in flight into a ``crash`` outcome with the last lines of the child's stderr
(`ChildHandle.death_outcome`); a SIGKILL that the executor did not send (the kernel's OOM killer)
is ``oom``, as is a child whose resident memory passes the executor's limit while it runs
(`ChildHandle.wait`).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from fuzzer.executor.logs import ChildLog
from fuzzer.executor.outcome import ExecutorError, TaskOutcome
from fuzzer.executor.processes import kill_tree, resident_bytes


@dataclass
class ChildHandle:
    """One backend child process, as its worker holds it.

    Attributes:
        process: the ``spawn`` `multiprocessing.Process` (running `fuzzer.executor.child.child_main`).
        conn: the worker's end of the duplex pipe (protocol: `fuzzer.executor.child`).
        log: the child's stdout and stderr (`ChildLog`).
        availability: ``{backend name: None or reason}``, as the child's ``ready`` message said.
        runtime: ``{backend name: runtime report}`` of the ``ready`` message
            (`fuzzer.executor.child.child_runtime`); None when it carried none.
    """

    process: Any
    conn: Any
    log: ChildLog
    availability: dict[str, str | None] = field(default_factory=dict)
    runtime: dict[str, dict[str, str]] | None = None

    @property
    def log_path(self) -> str:
        return self.log.path

    def tail(self) -> str:
        """The last lines of its log (`ChildLog.tail`; exact once it has ended)."""
        return self.log.tail(ended=not self.process.is_alive())

    def await_ready(self, environment: str, start_timeout_s: float) -> ChildHandle:
        """Wait for the child's ``ready`` message and keep its availability and runtime report.

        Args:
            environment: the child's environment (for the error message).
            start_timeout_s: seconds the child may take to import its libraries and report ready.

        Returns:
            This handle.

        Raises:
            ExecutorError: no message within ``start_timeout_s`` (the child and what it started
                are killed) or the child died first; the message carries the log's tail.
        """
        if not self.conn.poll(start_timeout_s):
            kill_tree(self.process.pid)
            self.process.join(10)
            raise ExecutorError(f"child for environment {environment!r} did not start: {self.log.tail(ended=True)}")
        try:
            message = self.conn.recv()
        except EOFError as exc:
            self.process.join(10)
            raise ExecutorError(f"child for environment {environment!r} died at start: {self.log.tail(ended=True)}") from exc
        self.availability = message[1]
        self.runtime = message[2] if len(message) > 2 else None
        return self

    def wait(self, timeout_s: float, memory_limit_bytes: int | None, memory_poll_s: float) -> tuple[bool, int | None]:
        """Wait up to ``timeout_s`` seconds for a message from the child.

        Args:
            timeout_s: the bound, seconds.
            memory_limit_bytes: the child's resident memory limit, bytes (read from ``/proc``
                every ``memory_poll_s`` seconds); None: not watched.
            memory_poll_s: how often the memory is read, seconds.

        Returns:
            ``(ready, None)``, or ``(False, rss)`` as soon as the child's resident memory
            ``rss`` (bytes) passes ``memory_limit_bytes``.
        """
        if memory_limit_bytes is None:
            return self.conn.poll(timeout_s), None
        deadline = time.monotonic() + timeout_s
        while True:
            rss = resident_bytes(self.process.pid)
            if rss is not None and rss > memory_limit_bytes:
                return False, rss
            left = deadline - time.monotonic()
            if self.conn.poll(max(min(memory_poll_s, left), 0.0)):
                return True, None
            if left <= 0:
                return False, None

    def death_outcome(self, name: str, variant: str) -> TaskOutcome:
        """The outcome of the task ``(name, variant)`` the child was running when its pipe closed:
        ``oom`` for a SIGKILL (the executor's own kills are recorded before), ``crash`` for
        another signal or an exit; ``detail`` ends with the log's tail."""
        code = self.process.exitcode
        tail = self.tail()
        if code is not None and code < 0:
            sig = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            if code == -signal.SIGKILL:
                return TaskOutcome(name, variant, "oom", detail=f"child killed by SIGKILL (likely out of memory)\n{tail}")
            return TaskOutcome(name, variant, "crash", detail=f"child died with signal {sig}\n{tail}")
        return TaskOutcome(name, variant, "crash", detail=f"child exited with code {code}\n{tail}")

    def end(self) -> None:
        """Kill the child (a dead or stuck environment child, or a spare never used) with what it
        started, a detached process included, and close its pipe."""
        if self.process.is_alive():
            kill_tree(self.process.pid)
        self.process.join(10)
        self.conn.close()


def new_log_path(log_dir: str, environment: str) -> str:
    """A log file name of its own for a new child of ``environment``:
    ``<log_dir>/<environment>.<n>.log``, created here (exclusively) so that no other start, of
    this executor or another sharing ``log_dir``, takes the same name. ``log_dir`` is created
    when missing (removed by a close: a child started after it)."""
    os.makedirs(log_dir, exist_ok=True)
    n = len(os.listdir(log_dir))
    while True:
        log_path = os.path.join(log_dir, f"{environment}.{n}.log")
        try:
            os.close(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            return log_path
        except FileExistsError:
            n += 1
