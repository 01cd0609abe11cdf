"""Handles of submitted runs: what `submit_run` returns, to collect a case's outcomes later.

An executor with real concurrency (`fuzzer.executor.children.ChildProcessExecutor` with
parallelism on) starts a case's environments at once and returns a `ChildRun` (one future per
environment), so the worker computes the oracle while the children run
(`fuzzer.evaluate.Evaluator.evaluate`). Executors without it run when their result is collected
(`DeferredRun`). Every handle has ``result()``, ``partial(timeout_s)`` and ``abandon()``
(`submit_run`).
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

from fuzzer.executor.outcome import TaskOutcome
from fuzzer.executor.transport import unpack_output
from oracle.config import AttentionCase


def collected_outcomes(tasks: list[tuple[str, str]], outcomes: dict[int, TaskOutcome]) -> list[TaskOutcome]:
    """The outcomes of a child run in task order, outputs unpacked: a tensor that came as bytes
    stays on the CPU, a larger one where the child shared it (the judge moves what it compares to
    the reference's device, `oracle.compare.judge_tensors`, so an output is moved once, where it
    is judged, and not at all when it is not). Each outcome's ``timing["collect"]`` is the
    unpacking's time, milliseconds.

    Args:
        tasks: the run's ``(backend, variant)`` tasks.
        outcomes: ``{task index: outcome}`` with an outcome for every index of ``tasks``.
    """
    result = [outcomes[i] for i in range(len(tasks))]
    for outcome in result:
        t0 = time.perf_counter()
        outcome.output = unpack_output(outcome.output)
        outcome.timing["collect"] = (time.perf_counter() - t0) * 1000.0
    return result


class DeferredRun:
    """A run of an executor that has no real concurrency, started only when collected: what
    `submit_run` gives for an executor without ``submit`` (`InProcessExecutor`, the CP
    executor), and what `ChildProcessExecutor.submit` gives with parallelism off. The caller's
    order stays the serial one: nothing runs before `result`.

    Args:
        executor: anything with ``run(case, inputs, tasks, timeout_s) -> list[TaskOutcome]``.
        case, inputs, tasks, timeout_s: that call's arguments (``timeout_s`` per task, seconds).
    """

    def __init__(self, executor: Any, case: AttentionCase, inputs: Any, tasks: list[tuple[str, str]], timeout_s: float):
        self._call = (executor, case, inputs, list(tasks), timeout_s)
        self._outcomes: list[TaskOutcome] | None = None

    def result(self) -> list[TaskOutcome]:
        """``executor.run(...)`` (run on the first call, in the calling thread; the same list
        after): one outcome per task, in task order. Raises what ``run`` raises."""
        if self._outcomes is None:
            executor, case, inputs, tasks, timeout_s = self._call
            self._outcomes = executor.run(case, inputs, tasks, timeout_s)
        return self._outcomes

    def partial(self, timeout_s: float) -> tuple[list[TaskOutcome], None]:
        """`result` (nothing runs in the background here): every outcome, and no rest."""
        return self.result(), None

    def abandon(self) -> None:
        """Give the run up: nothing was started, so nothing runs."""
        self._outcomes = self._outcomes if self._outcomes is not None else []


def submit_run(
    executor: Any, case: AttentionCase, inputs: Any, tasks: list[tuple[str, str]], timeout_s: float, *, skip_busy: bool = False
) -> Any:
    """Start ``tasks`` on ``executor`` and return a handle to collect them later:
    ``executor.submit(...)`` when it has one (`ChildProcessExecutor`: the children start working
    now), else a `DeferredRun` (runs at ``handle.result()``).

    The handle has ``result() -> list[TaskOutcome]`` (one per task, in task order; waits),
    ``partial(timeout_s)`` (the outcomes finished within ``timeout_s`` seconds, in task order, and
    a handle of the rest or None) and ``abandon()`` (waits for whatever already runs, discards the
    outcomes and any error: the executor is ready for the next case).

    ``skip_busy`` (lanes): an environment still working on an earlier run gets no task of this
    one (`BUSY` outcomes); only executors whose ``submit`` takes it (`ChildProcessExecutor`, and
    a CP `RoutingExecutor` for cases without CP) are asked.
    """
    submit = getattr(executor, "submit", None)
    if callable(submit):
        if skip_busy and getattr(executor, "supports_lanes", False):
            return submit(case, inputs, tasks, timeout_s, skip_busy=True)
        return submit(case, inputs, tasks, timeout_s)
    return DeferredRun(executor, case, inputs, tasks, timeout_s)


class ChildRun:
    """A run of `ChildProcessExecutor` in flight: one future per environment (its pending loop
    in a thread of the executor's pool), collected by `result` (see `submit_run`), or part by part
    with `partial` (lanes). ``preset`` holds outcomes known at submission (`BUSY` tasks).

    Args:
        executor: the `fuzzer.executor.children.ChildProcessExecutor` that submitted it (told by
            ``_run_finished(run)`` once the run is collected).
        tasks: the run's ``(backend, variant)`` tasks.
        futures: by environment, the future of its ``{task index: outcome}``.
        preset: outcomes known at submission, by task index.
        indices: task indices by environment (of ``futures``).
    """

    def __init__(
        self,
        executor: Any,
        tasks: list[tuple[str, str]],
        futures: dict[str, Any],
        preset: dict[int, TaskOutcome] | None = None,
        indices: dict[str, list[int]] | None = None,
    ):
        self._executor = executor
        self._tasks = tasks
        self._futures = futures
        self._preset = dict(preset or {})
        #: task indices by environment (of ``futures``); the tasks a `partial` rest keeps
        self._indices = indices if indices is not None else {}
        self._outcomes: list[TaskOutcome] | None = None
        self._error: BaseException | None = None

    @property
    def tasks(self) -> list[tuple[str, str]]:
        """The tasks whose outcomes `result` returns, in order."""
        return list(self._tasks)

    def done(self) -> bool:
        """Whether every environment has finished."""
        return all(f.done() for f in self._futures.values())

    def environments_done(self) -> set[str]:
        """The environments of this run that have finished."""
        return {env for env, f in self._futures.items() if f.done()}

    def _wait(self) -> None:
        try:
            concurrent.futures.wait(_futures_of(self._futures.values()))
        finally:
            if self.done():
                self._executor._run_finished(self)

    def result(self) -> list[TaskOutcome]:
        """Wait for every environment; one outcome per task, in task order, outputs unpacked
        (small tensors on the CPU, see `collected_outcomes`).

        Raises:
            ExecutorError: a child could not be started (the first such error, in environment
                order, after every environment finished).
        """
        if self._outcomes is None and self._error is None:
            self._wait()
            merged: dict[int, TaskOutcome] = dict(self._preset)
            for future in self._futures.values():
                error = future.exception()
                if error is not None:
                    self._error = self._error or error
                else:
                    merged.update(future.result())
            if self._error is None:
                self._outcomes = collected_outcomes(self._tasks, merged)
        if self._error is not None:
            raise self._error
        return self._outcomes

    def partial(self, timeout_s: float) -> tuple[list[TaskOutcome], ChildRun | None]:
        """Wait up to ``timeout_s`` seconds for the environments, then split the run: the outcomes
        of every environment that finished (and the `BUSY` ones), in task order, and a run of the
        environments still working (None when all finished), collected later with its own
        `result`. Environments keep working after this returns: a rest's children stay busy
        until they finish (a later `ChildProcessExecutor.submit` waits for them or, with
        ``skip_busy``, leaves them out).

        Raises:
            ExecutorError: as `result` (after every environment finished) when a child of a
                finished environment could not be started.
        """
        if not self._futures or self._outcomes is not None or self._error is not None:
            return self.result(), None
        concurrent.futures.wait(_futures_of(self._futures.values()), timeout=max(timeout_s, 0.0))
        finished = {env: f for env, f in self._futures.items() if f.done()}
        if any(f.exception() is not None for f in finished.values()) or len(finished) == len(self._futures):
            return self.result(), None
        merged: dict[int, TaskOutcome] = dict(self._preset)
        for future in finished.values():
            merged.update(future.result())
        keep = sorted(merged)
        done = collected_outcomes([self._tasks[i] for i in keep], {k: merged[i] for k, i in enumerate(keep)})
        rest_futures = {env: f for env, f in self._futures.items() if env not in finished}
        rest_indices = sorted(i for env in rest_futures for i in self._indices.get(env, ()))
        position = {i: k for k, i in enumerate(rest_indices)}
        rest = ChildRun(
            self._executor,
            [self._tasks[i] for i in rest_indices],
            {env: _Reindexed(f, position) for env, f in rest_futures.items()},
            indices={env: [position[i] for i in self._indices.get(env, ())] for env in rest_futures},
        )
        self._outcomes = done
        self._executor._run_finished(self)
        return done, rest

    def abandon(self) -> None:
        """Wait for every environment (the children stay in step) and discard the outcomes and
        any error."""
        try:
            self.result()
        except Exception:  # noqa: BLE001 - given up on purpose; the next run meets it again
            pass


class _Reindexed:
    """A future of one environment's ``{task index: outcome}`` seen with other indices (the
    positions of those tasks in a `ChildRun.partial` rest); the rest of the future's interface
    is the wrapped one's."""

    def __init__(self, future: Any, position: dict[int, int]):
        self._future = future
        self._position = position

    def done(self) -> bool:
        return self._future.done()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._future.exception(timeout)

    def result(self, timeout: float | None = None) -> dict[int, TaskOutcome]:
        return {self._position[i]: outcome for i, outcome in self._future.result(timeout).items()}

    @property
    def future(self) -> Any:
        """The wrapped `concurrent.futures.Future` (what ``concurrent.futures.wait`` takes)."""
        return self._future


def _futures_of(futures: Any) -> list[Any]:
    """The `concurrent.futures.Future` s behind ``futures`` (a `_Reindexed` unwrapped)."""
    return [getattr(f, "future", f) for f in futures]
