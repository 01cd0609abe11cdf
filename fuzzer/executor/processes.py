"""The process tree below a worker: a child dies with its parent, adopts what its backends
detach, and is ended with everything below it.

On Linux a child dies with its parent (``PR_SET_PDEATHSIG``, `die_with_parent`): a worker killed
by SIGKILL leaves no child running a kernel. A child is a *subreaper* (`adopt_orphans`), so what
its backends start stays in its tree however it detaches, and `kill_tree` ends that tree
(SIGSTOP each process, again until no new one appears, then SIGKILL all). Also: a process's
resident memory (`resident_bytes`, what the memory limit watches) and the cores this process may
run on (`usable_cores`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def die_with_parent(signum: int = signal.SIGKILL) -> bool:
    """Linux: have the kernel send ``signum`` to this process when the thread that started it
    ends (``prctl(PR_SET_PDEATHSIG)``; for a process started by a main thread, when its parent
    process ends, however it ends: SIGKILL included). Elsewhere nothing is done.

    Returns:
        False when the parent is already gone (this process was reparented: the signal will never
        come; the caller should stop), else True. The parent is the `multiprocessing` one of a
        process started so, else the parent pid before the call.
    """
    started_by = multiprocessing.parent_process()
    parent = started_by.pid if started_by is not None and started_by.pid else os.getppid()
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    return os.getppid() == parent


def adopt_orphans() -> bool:
    """Linux: make this process a *subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``): a process
    started below it whose parent ends (a double fork, a daemon, ``setsid ... &``) is re-parented
    to this process instead of init, so it stays in this process's tree (`descendants`) and is
    ended with it (`kill_tree`, `end_descendants`). Elsewhere nothing is done.

    Returns:
        Whether the kernel took the setting."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(pid: int) -> list[int]:
    """The pids of every living process below ``pid`` (children, theirs, ...), read from
    ``/proc/<n>/stat`` (Linux; elsewhere ``[]``); ``pid`` itself is not in it. A snapshot: a
    process may start or end right after."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat_line = handle.read()
        except OSError:  # ended meanwhile
            continue
        fields = stat_line[stat_line.rfind(b")") + 2:].split()  # after "(comm)": state, ppid, ...
        if len(fields) > 1 and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, stack = [], list(children.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children.get(child, []))
    return found


def kill_tree(pid: int, *, include_root: bool = True) -> int:
    """SIGKILL ``pid`` (with ``include_root``) and every process below it (`descendants`): first
    each is stopped (SIGSTOP: it cannot start another), again until no new one appears, then all
    are killed. With ``pid`` a subreaper (`adopt_orphans`) this includes what detached itself.

    Returns:
        How many processes below ``pid`` were killed."""
    stopped: set[int] = set()
    if include_root:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGSTOP)
    for _ in range(32):  # each round stops what the last one's processes started before they stopped
        new = [p for p in descendants(pid) if p not in stopped]
        if not new:
            break
        for p in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGSTOP)
            stopped.add(p)
    for p in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)
    if include_root:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return len(stopped)


def end_descendants() -> int:
    """Kill every process below this one (`kill_tree` without this process): what a backend
    child does before it exits, so that nothing its backends started (detached or not) outlives
    it. Returns how many were killed."""
    return kill_tree(os.getpid(), include_root=False)


def resident_bytes(pid: int) -> int | None:
    """Resident set size of process ``pid`` in bytes (Linux ``/proc``), None if unknown."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the OS says, else the count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
