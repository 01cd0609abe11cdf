"""``attnfuzz fuzz --jit-share``: the compile budget of JIT backends reaches the worker's config,
a value outside (0, 1] is a usage error, and the summary shows the compile share and kernel keys."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from service.cli.main import app


def _fuzz(tmp_path: Path, *args: str):
    url = f"sqlite:///{tmp_path / 'jit.db'}"
    base = ["fuzz", "--backend", "torch-cpu-math", "--max-cases", "2", "--db", url, "--spool-dir", str(tmp_path / "spool"),
            "--no-replay", "--corpus", "", "--isolation", "none", "--no-shrink", "--seed", "1"]
    return CliRunner().invoke(app, [*base, *args], env={"COLUMNS": "250"})


def test_the_jit_share_flag_reaches_the_worker_config(tmp_path: Path, monkeypatch) -> None:
    from fuzzer import worker as worker_module

    seen = []
    real_run = worker_module.Worker.run

    def run(self):
        seen.append(self.config.jit_share)
        return real_run(self)

    monkeypatch.setattr(worker_module.Worker, "run", run)
    result = _fuzz(tmp_path, "--jit-share", "0.35", "--json")
    assert result.exit_code == 0, result.output
    assert seen == [0.35]
    body = json.loads(result.stdout)
    assert body["jit_share"] == 0.0 and "budget_chunks" in body  # torch-cpu-math compiles nothing
    assert _fuzz(tmp_path, "--quiet").exit_code == 0 and seen[-1] == 0.2  # the default


def test_a_jit_share_outside_0_1_is_a_usage_error_naming_the_flag(tmp_path: Path) -> None:
    for bad in ("0", "1.5"):
        result = _fuzz(tmp_path, "--jit-share", bad)
        assert result.exit_code == 2, result.output
        assert "--jit-share" in result.output


def test_the_summary_shows_the_compile_share_and_kernel_keys_of_jit_backends() -> None:
    from service.cli.fuzz_display import _jit_cell, summary_data
    from fuzzer.worker import WorkerStats

    stats = WorkerStats(cases=4, compile_s=1.5, wall_s=6.0, fuzz_s=5.0)
    stats.kernel_keys["planted-jit"] = {("a",), ("b",), ("c",)}
    stats.compile_by_backend["planted-jit"] = 1.5
    stats.runnable["planted-jit"] = 4
    data = summary_data(stats, "sqlite://")
    assert data["jit_share"] == 0.3
    assert data["coverage"]["planted-jit"]["kernel_keys"] == 3
    assert _jit_cell(stats, "planted-jit") == "1.5 s / 3" and _jit_cell(stats, "torch-cpu-math") == "-"


def test_a_bad_parallel_children_setting_is_a_usage_error_before_anything_runs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'never.db'}"
    result = CliRunner().invoke(
        app, ["fuzz", "--backend", "torch-cpu-math", "--max-cases", "1", "--db", url, "--corpus", ""],
        env={"COLUMNS": "250", "ATTNFUZZ_PARALLEL_CHILDREN": "yes"},
    )
    assert result.exit_code == 2, result.output
    assert "ATTNFUZZ_PARALLEL_CHILDREN" in result.output and "'yes'" in result.output
    assert not (tmp_path / "never.db").exists()  # refused before the database was made


def test_a_run_whose_failures_are_all_known_does_not_say_no_failures() -> None:
    from service.cli.common import out
    from service.cli.fuzz_display import print_summary
    from fuzzer.worker import WorkerStats

    stats = WorkerStats(cases=3, wall_s=1.0)
    stats.results.update({"pass": 4, "fail": 2})
    with out.capture() as captured:
        print_summary(stats, "sqlite://")
    text = captured.get()
    assert "no failures found" not in text and "no new bucket: 2 failing result(s)" in text
    stats.results["fail"] = 0
    with out.capture() as captured:
        print_summary(stats, "sqlite://")
    assert "no failures found" in captured.get()
    assert "FA4 compile cache" not in captured.get()  # nothing compiled: no JIT cache to name
    stats.kernel_keys["fa4"] = {("a",)}
    with out.capture() as captured:
        print_summary(stats, "sqlite://")
    assert "FA4 compile cache" in captured.get()


def test_the_json_summary_counts_restarts_spares_and_mask_class_kernels() -> None:
    from fuzzer.worker import WorkerStats
    from service.cli.fuzz_display import print_summary, summary_data
    from service.cli.common import out

    stats = WorkerStats(cases=3, wall_s=2.0, child_restarts=3, spares_used=2)
    stats.compile_novel["fa4"] = 4
    data = summary_data(stats, "sqlite://")
    assert (data["child_restarts"], data["spare_children_used"], data["compile_novel"]) == (3, 2, {"fa4": 4})
    with out.capture() as captured:
        print_summary(stats, "sqlite://")
    text = captured.get()
    assert "started again (after a crash, a timeout or a lost pipe): 3, 2 of them by taking a spare" in " ".join(text.split())
    assert "first kernel of their mask class" in text and "fa4 4" in text


def test_the_json_summary_says_where_the_tasks_time_went_and_what_was_not_run(tmp_path: Path) -> None:
    """``fuzz --json``: per backend the timing parts of its tasks (`fuzzer.executor.TASK_TIMING_PARTS`
    plus run, compile and tasks) and how often it was the case's slowest; the variants left out as
    no distinct call; the quarantine counters. In process there is no child timing, only run."""
    from collections import Counter

    from fuzzer.worker import WorkerStats
    from service.cli.fuzz_display import summary_data

    stats = WorkerStats(cases=3, wall_s=2.0)
    stats.task_timing_s["te-fa4"] = Counter({"tasks": 3, "run": 0.5, "send": 0.01, "env_wall": 4.0})
    stats.slowest_cases["te-fa4"], stats.slowest_s["te-fa4"] = 2, 3.5
    stats.not_applicable["fa4"] = 5
    stats.crash_quarantined["fa4"] = 2
    data = summary_data(stats, "sqlite://")
    assert data["children"]["te-fa4"] == {"env_wall": 4.0, "run": 0.5, "send": 0.01, "tasks": 3,
                                          "slowest_cases": 2, "slowest_s": 3.5}
    assert data["not_applicable"] == {"fa4": 5} and data["crash_quarantined"] == {"fa4": 2}
    assert data["skipped_after_crash"] == {}
    result = _fuzz(tmp_path, "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["children"]["torch-cpu-math"]["tasks"] >= 1 and "slowest_cases" in body["children"]["torch-cpu-math"]
    assert body["not_applicable"].get("torch-cpu-math", 0) >= 0


def test_out_of_range_numbers_are_usage_errors_naming_the_option(tmp_path: Path) -> None:
    """A new user's bad values (a trial, 2026-12-01): ``--case-timeout 0`` was accepted and made
    every call a timeout (fake crash buckets stored), ``--time-budget -5`` and ``--max-cases -3``
    ran, ``--shrink-share -1`` exited 4 naming ``shrink_share``. Each is now exit 2 naming the
    option, before anything is stored."""
    url = f"sqlite:///{tmp_path / 'bad.db'}"
    for option, value in [("--case-timeout", "0"), ("--time-budget", "-5"), ("--max-cases", "-3"),
                          ("--shrink-share", "-1"), ("--shrink-share", "1.5"), ("--shrink-deadline", "0"),
                          ("--max-seqlen", "0"), ("--max-work", "-1"), ("--max-batch-size", "0"), ("--heartbeat", "0")]:
        result = CliRunner().invoke(app, ["fuzz", option, value, "--db", url], env={"COLUMNS": "200"})
        assert result.exit_code == 2, (option, value, result.output)
        assert option in result.output, (option, result.output)
    assert not (tmp_path / "bad.db").exists()


def test_the_summary_gives_each_new_bucket_a_case_to_export_and_says_why_one_was_not_shrunk(monkeypatch) -> None:
    """Each new bucket shows the case it was first seen on, its minimised case, or the bucket whose
    minimised case it fails on too (attached: not shrunk on its own), or that a later run shrinks
    it; the hints name the command as it was started (``.venv/bin/attnfuzz``) and ``export``."""
    import sys

    from fuzzer.minimise import MinimiseOutcome
    from fuzzer.worker import WorkerStats
    from oracle.config import AttentionCase
    from service.cli.common import out
    from service.cli.fuzz_display import print_summary, summary_data

    shrunk, attached, waiting = ("b", "v1", "out:all_zero"), ("b", "v2", "out:all_zero"), ("c", "v1", "dq:nan")
    minimal = AttentionCase(batch_size=1, seqlen_q=1, seqlen_k=1, num_heads=1, head_dim=8)
    stats = WorkerStats(cases=5, wall_s=3.0, shrink_s=1.0)
    stats.results.update({"fail": 3})
    stats.new_buckets = [shrunk, attached, waiting]
    stats.first_cases = {shrunk: "aaaa000011112222", attached: "aaaa000011112222", waiting: "cccc000011112222"}
    stats.minimised = [(shrunk, MinimiseOutcome(status="minimised", case=minimal, original=minimal, attempts=3, elapsed_s=1.0, note=""))]
    stats.attached_to = {attached: shrunk}
    monkeypatch.setattr(sys, "argv", [".venv/bin/attnfuzz", "fuzz"])
    with out.capture() as captured:
        print_summary(stats, "sqlite:///x.db")
    text = captured.get()
    assert "b / v1 / out:all_zero  [first seen on case aaaa000011112222]" in text
    assert f"[case {minimal.case_id}]" in text
    assert "fails on the minimised case of b / v1 / out:all_zero too: one root cause, not shrunk on its own" in text
    assert "c / v1 / dq:nan  [first seen on case cccc000011112222]\n      not minimised in this run" in text
    # the shrink-only command names the database and the bucket's backend (an opt-in one is not selected by default)
    assert ".venv/bin/attnfuzz fuzz --max-cases 0 --db sqlite:///x.db --backend c" in text
    assert "found earlier, shrunk in this run" not in text  # every bucket shrunk was new
    assert ".venv/bin/attnfuzz report --db sqlite:///x.db" in text
    # the export hint names the minimised case to export (a new-user trial did not know which id)
    assert f"the first one's: .venv/bin/attnfuzz export {minimal.case_id} --db sqlite:///x.db" in text
    assert "export CASE_ID" not in text
    stats.minimised = []  # none shrunk yet: the first bucket's first case
    with out.capture() as captured:
        print_summary(stats, "sqlite:///x.db")
    assert "first bucket's case: .venv/bin/attnfuzz export aaaa000011112222 --db sqlite:///x.db" in captured.get()
    stats.minimised = [(shrunk, MinimiseOutcome(status="minimised", case=minimal, original=minimal, attempts=3, elapsed_s=1.0, note=""))]
    data = {tuple(b[k] for k in ("backend", "variant", "signature")): b for b in summary_data(stats, "sqlite://")["new_buckets"]}
    assert data[attached]["attached_to"] == "b / v1 / out:all_zero" and data[waiting]["first_case_id"] == "cccc000011112222"
    assert data[shrunk]["minimised"]["case_id"] == minimal.case_id and data[shrunk]["attached_to"] is None


def test_a_shrink_only_run_lists_the_buckets_it_shrank() -> None:
    """``fuzz --max-cases 0`` finds no bucket but shrinks queued ones: the summary says which, with
    the minimised case (a new-user trial saw only "no new bucket" and "0 cases")."""
    from fuzzer.minimise import MinimiseOutcome
    from fuzzer.worker import WorkerStats
    from oracle.config import AttentionCase
    from service.cli.common import out
    from service.cli.fuzz_display import print_summary

    minimal = AttentionCase(batch_size=1, seqlen_q=1, seqlen_k=2, num_heads=1, head_dim=8)
    stats = WorkerStats(cases=0, wall_s=3.0, shrink_s=2.0)
    stats.results.update({"fail": 4})
    stats.minimised = [(("p", "v", "out:all_zero"), MinimiseOutcome(status="minimised", case=minimal, original=minimal, attempts=3, elapsed_s=1.0, note=""))]
    with out.capture() as captured:
        print_summary(stats, "sqlite:///x.db")
    text = captured.get()
    assert "1 bucket(s) found earlier, shrunk in this run:" in text
    assert f"p / v / out:all_zero\n      minimised: {minimal.describe()}  [case {minimal.case_id}]" in text
