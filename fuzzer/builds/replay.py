"""Replays: run saved cases (the corpus, every bucket's minimised case) on one build.

A replay task is ``(case, backend, variant)``. Its outcome on a build is a `CaseResult` with
phase ``"replay"`` (``pass``, ``fail`` with its signature, ``unsupported``, ``error``, ``crash``,
...) or a `Skip`: the build cannot run the backend at all (its adapter or library does not
import, the API it needs is missing, the backend is unavailable on this machine), the
``git bisect skip`` of a build.

Three ways to run them, none of which touches a database (the caller stores the outcome, see
`service.matrix.replay_rows.record_replay`):

* `replay_here`: in this interpreter's environment, through the worker's executor (each backend
  environment in its own child process unless ``isolation="none"``).
* `replay_in_build`: in a child interpreter whose ``PYTHONPATH`` puts a build's directories
  first (`fuzzer.builds.envs.BuildEnvironment`), the project root next, then the inherited
  ``PYTHONPATH``: exactly how a GPU host selects ``/tmp/fa4/<version>``. The child is
  ``python -m fuzzer.builds.replay REQUEST OUTPUT``; it streams one JSON line per event to OUTPUT, so a
  child that dies still leaves what it finished (the task it was running becomes ``crash``, or
  ``timeout`` when it ran past its time, and the tasks after it become skips).
* `replay_on_new_build`: the worker's hook: on a build never replayed for its backends, run the
  corpus through the worker itself (results go to its sink) before fuzzing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from fuzzer.builds.envs import BuildEnvironment
from fuzzer.builds.versions import build_packages
from fuzzer.builds.corpus import CorpusEntry, load_corpus
from fuzzer.results import (
    SKIP,
    BuildFingerprint,
    CaseResult,
    ReplayOutcome,
    ReplayTask,
    SinkUnavailableError,
    Skip,
    Verdict,
)
from oracle.config import AttentionCase
from oracle.errors import AttnFuzzError

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CHILD_LOG_TAIL_CHARS = 4000


class ReplayError(AttnFuzzError):
    """A replay request is malformed (unknown isolation or device, an unreadable request file)."""

    exit_code = 2


def matches_expectation(task: ReplayTask, verdict: Verdict) -> bool | None:
    """Whether ``verdict`` is what the corpus expects for ``task``: ``pass`` expects a pass,
    ``fail`` a failing status with the same primary signature. None when nothing can be said
    (no expectation, a skip, or ``unsupported``)."""
    if task.expected_status is None or verdict.status in (SKIP, "unsupported"):
        return None
    if task.expected_status == "pass":
        return verdict.status == "pass"
    return verdict.is_failure and verdict.signature == task.expected_signature


# ------------------------------------------------------------------------------------ tasks
def tasks_from_corpus(entries: Iterable[CorpusEntry]) -> list[ReplayTask]:
    """One task per corpus entry, carrying its expectation."""
    return [
        ReplayTask(
            e.case,
            e.backend,
            e.variant,
            f"corpus:{e.relative_path.as_posix()}",
            e.expected_status,
            e.expected_signature,
        )
        for e in entries
    ]


def group_by_case(tasks: Iterable[ReplayTask]) -> list[tuple[AttentionCase, list[ReplayTask]]]:
    """Tasks grouped by case (first-seen order; duplicates of a task dropped), so the oracle runs
    once per case."""
    groups: dict[str, tuple[AttentionCase, list[ReplayTask]]] = {}
    seen: set[tuple[str, str, str]] = set()
    for task in tasks:
        if task.key in seen:
            continue
        seen.add(task.key)
        groups.setdefault(task.case.case_id, (task.case, []))[1].append(task)
    return list(groups.values())


# ------------------------------------------------------------------------------------ in process
def resolve_device(device: str, backends: Iterable[Any]) -> str:
    """``"cpu"``/``"cuda"`` as given; ``"auto"``: cuda when one of ``backends`` wants it and a CUDA
    device is visible, else cpu.

    Raises:
        ReplayError: ``device`` is not auto, cpu or cuda.
    """
    if device not in ("auto", "cpu", "cuda"):
        raise ReplayError(f"device: unknown value {device!r} (allowed: auto, cpu, cuda)")
    if device != "auto":
        return device
    import torch

    wants_cuda = any(getattr(b, "device", "cpu") == "cuda" for b in backends)
    return "cuda" if wants_cuda and torch.cuda.is_available() else "cpu"


def replay_here(
    tasks: Sequence[ReplayTask],
    backends: Sequence[tuple[str, str]],
    *,
    device: str = "auto",
    isolation: str = "process",
    case_timeout_s: float = 120.0,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> ReplayOutcome:
    """Run ``tasks`` in this interpreter's environment.

    Args:
        tasks: what to run.
        backends: ``(name, spec)`` for every backend the tasks may name (``spec`` =
            ``module:attr``, as `fuzzer.registry.discover` gives it); tasks of other backends
            are skipped.
        device: ``"cpu"``, ``"cuda"``, or ``"auto"`` (cuda when a backend wants it and one is
            visible).
        isolation: ``"process"`` (each backend environment in a child, crashes contained) or
            ``"none"`` (in this process).
        case_timeout_s: per backend call, seconds (``"process"`` isolation only).
        on_event: called with each event as it happens (``build``, ``start``, ``result``,
            ``skip``), the child's streaming hook.

    Returns:
        The outcome: a result or a skip per task.

    Raises:
        ReplayError: ``device`` or ``isolation`` is unknown.
    """
    from fuzzer.backends.base import BackendError
    from fuzzer.environment import current_fingerprint
    from fuzzer.cp.executor import make_executor_with_cp
    from fuzzer.evaluate import Evaluator
    from fuzzer.registry import load_spec

    if isolation not in ("process", "none"):
        raise ReplayError(f"isolation: unknown value {isolation!r} (allowed: process, none)")
    emit = on_event or (lambda event: None)
    started = time.monotonic()
    wanted = {t.backend for t in tasks}
    loaded: dict[str, tuple[Any, str]] = {}
    unavailable: dict[str, str] = {}
    for name, spec in backends:
        if name not in wanted or name in loaded:
            continue
        try:
            found = [b for b in load_spec(spec) if b.name == name]
        except BackendError as exc:
            unavailable[name] = f"cannot load the adapter: {exc}"
            continue
        if not found:
            unavailable[name] = f"{spec} defines no backend named {name!r}"
            continue
        loaded[name] = (found[0], spec)
    resolved_device = resolve_device(device, (b for b, _ in loaded.values()))

    def build() -> tuple[Any, dict[str, str]]:
        # after the children started: the fingerprint names what they loaded (the cuDNN chosen
        # with ATTNFUZZ_CUDNN, the flash-attn-4 build flash_attn.cute came from)
        from fuzzer.executor import executor_runtime

        executor = None if evaluator is None else evaluator.executor
        runtime = executor_runtime(executor) if executor is not None else None
        found = current_fingerprint(resolved_device, runtime)
        versions: dict[str, str] = {}
        for backend, _ in loaded.values():
            versions.update(backend.versions())
        return found, build_packages(found, versions)

    results: list[CaseResult] = []
    skips: list[Skip] = []
    evaluator = None
    if loaded:
        specs = list(loaded.values())
        evaluator = Evaluator(
            specs, make_executor_with_cp(specs, isolation), device=resolved_device, case_timeout_s=case_timeout_s
        )
    try:
        if evaluator is not None:
            unavailable.update(evaluator.open())  # each unavailable backend's reason
        fingerprint, packages = build()
        emit({"kind": "build", "fingerprint": fingerprint.to_json(), "packages": packages})
        for case, case_tasks in group_by_case(tasks):
            runnable = []
            for task in case_tasks:
                reason = unavailable.get(task.backend)
                if reason is None and task.backend not in loaded:
                    reason = f"backend {task.backend!r} is not among the replayed backends"
                if reason is not None:
                    skip = Skip(case.case_id, task.backend, task.variant, reason)
                    skips.append(skip)
                    emit({"kind": "skip", "skip": skip.to_json()})
                else:
                    runnable.append((task.backend, task.variant))
            if not runnable:
                continue
            emit({"kind": "start", "case_id": case.case_id, "tasks": [list(t) for t in runnable]})
            for result in evaluator.evaluate(case, phase="replay", tasks=runnable).results:
                results.append(result)
                emit({"kind": "result", "result": result.to_json()})
    finally:
        if evaluator is not None:
            evaluator.close()
    return ReplayOutcome(
        tuple(tasks), fingerprint, packages, tuple(results), tuple(skips), None, time.monotonic() - started
    )


# ------------------------------------------------------------------------------------ in a child
def _prepend_site_dirs(paths: Sequence[str]) -> None:
    """Process the ``.pth`` files of the build's directories (``site.addsitedir``; gpu_stage.py
    writes a sitecustomize for the same reason) and keep everything they add first on
    ``sys.path``."""
    import importlib
    import site

    before = list(sys.path)
    for path in paths:
        site.addsitedir(path)
    added = [p for p in sys.path if p not in before]
    front = [p for p in paths if p in before]
    rest = [p for p in before if p not in front]
    sys.path[:] = front + added + rest
    importlib.invalidate_caches()


def child_main(request_path: str, output_path: str) -> int:
    """Entry point of a replay child (``python -m fuzzer.builds.replay REQUEST OUTPUT``): read the
    request JSON, run `replay_here`, and append one JSON line per event to OUTPUT (flushed),
    ending with ``{"kind": "done"}``. Returns the exit status."""
    with open(request_path, encoding="utf-8") as fh:
        request = json.load(fh)
    _prepend_site_dirs(request.get("paths", []))
    with open(output_path, "a", encoding="utf-8", buffering=1) as out:

        def emit(event: dict[str, Any]) -> None:
            out.write(json.dumps(event, default=str) + "\n")
            out.flush()

        tasks = [ReplayTask.from_json(t) for t in request["tasks"]]
        replay_here(
            tasks,
            [tuple(b) for b in request["backends"]],
            device=request.get("device", "auto"),
            isolation=request.get("isolation", "process"),
            case_timeout_s=float(request.get("case_timeout_s", 120.0)),
            on_event=emit,
        )
        emit({"kind": "done"})
    return 0


def _read_events(path: Path) -> list[dict[str, Any]]:
    events = []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return events
    for line in text.splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line cut short by the child's death
    return events


def _tail(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-CHILD_LOG_TAIL_CHARS:].strip()
    except OSError:
        return ""


def replay_in_build(
    environment: BuildEnvironment | None,
    tasks: Sequence[ReplayTask],
    backends: Sequence[tuple[str, str]],
    *,
    device: str = "auto",
    isolation: str = "process",
    case_timeout_s: float = 120.0,
    start_timeout_s: float = 600.0,
    python: str | None = None,
    env_vars: Mapping[str, str] | None = None,
) -> ReplayOutcome:
    """Run ``tasks`` in a child interpreter on ``environment`` (None: this environment, isolated).

    The child's ``PYTHONPATH`` is the build's paths, the project root, then the inherited
    ``PYTHONPATH``, so the rest of the stack is shared.

    Args:
        environment: the build (`fuzzer.builds.envs.BuildEnvironment`).
        tasks, backends, device, isolation, case_timeout_s: as in `replay_here`.
        start_timeout_s: seconds allowed for the child to import its libraries, on top of
            ``case_timeout_s`` per case; past the total the child is killed.
        python: the interpreter (default: this one).
        env_vars: more environment variables for the child.

    Returns:
        The outcome. A child that dies leaves the results it streamed; the task it was running
        becomes ``crash`` (``timeout`` when killed for time) and the tasks after it skips; a child
        that dies before reporting its build makes every task a skip, with its stderr tail as the
        reason and in ``error``.

    Raises:
        ReplayError: ``isolation`` is unknown.
    """
    if isolation not in ("process", "none"):
        raise ReplayError(f"isolation: unknown value {isolation!r} (allowed: process, none)")
    started = time.monotonic()
    tasks = tuple(tasks)
    with tempfile.TemporaryDirectory(prefix="attnfuzz-replay-") as tmp:
        tmp_path = Path(tmp)
        request_path, output_path, log_path = tmp_path / "request.json", tmp_path / "events.jsonl", tmp_path / "child.log"
        paths = [str(p) for p in environment.paths] if environment is not None else []
        request = {
            "paths": paths,
            "tasks": [t.to_json() for t in tasks],
            "backends": [list(b) for b in backends],
            "device": device,
            "isolation": isolation,
            "case_timeout_s": case_timeout_s,
        }
        request_path.write_text(json.dumps(request))
        child_env = {**os.environ, **(env_vars or {})}
        inherited = os.environ.get("PYTHONPATH", "")
        if environment is not None:
            child_env["PYTHONPATH"] = environment.pythonpath(PROJECT_ROOT, inherited)
            cudnn = environment.cudnn_dir()
            if cudnn is not None and not (env_vars or {}).get("ATTNFUZZ_CUDNN"):
                child_env["ATTNFUZZ_CUDNN"] = str(cudnn)  # a build of the cuDNN line: its children load it
        else:
            child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), inherited) if p)
        cases = len({t.case.case_id for t in tasks})
        limit_s = start_timeout_s + case_timeout_s * max(cases, 1) * 2
        command = [python or sys.executable, "-m", "fuzzer.builds.replay", str(request_path), str(output_path)]
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=child_env, cwd=tmp, start_new_session=True
            )
            timed_out = False
            try:
                process.wait(timeout=limit_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()
        events = _read_events(output_path)
        tail = _tail(log_path)
    return _outcome_from_events(tasks, events, environment, process.returncode, timed_out, limit_s, tail, time.monotonic() - started)


def _outcome_from_events(
    tasks: tuple[ReplayTask, ...],
    events: list[dict[str, Any]],
    environment: BuildEnvironment | None,
    returncode: int | None,
    timed_out: bool,
    limit_s: float,
    tail: str,
    wall_s: float,
) -> ReplayOutcome:
    fingerprint, packages = None, {}
    results: dict[tuple[str, str, str], CaseResult] = {}
    skips: dict[tuple[str, str, str], Skip] = {}
    in_flight: list[tuple[str, str, str]] = []
    done = False
    for event in events:
        kind = event.get("kind")
        if kind == "build":
            fingerprint = BuildFingerprint.from_json(event["fingerprint"])
            packages = dict(event.get("packages", {}))
        elif kind == "start":
            in_flight = [(event["case_id"], b, v) for b, v in event["tasks"]]
        elif kind == "result":
            result = CaseResult.from_json(event["result"])
            results[(result.case_id, result.backend, result.variant)] = result
        elif kind == "skip":
            skip = Skip.from_json(event["skip"])
            skips[skip.key] = skip
        elif kind == "done":
            done = True
    error = ""
    if not done:
        how = f"killed after {limit_s:g} s" if timed_out else f"exited with status {returncode}"
        error = f"replay child {how}" + (f"\n{tail}" if tail else "")
        for key in in_flight:
            if key in results or fingerprint is None:
                continue
            status = "timeout" if timed_out else "crash"
            results[key] = CaseResult(
                key[0], key[1], key[2], status, signature=status, signatures=(status,), detail=error[-2000:], phase="replay"
            )
        for task in tasks:
            if task.key not in results and task.key not in skips:
                reason = f"not run: {error}" if fingerprint is not None else f"the build could not start: {error}"
                skips[task.key] = Skip(task.case.case_id, task.backend, task.variant, reason[-2000:])
    ordered_results = tuple(results[t.key] for t in tasks if t.key in results)
    ordered_skips = tuple(skips[t.key] for t in tasks if t.key in skips and t.key not in results)
    return ReplayOutcome(tasks, fingerprint, packages, ordered_results, ordered_skips, environment, wall_s, error)


# ------------------------------------------------------------------------------------ worker hook
class BuildHistory(Protocol):
    """What `replay_on_new_build` needs from storage (`service.matrix.replay_rows.SqlBuildHistory`). Either
    method may raise `fuzzer.results.SinkUnavailableError` when storage cannot be reached."""

    def is_replayed(self, build_id: int, backends: Sequence[str]) -> bool:
        """True when replays on ``build_id`` already covered every backend of ``backends``."""
        ...

    def record_replay(
        self,
        build_id: int,
        versions: Mapping[str, str],
        backends: Sequence[str],
        skips: Sequence[Skip],
        cases: Mapping[str, Mapping[str, Any]],
        result_count: int,
        trigger: str,
    ) -> None:
        """Store the build's package versions, the skips (with the cases they name, ``case_id
        -> AttentionCase.to_json()``), and that it was replayed for ``backends``."""
        ...


def replay_on_new_build(
    worker: Any, corpus_dir: str | Path, history: BuildHistory, *, trigger: str = "worker"
) -> list[CaseResult] | None:
    """The worker's first job on a build it has not replayed yet: run the corpus entries of its
    backends (phase ``replay``, recorded through the worker's sink) and record the build's
    package versions and the skips (`BuildHistory.record_replay`). Every bucket's minimised case
    is replayed by the worker's own ``replay_known_failures`` at each start.

    Args:
        worker: an opened `fuzzer.worker.Worker` (its ``build_id``, ``usable`` and ``evaluate``
            are used).
        corpus_dir: the corpus root (a missing directory counts as an empty corpus).
        history: storage of replays.
        trigger: recorded with the replay (``"worker"``).

    Returns:
        The results, or None when the build had already been replayed for these backends (or
        storage could not say: the hook runs again at the next start, replays are idempotent).

    Raises:
        fuzzer.builds.corpus.CorpusError: a corpus file is malformed.
    """
    names = sorted(b.name for b in worker.usable)
    try:
        if history.is_replayed(worker.build_id, names):
            return None
    except SinkUnavailableError:
        return None
    corpus_dir = Path(corpus_dir)
    entries = load_corpus(corpus_dir) if corpus_dir.is_dir() else []
    usable = set(names)
    unavailable = dict(getattr(worker, "unavailable", {}))
    results: list[CaseResult] = []
    skips: list[Skip] = []
    skipped_cases: dict[str, dict[str, Any]] = {}
    for case, case_tasks in group_by_case(tasks_from_corpus(entries)):
        runnable = []
        for task in case_tasks:
            if task.backend in usable:
                runnable.append((task.backend, task.variant))
            elif task.backend in unavailable:
                skips.append(Skip(case.case_id, task.backend, task.variant, unavailable[task.backend]))
                skipped_cases[case.case_id] = case.to_json()
        if runnable:
            results.extend(worker.evaluate(case, phase="replay", tasks=runnable))
    versions: dict[str, str] = {}
    for backend in worker.usable:
        versions.update(backend.versions())
    try:
        history.record_replay(worker.build_id, versions, names, skips, skipped_cases, len(results), trigger)
    except SinkUnavailableError:
        pass  # the results are stored (through the sink); the build is replayed again next start
    return results


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.stderr.write("usage: python -m fuzzer.builds.replay REQUEST.json OUTPUT.jsonl\n")
        sys.exit(2)
    sys.exit(child_main(sys.argv[1], sys.argv[2]))
