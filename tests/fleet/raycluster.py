"""A Ray cluster of several nodes on this machine, for the fleet tests and benchmarks.

``LocalRayCluster(root, cpus=[0, 4, 4]).start()`` runs ``ray start --head`` and one ``ray start
--address`` per further node, each with its own ports (free ones, picked here) and logical CPU
count; every process a node starts (its raylet, agents and the Ray workers the raylet forks, and
what those start) carries ``ATTNFUZZ_RAY_NODE_TAG=<tag>`` in its environment, so `node_processes`
finds them in ``/proc`` and `kill_node` can ``kill -9`` one node's processes as a lost machine
would. `stop` kills every node's processes (``ray stop`` would stop every Ray cluster of the
user on the machine) and removes the cluster's temp dir (a short one under /tmp: Ray's socket
paths must fit in 107 bytes).

Raises `RayUnavailable` (with the reason) where the ``ray`` command is missing or a node does not
start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

NODE_TAG_ENV = "ATTNFUZZ_RAY_NODE_TAG"


class RayUnavailable(RuntimeError):
    """Ray cannot be started here (not installed, or a node did not come up): why."""


def _free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 now."""
    sockets, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in sockets:
            s.close()
    return ports


def _environ_has(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return needle in fh.read().split(b"\0")
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


@dataclass
class LocalRayCluster:
    """Nodes of one Ray cluster on this machine. ``cpus``: the logical CPUs of each node, the
    head's first (0: the head runs no worker actor, so every actor is on a node that may be
    killed)."""

    root: Path
    cpus: list[int] = field(default_factory=lambda: [0, 4, 4])
    ray: str = ""
    address: str = ""
    tags: list[str] = field(default_factory=list)
    temp_dir: str = ""

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        # Ray's sockets live under its temp dir, and a socket path has at most 107 bytes: a short one
        self.temp_dir = self.temp_dir or tempfile.mkdtemp(prefix="afray-", dir="/tmp")
        self.ray = self.ray or shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray") or ""

    def _env(self, tag: str) -> dict[str, str]:
        # token authentication off: a token file another Ray run left in ~/.ray would otherwise make the head
        # ask for it and the nodes of this cluster not present it
        return {**os.environ, NODE_TAG_ENV: tag, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}

    def _start_node(self, index: int, head: bool) -> None:
        tag = f"{self.root.name}-node{index}"
        ports = _free_ports(9)
        args = [self.ray, "start", f"--num-cpus={self.cpus[index]}", "--num-gpus=0",
                f"--node-manager-port={ports[0]}", f"--object-manager-port={ports[1]}",
                "--min-worker-port=0", "--max-worker-port=0",
                f"--dashboard-agent-listen-port={ports[3]}", f"--dashboard-agent-grpc-port={ports[4]}",
                f"--metrics-export-port={ports[5]}", f"--runtime-env-agent-port={ports[6]}",
                "--object-store-memory=100000000", "--disable-usage-stats"]
        if head:
            args += ["--head", f"--port={ports[7]}", "--node-ip-address=127.0.0.1", f"--dashboard-port={ports[8]}",
                     "--include-dashboard=true", f"--temp-dir={self.temp_dir}"]
            self.address = f"127.0.0.1:{ports[7]}"
        else:
            args += [f"--address={self.address}", "--node-ip-address=127.0.0.1"]
        log = self.root / f"ray-start-{index}.log"
        with open(log, "w") as out:
            code = subprocess.call(args, stdout=out, stderr=subprocess.STDOUT, env=self._env(tag), timeout=300)
        if code != 0:
            raise RayUnavailable(f"ray start (node {index}) exited {code}: {log.read_text()[-2000:]}")
        self.tags.append(tag)

    def start(self) -> "LocalRayCluster":
        """Start every node; the head first. Returns self."""
        if not self.ray:
            raise RayUnavailable("the ray command is not installed (pip install 'attnfuzz[fleet]')")
        self.root.mkdir(parents=True, exist_ok=True)
        for index in range(len(self.cpus)):
            self._start_node(index, head=index == 0)
        return self

    def node_processes(self, index: int) -> set[int]:
        """The live processes of node ``index`` (its tag in their environment)."""
        needle = f"{NODE_TAG_ENV}={self.tags[index]}".encode()
        return {int(e) for e in os.listdir("/proc") if e.isdigit() and _environ_has(int(e), needle) and _alive(int(e))}

    def kill_node(self, index: int) -> int:
        """``kill -9`` every process of node ``index`` (again until none is left: a raylet may
        fork a worker meanwhile). Returns how many were killed."""
        killed: set[int] = set()
        for _ in range(20):
            pids = self.node_processes(index)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed |= pids
            time.sleep(0.1)  # let the kernel reap before looking again
        return len(killed)

    def stop(self) -> None:
        """Stop the cluster: ``kill -9`` of every node's processes (``ray stop`` would stop every
        Ray cluster of this user on the machine, not only this one)."""
        for index in reversed(range(len(self.tags))):
            self.kill_node(index)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
