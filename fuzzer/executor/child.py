"""A backend child process's own side: its entry point `child_main` (the ``target`` of every
``spawn`` child that `fuzzer.executor.children.ChildProcessExecutor` starts, so the child imports
this module by that name), its serving loop, and what it reports of the runtime libraries it
loaded.

A child first becomes one (`become_child`): it dies with its parent, ignores SIGINT and SIGTERM
(its worker stops it), sends its output to its `fuzzer.executor.logs.ChildLog` and adopts what
its backends detach. After a ``crash`` (the CUDA context is poisoned) it exits with status 70
(`exit_if_crashed`) and its worker restarts it; after an ``oom`` on CUDA it returns the cached
blocks (`release_after_oom`).

Protocol (parent -> child): ``("run", case_json, pack_inputs(case, inputs), [(backend_name, variant), ...])``
and ``("stop",)``. Child -> parent: ``("ready", {name: availability}, {name: runtime report})``
once, then for each task ``("start", i)`` and ``("done", i, outcome)`` (a `TaskOutcome` whose
output is packed: `fuzzer.executor.transport.pack_output`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time
from typing import Any

from fuzzer.backends.base import Backend
from fuzzer.executor.calls import OutputReuse, availability_of, configure_torch_threads, output_to, run_task
from fuzzer.executor.logs import log_output_to
from fuzzer.executor.outcome import TaskOutcome
from fuzzer.executor.processes import adopt_orphans, die_with_parent, end_descendants
from fuzzer.executor.transport import pack_output, unpack_inputs

#: Set to a directory: every child profiles its serving loop (cProfile) and writes
#: ``child-<backends>-<pid>.prof`` there when it stops (diagnostics; `benchmarks/gpu/`).
PROFILE_DIR_ENV = "ATTNFUZZ_PROFILE_DIR"


def become_child(log: Any) -> None:
    """What every child process of a worker does first (a backend child, a CP rank): die with its
    parent (`die_with_parent`, SIGKILL: the parent restarts children, a child keeps no state
    worth saving), exiting at once if the parent is already gone; ignore SIGINT and SIGTERM (the
    parent stops its children: a terminal's Ctrl-C or a scheduler's SIGTERM to the whole process
    group must not end one in the middle of a task, which would read as a crash of its backend);
    send its output to ``log`` (`log_output_to`); adopt what its backends start and detach
    (`adopt_orphans`), so that its worker ends those with it (`kill_tree`)."""
    if not die_with_parent(signal.SIGKILL):  # the parent died before the death signal was armed
        os._exit(0)
    adopt_orphans()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    log_output_to(log)


def load_task_backends(specs: list[tuple[str, str]]) -> dict[str, Backend]:
    """The backends a child serves, by name: each ``(spec, name)`` loaded with
    `fuzzer.registry.load_spec` and the backend of that name kept.

    Raises:
        BackendError: a spec cannot be loaded.
    """
    from fuzzer.registry import load_spec

    backends: dict[str, Backend] = {}
    for spec, name in specs:
        for backend in load_spec(spec):
            if backend.name == name:
                backends[name] = backend
    return backends


def exit_if_crashed(outcome: TaskOutcome, prefix: str = "") -> None:
    """After a ``crash`` outcome (the CUDA context is poisoned) write its detail to stderr and exit
    with status 70 (after the outcome was sent): the parent restarts the child."""
    if outcome.status == "crash":
        sys.stderr.write(prefix + outcome.detail + "\n")
        sys.stderr.flush()
        end_descendants()
        os._exit(70)


def release_after_oom(outcome: TaskOutcome, cuda: bool | None = None) -> None:
    """After an ``oom`` outcome on CUDA, return the cached blocks (``torch.cuda.empty_cache``), so
    that the next case starts with the memory free. ``cuda``: whether this process computes on
    CUDA; None: ``torch.cuda.is_available()``, asked only after an ``oom``."""
    if outcome.status != "oom":
        return
    import torch

    if cuda if cuda is not None else torch.cuda.is_available():
        torch.cuda.empty_cache()


def child_main(conn, specs: list[tuple[str, str]], env_vars: dict[str, str], log: Any) -> None:
    """Entry point of a child process (`become_child`, ``log``: its `ChildLog`'s write end): load
    the backends, then serve ``run`` requests."""
    become_child(log)
    os.environ.update(env_vars)
    import torch.multiprocessing  # noqa: F401  (registers tensor reductions for the pipe)

    configure_torch_threads()

    from oracle.config import AttentionCase as Case

    backends = load_task_backends(specs)
    availability = {name: availability_of(b) for name, b in backends.items()}
    runtime, seen = child_runtime(backends), _mapped_runtime_files()
    # CUDA backends load runtime libraries lazily; a CPU backend may say it does too
    watch_runtime = any(getattr(b, "watch_runtime_libraries", b.device != "cpu") for b in backends.values())
    conflict = next((r["cudnn_conflict"] for r in runtime.values() if r.get("cudnn_conflict")), None)
    if conflict:  # results of this process could not be attributed to one cuDNN
        availability = {name: reason or conflict for name, reason in availability.items()}
    conn.send(("ready", availability, runtime))
    profile_dir = os.environ.get(PROFILE_DIR_ENV)
    if profile_dir:  # diagnostics: this child's serving loop under cProfile, written at its end
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
        try:
            _serve(conn, backends, Case, seen, watch_runtime)
        finally:
            end_descendants()
            profiler.disable()
            with contextlib.suppress(OSError):
                os.makedirs(profile_dir, exist_ok=True)
                profiler.dump_stats(os.path.join(profile_dir, f"child-{'+'.join(backends)}-{os.getpid()}.prof"))
        return
    try:
        _serve(conn, backends, Case, seen, watch_runtime)
    finally:
        end_descendants()  # what its backends started (a detached process included) ends with it


def _serve(conn, backends: dict[str, Backend], Case: type, seen: frozenset[str], watch_runtime: bool) -> None:
    """A child's loop: serve ``run`` messages until ``stop`` or the pipe closes."""
    reuse = OutputReuse()
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message[0] == "stop":
            return
        _, case_json, packed, tasks = message
        t_unpack = time.perf_counter()
        case = Case.from_json(case_json)
        inputs = unpack_inputs(packed)
        unpack_ms = (time.perf_counter() - t_unpack) * 1000.0
        for i, (name, variant) in enumerate(tasks):
            conn.send(("start", i))
            outcome = reuse.check(run_task(backends[name], case, inputs, variant))
            t_pack = time.perf_counter()
            if outcome.output is not None:
                outcome.output = pack_output(output_to(outcome.output, "cpu"))
            t_runtime = time.perf_counter()
            # the runtime libraries are CUDA ones: a child of CPU backends loads none lazily
            now_seen = _mapped_runtime_files() if watch_runtime else seen
            if now_seen != seen:  # a library loaded lazily by this call: report it with the outcome
                seen, outcome.runtime = now_seen, child_runtime(backends)
            outcome.timing["pack"] = (t_runtime - t_pack) * 1000.0
            outcome.timing["runtime"] = (time.perf_counter() - t_runtime) * 1000.0
            if i == 0:
                outcome.timing["unpack"] = unpack_ms
            conn.send(("done", i, outcome))
            exit_if_crashed(outcome)  # the CUDA context is poisoned: die, be restarted
            release_after_oom(outcome)


def child_runtime(backends: dict[str, Backend]) -> dict[str, dict[str, str]]:
    """What this process has loaded, per backend: `fuzzer.environment.runtime_report` (the
    runtime libraries mapped, one or two cuDNN builds) updated with the backend's own
    `Backend.runtime_versions` (its library's query, e.g. TE's cuDNN version), which wins. A
    backend whose query raises reports the process map only."""
    from fuzzer.environment import runtime_report

    shared = runtime_report()
    result = {}
    for name, backend in backends.items():
        report = dict(shared)
        try:
            own = backend.runtime_versions()
        except Exception:  # noqa: BLE001 - a query that fails must not stop the child
            own = {}
        report.update({str(k): str(v) for k, v in (own or {}).items() if v})
        result[name] = report
    return result


_SO_PATHS = re.compile(rb"(/[^\n]*\.so[^\n/]*)$", re.M)  # file-backed shared objects of /proc/self/maps
_mapped_cache: list[tuple[frozenset[bytes], frozenset[str]]] = []


def _mapped_runtime_files() -> frozenset[str]:
    """The runtime libraries mapped now (`fuzzer.environment.loaded_libraries`, by path). Called
    after every task: the full parse (milliseconds) only runs when the set of mapped ``.so``
    files changed since the last call (a regex scan of the map, a fraction of that)."""
    from fuzzer.environment import loaded_libraries

    try:
        with open("/proc/self/maps", "rb") as fh:
            data = fh.read()
    except OSError:
        return frozenset(lib.path for lib in loaded_libraries())
    shared = frozenset(_SO_PATHS.findall(data))
    if _mapped_cache and _mapped_cache[0][0] == shared:
        return _mapped_cache[0][1]
    found = frozenset(lib.path for lib in loaded_libraries(data.decode("utf-8", errors="replace")))
    _mapped_cache[:] = [(shared, found)]
    return found
