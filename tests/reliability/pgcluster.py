"""A private PostgreSQL server for fault tests: its own data directory and loopback port, so the
tests (and the chaos soak) can stop, kill and restart it without touching the shared server.

Needs the server binaries (``initdb``, ``pg_ctl``; Debian's ``postgresql`` package puts them in
``/usr/lib/postgresql/<version>/bin``). As root, the server runs as the ``postgres`` user
(PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
from pathlib import Path


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries here, or the server could not be set up."""


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return Path(found[-1]).parent
    which = shutil.which("pg_ctl")
    if which:
        return Path(which).parent
    raise PostgresUnavailable("pg_ctl not found (install Debian's postgresql package)")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivatePostgres:
    """``initdb`` in ``root``, then start/stop/kill on ``port`` (127.0.0.1 only, trust auth).

    Args:
        root: an empty or missing directory for the data, socket and log.
        port: TCP port on 127.0.0.1 (default: a free one).

    Raises:
        PostgresUnavailable: no binaries, or ``initdb`` failed (with its output).
    """

    def __init__(self, root: str | Path, port: int | None = None):
        self.bin = _bin_dir()
        self.root = Path(root)
        self.port = port or free_port()
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.root.mkdir(parents=True, exist_ok=True)
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise PostgresUnavailable("running as root and there is no postgres user") from exc
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        command = [str(self.bin / tool), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise PostgresUnavailable(f"{tool} failed ({done.returncode}): {done.stdout}{done.stderr}")
        return done

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``postgres`` database."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        """Start and wait until it accepts connections (``pg_ctl -w``)."""
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c max_connections=60"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop (``fast``: roll back sessions; ``immediate``: like a crash, recovery at start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def is_running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    def execute(self, sql: str) -> None:
        """Run one statement as the superuser over the Unix socket (``psql``)."""
        self._run("psql", "-h", str(self.root), "-p", str(self.port), "-U", "postgres", "-d", "postgres",
                  "-v", "ON_ERROR_STOP=1", "-c", sql)

    def close(self) -> None:
        """Stop if running and remove the data."""
        if self.data.exists() and self.is_running():
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
