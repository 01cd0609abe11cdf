"""`fuzzer.loop.stats` and `fuzzer.loop.config`: the figures and their steps, the settings and
their checks, without a worker."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fuzzer.loop.config import WorkerConfig, WorkerError
from fuzzer.loop.stats import WorkerStats, add_backend_time, count_statuses, timing_between_chunks, timing_storage
from fuzzer.results import CaseResult
from tests.fuzzer.standins import CorrectBackend

BACKENDS = [(CorrectBackend(), "tests.fuzzer.standins:CorrectBackend")]


def test_results_are_counted_by_status_overall_and_per_backend():
    stats = WorkerStats()
    count_statuses(stats, [CaseResult("c", "a", "native", "pass"), CaseResult("c", "b", "native", "fail", signature="crash")])
    assert stats.results == {"pass": 1, "fail": 1} and stats.per_backend == {("a", "pass"): 1, ("b", "fail"): 1}


@pytest.mark.parametrize("background", [False, True])
def test_an_evaluation_s_seconds_go_to_the_worker_s_or_the_judge_thread_s_comparison(background):
    stats = WorkerStats()
    evaluation = SimpleNamespace(kernel_s=1.0, compile_s=2.0, judge_s=0.5, background=background,
                                 task_timing_s={"a": {"inputs": 0.25}}, skipped=["a"])
    add_backend_time(stats, evaluation)
    add_backend_time(stats, evaluation)
    assert (stats.kernel_s, stats.compile_s) == (2.0, 4.0)
    assert (stats.judge_background_s, stats.judge_s) == ((1.0, 0.0) if background else (0.0, 1.0))
    assert stats.task_timing_s == {"a": {"inputs": 0.5}} and stats.skipped_after_crash == {"a": 2}


def test_only_fuzz_writes_count_as_storing_and_between_chunks_leaves_out_what_is_counted_elsewhere():
    stats = WorkerStats()
    with timing_storage(stats, "shrink"):
        pass
    assert "storing" not in stats.own_parts
    with timing_between_chunks(stats):
        with timing_storage(stats, "fuzz"):
            stats.shrink_s += 100.0  # a minimisation between chunks: not attnfuzz's own work
    assert stats.own_parts["storing"] >= 0 and stats.own_parts["between_chunks"] == 0.0


def test_lanes_and_background_judging_follow_the_device_and_the_isolation():
    assert not WorkerConfig(backends=BACKENDS).lanes_on
    assert WorkerConfig(backends=BACKENDS, device="cuda").lanes_on
    assert not WorkerConfig(backends=BACKENDS, device="cuda", isolation="none").lanes_on
    assert not WorkerConfig(backends=BACKENDS, lanes="on", isolation="none").lanes_on
    assert WorkerConfig(backends=BACKENDS, device="cuda").judge_in_background
    assert not WorkerConfig(backends=BACKENDS, device="cuda", judge="inline").judge_in_background
    assert WorkerConfig(backends=BACKENDS, judge="background").judge_in_background


@pytest.mark.parametrize(("setting", "message"), [
    ({"jit_share": 0}, "jit_share"), ({"shrink_error_margin": 0.5}, "shrink_error_margin"),
    ({"backends": []}, "backends"), ({"seed_pool": -1}, "seed_pool"), ({"ends_at_s": float("nan")}, "ends_at_s"),
])
def test_a_bad_setting_is_refused_naming_it(setting, message):
    with pytest.raises(WorkerError, match=message):
        WorkerConfig(**{"backends": BACKENDS, **setting})
