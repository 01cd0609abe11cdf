"""The GPU harness (`benchmarks/gpu/campaign.py`, `summarise.py`) on the CPU: campaign files, the plan
of one machine hold, the checkpoint's limits, and one campaign run end to end as on the device host
(a short CPU fuzz run in the background, collected into a stand-in ``$OUT`` and landed here)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "campaign.py"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", ROOT / "benchmarks" / "gpu" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


campaign = _load("campaign")
summarise = _load("summarise")


@pytest.mark.parametrize("path", sorted((ROOT / "benchmarks" / "gpu" / "campaigns").glob("*.toml")), ids=lambda p: p.stem)
def test_every_campaign_file_loads_and_its_device_commands_fit_one_call(path):
    c = campaign.load_campaign(str(path))
    plan = campaign.make_plan([c.name], parts=8, commit="abc1234")
    assert all(len(call.command) <= campaign.COMMAND_LIMIT for call in plan.calls)
    assert all(s.timeout_s >= s.expected_s for s in c.steps)
    assert all(s.timeout_s <= campaign.CALL_S * 2 for s in c.steps)  # no step outlives two collect calls


def test_the_gpu_tests_and_the_default_campaign_fit_one_hold_with_one_call_a_part():
    plan = campaign.make_plan(["gpu-tests", "default"], parts=8, commit="abc1234")
    assert plan.fits and plan.kind == "nvidia-h200"
    assert plan.held_s + plan.expected_s + campaign.MARGIN_S <= campaign.HOLD_S
    staging = plan.calls[:8]
    assert [c.carry for c in staging] == [[f".gpu-wheels/p{i}"] for i in range(1, 9)]
    assert staging[0].command == "python3 benchmarks/gpu/campaign.py device stage-part 1"
    assert staging[-1].command.endswith(
        "stage-part 8 --install && python3 benchmarks/gpu/campaign.py device start gpu-tests default --commit abc1234")
    collects = plan.calls[8:]
    assert collects and all(c.command.endswith("device collect --wait 540") and not c.carry for c in collects)
    assert all(c.timeout_s <= campaign.CALL_S for c in plan.calls)


def test_a_plan_past_the_hold_names_the_campaigns_that_fit():
    plan = campaign.make_plan(["default", "default"], parts=8, held_s=200)
    assert not plan.fits and plan.fitting == ["default"]
    staged = campaign.make_plan(["oracle"], parts=8)
    assert staged.staging_s == 0 and "device start oracle" in staged.calls[0].command
    with pytest.raises(campaign.CampaignError, match="one machine kind"):
        campaign.make_plan(["default", "cp"], parts=8)


def test_a_campaign_file_with_an_unknown_key_or_summary_is_refused(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[steps]]\nname = "a"\nrun = "true"\nexpected_s = 1\ntimout_s = 2\n')
    with pytest.raises(campaign.CampaignError, match="unknown keys"):
        campaign.load_campaign(str(bad))
    bad.write_text('[[steps]]\nname = "a"\nrun = "true"\nexpected_s = 1\nsummary = "fuz"\n')
    with pytest.raises(campaign.CampaignError, match="summary"):
        campaign.load_campaign(str(bad))
    with pytest.raises(campaign.CampaignError, match="no campaign"):
        campaign.load_campaign("no-such-campaign")


def test_a_step_command_fills_its_placeholders_and_runs_attnfuzz_with_this_python(tmp_path):
    step = campaign.Step(name="f", run="attnfuzz fuzz --corpus '' --db {db} --json {output}", expected_s=1,
                         timeout_s=2, output="x.json")
    argv = campaign.resolve_command(step, tmp_path / "run", tmp_path)
    assert argv[:3] == [sys.executable, "-m", "attnfuzz"]
    assert argv[3:] == ["fuzz", "--corpus", "", "--db", f"sqlite:///{tmp_path / 'run' / 'campaign.db'}", "--json",
                        str(tmp_path / "run" / "x.json")]
    other = campaign.Step(name="h", run="python3 hand.py {db_path:default}", expected_s=1, timeout_s=2)
    with pytest.raises(campaign.CampaignError, match="no run of campaign 'default'"):
        campaign.resolve_command(other, tmp_path / "run", tmp_path)


def test_the_fuzz_figures_are_the_shares_of_the_worker_wall_time():
    # the counts of the 600 s campaign of 2026-12-03 at 79cee67 (docs/gpu-campaigns.md: 30,435 cases/hour,
    # 69.5% runnable, shrinking 19.8%, own work 10.9%)
    fuzz = {"cases": 4981, "wall_s": 589.17, "worker_s": 589.17,
            "evaluations_by_status": {"crash": 9, "error": 11, "fail": 8377, "pass": 67734, "unsupported": 33351},
            "coverage": {"fa4": {"cases_run": 1422}, "torch-flex": {"cases_run": 325}, "x": {"cases_run": 99}},
            "time_s": {"shrinking": 116.58, "own_work": 64.06, "own_parts": {"storing": 27.4}}, "new_buckets": [{}] * 3}
    figures = summarise.fuzz_figures(fuzz)
    assert figures["cases_per_hour"] == 30435
    assert figures["runnable_share"] == 0.6954
    assert (figures["shrinking_share"], figures["own_work_share"]) == (0.1979, 0.1087)
    assert (figures["backends_100_cases"], figures["backends"]) == (2, 3)
    assert figures["fewest_cases"] == {"backend": "x", "cases_run": 99} and figures["new_buckets"] == 3
    report = {"cases": 10, "results": 40, "results_by_status": {"pass": 30, "unsupported": 10},
              "coverage": [{"backend": "a", "cases_run": 100}],
              "buckets": [{"severity": "wrong"}, {"severity": "limit"}, {"severity": "limit"}], "defects": [{}]}
    stored = summarise.report_figures(report)
    assert stored["buckets_by_severity"] == {"wrong": 1, "crash": 0, "imprecise": 0, "error": 0, "limit": 2}
    assert stored["stored_runnable_share"] == 0.75 and stored["known_bucket_share"] is None
    report["known_buckets"] = {"evaluations": 33541, "known_hits": 3065, "known_share": 3065 / 33541}
    stored = summarise.report_figures(report)
    assert (stored["known_bucket_share"], stored["known_bucket_hits"], stored["known_bucket_evaluations"]) == (0.0914, 3065, 33541)


def _sqlite(path: Path, kib: int) -> None:
    con = sqlite3.connect(path)
    con.execute("create table t (b blob)")
    con.executemany("insert into t values (?)", [(os.urandom(1024),) for _ in range(kib)])
    con.commit()
    con.close()


def test_a_checkpoint_stays_within_the_file_limits_and_lands_whole(tmp_path):
    root = tmp_path / "host"
    for i, kib in enumerate((300, 40, 40)):  # oldest first
        run = root / f"2026-01-0{i + 1}-abc-c{i}"
        run.mkdir(parents=True)
        (run / "manifest.json").write_text(json.dumps({"run": run.name, "state": "done"}))
        (run / "summary.md").write_text("# figures\n")
        (run / "fuzz.log").write_bytes(b"x" * (campaign.LOG_TAIL_BYTES + 10))
        _sqlite(run / "campaign.db", kib)
        os.utime(run, (1000 + i, 1000 + i))
    limit = 100 * 1024
    few = campaign.checkpoint(tmp_path / "few", root, max_files=5, max_bytes=limit)
    assert len(few) == 4 and json.loads((tmp_path / "few" / "status.json").read_text())["left_on_host"] == [
        "2026-01-01-abc-c0"]  # its database needs several parts: more than the 5 files allow
    out = tmp_path / "out"
    names = campaign.checkpoint(out, root, max_files=8, max_bytes=limit)
    assert sorted(names) == sorted(p.name for p in out.iterdir()) and len(names) <= 8
    assert sum(n.startswith("2026-01-01-abc-c0.db.gz.") for n in names) > 1  # split in parts under the limit
    assert all((out / n).stat().st_size <= limit for n in names if n != "results.tgz")
    with tarfile.open(out / "results.tgz") as tar:
        log = tar.getmember("2026-01-01-abc-c0/fuzz.log")
        assert log.size == campaign.LOG_TAIL_BYTES and not any(n.endswith(".db") for n in tar.getnames())
    results, keep = tmp_path / "results", tmp_path / "keep"
    done = subprocess.run([sys.executable, str(SCRIPT), "land", str(out), "--results", str(results), "--keep",
                           str(keep)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (results / "2026-01-03-abc-c2").iterdir()) == ["manifest.json"]  # the rest is kept
    assert (keep / "2026-01-03-abc-c2" / "summary.md").exists()
    for name, rows in (("2026-01-01-abc-c0", 300), ("2026-01-03-abc-c2", 40)):  # the parts put together again
        (tmp_path / "db").write_bytes(gzip.decompress((keep / name / "campaign.db.gz").read_bytes()))
        assert sqlite3.connect(tmp_path / "db").execute("select count(*) from t").fetchone()[0] == rows


def test_a_campaign_runs_in_the_background_is_collected_and_lands_here(tmp_path):
    """As on the device host: start copies the tree and returns, the runner runs a short CPU fuzz run
    and the report, collect waits and checkpoints into $OUT, land puts the manifest here."""
    toml = tmp_path / "cpu-check.toml"
    toml.write_text(
        'description = "a short CPU fuzz run"\nstage = false\n\n'
        '[[steps]]\nname = "fuzz"\n'
        "run = \"attnfuzz fuzz --time-budget 120 --max-cases 6 --corpus '' --backend torch-cpu-math --workers 1 --db {db} --json\"\n"
        'expected_s = 60\ntimeout_s = 300\nstdout = "fuzz.json"\nsummary = "fuzz"\n\n'
        '[[steps]]\nname = "report"\nrun = "attnfuzz report --db {db}"\nexpected_s = 5\ntimeout_s = 120\n'
        'stdout = "report.txt"\n')
    env = {**os.environ, "ATTNFUZZ_RUN_ROOT": str(tmp_path / "host"), "PYTHONPATH": str(ROOT)}

    def device(*args, out):
        return subprocess.run([sys.executable, str(SCRIPT), "device", *args], cwd=ROOT, capture_output=True, text=True,
                              env={**env, "OUT": str(out)}, timeout=420)

    started = device("start", str(toml), "--commit", "test123", out=tmp_path / "out1")
    assert started.returncode == 0, started.stdout + started.stderr
    assert (tmp_path / "out1" / "status.json").exists()
    collected = device("collect", "--wait", "400", out=tmp_path / "out2")
    assert "all campaigns done" in collected.stdout, collected.stdout + collected.stderr
    out = tmp_path / "out2"
    run = json.loads((out / "status.json").read_text())["queue"][0]["run"]
    assert run.endswith("-test123-cpu-check") and (out / f"{run}.db.gz").exists()
    landed = subprocess.run([sys.executable, str(SCRIPT), "land", str(out), "--results", str(tmp_path / "results"),
                             "--keep", str(tmp_path / "keep")], capture_output=True, text=True, timeout=120)
    assert landed.returncode == 0, landed.stderr
    manifest = json.loads((tmp_path / "results" / run / "manifest.json").read_text())
    assert manifest["commit"] == "test123" and manifest["state"] == "done"
    assert [(s["name"], s["rc"]) for s in manifest["steps"]] == [("fuzz", 0), ("report", 0)]
    figures = manifest["figures"]["fuzz"]
    assert figures["cases"] > 0 and figures["stored_cases"] > 0, figures
    assert set(figures["buckets_by_severity"]) >= {"wrong", "crash", "imprecise", "error", "limit"}
    assert manifest["host"]["versions"]["torch"] and "fuzz" in manifest["wall_s"]
    assert (tmp_path / "keep" / run / "summary.md").read_text().startswith(f"# {run}")
    assert (tmp_path / "keep" / run / "report.txt").stat().st_size > 0


FAKE_STAGE = '''"""A stand-in for gpu_stage.py: receive copies the part, install (2 s) puts a module into the site."""
import os, shutil, sys, time
if sys.argv[1] == "receive":
    os.makedirs(os.environ["FAKE_STAGE_DIR"], exist_ok=True)
    shutil.copy(os.path.join(sys.argv[2], "part001"), os.environ["FAKE_STAGE_DIR"])
elif sys.argv[1] == "install":
    time.sleep(2)
    os.makedirs(os.environ["ATTNFUZZ_GPU_SITE"])
    open(os.path.join(os.environ["ATTNFUZZ_GPU_SITE"], "staged_marker.py"), "w").write("OK = 'staged'\\n")
'''


def test_the_last_part_starts_the_install_and_a_staged_campaign_waits_for_it(tmp_path):
    part = tmp_path / "wheels" / "p1"
    part.mkdir(parents=True)
    (part / "gpu_stage.py").write_text(FAKE_STAGE)
    (part / "part001").write_bytes(b"x" * 1000)
    toml = tmp_path / "staged-check.toml"
    toml.write_text('stage = true\n[[steps]]\nname = "marker"\n'
                    "run = \"python3 -c 'import staged_marker; print(staged_marker.OK)'\"\n"
                    'expected_s = 5\nstdout = "marker.txt"\n')
    env = {**os.environ, "ATTNFUZZ_RUN_ROOT": str(tmp_path / "host"), "ATTNFUZZ_GPU_SITE": str(tmp_path / "site"),
           "ATTNFUZZ_GPU_SITE_LINK": str(tmp_path / "gpu" / "site-packages"), "FAKE_STAGE_DIR": str(tmp_path / "stage"),
           "OUT": str(tmp_path / "out")}

    def device(*args):
        done = subprocess.run([sys.executable, str(SCRIPT), "device", *args], cwd=ROOT, capture_output=True,
                              text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    assert "install started in the background" in device("stage-part", "1", "--install", "--dest", str(tmp_path / "wheels"))
    assert (tmp_path / "stage" / "part001").exists()
    device("start", str(toml), "--commit", "abc1234")  # before the install has ended
    assert "all campaigns done" in device("collect", "--wait", "120")
    host = tmp_path / "host"
    run = next(p for p in host.iterdir() if p.name.endswith("-abc1234-staged-check"))
    assert (run / "marker.txt").read_text().strip() == "staged"  # the staged site was on PYTHONPATH, through the link
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["stage"]["install"]["rc"] == "0" and manifest["stage"]["parts"]["1"]["rc"] == 0
    assert manifest["wall_s"]["install_wait"] >= 0 and "staging" in manifest["wall_s"]


def test_the_load_figures_weigh_the_stored_cases_and_sum_the_explanations(tmp_path):
    """`summarise.load_figures`: score entries per stored case (mean, median), the oracle's
    milliseconds per case (once per case), the kernels' milliseconds per case (summed over its
    results) and the explanations' seconds by phase, from what the worker stored."""
    from fuzzer.environment import BuildFingerprint
    from fuzzer.results import CaseResult
    from oracle.config import AttentionCase
    from service.db import migrations
    from service.db.engine import make_engine
    from service.db.store import SqlStore

    url = f"sqlite:///{tmp_path / 'load.db'}"
    migrations.upgrade(url)
    engine = make_engine(url)
    store = SqlStore(engine)
    build = store.register_build(BuildFingerprint())
    small = AttentionCase(seqlen_q=2, seqlen_k=3, num_heads=1, head_dim=8)  # 6 score entries
    large = AttentionCase(batch_size=2, seqlen_q=4, seqlen_k=8, num_heads=2, head_dim=8)  # 128
    for case in (small, large):
        store.record_case(case.to_json(), "fuzz")
    design = {"design": {"verdict": "defect", "explain_ms": 250.0}}
    store.record_result(CaseResult(small.case_id, "a", "v", "pass", oracle_ms=2.0, run_ms=1.0), build, None)
    store.record_result(CaseResult(small.case_id, "b", "v", "fail", signature="out:mismatch", metrics=design,
                                   oracle_ms=2.0, run_ms=3.0), build, None)
    store.record_result(CaseResult(large.case_id, "b", "v", "fail", signature="out:mismatch", metrics=design,
                                   oracle_ms=6.0, run_ms=8.0, phase="shrink"), build, None)
    engine.dispose()
    figures = summarise.load_figures(url)
    assert figures["case_score_entries_mean"] == 67 and figures["case_score_entries_median"] == 128
    assert figures["case_oracle_ms_mean"] == 4.0 and figures["case_kernels_ms_mean"] == 6.0
    assert figures["explained_results"] == 2 and figures["explain_s"] == {"fuzz": 0.2, "shrink": 0.2}


def test_a_step_with_with_next_runs_beside_the_next_and_the_step_after_waits_for_both(tmp_path):
    """Two 3-second steps joined by with_next overlap; the third starts after both ended; the
    campaign's expected seconds count the pair once (its longer step)."""
    toml = tmp_path / "pair.toml"
    stamp = "python3 -c \"import sys, time; a = time.time(); time.sleep(3); print(a, time.time())\""
    toml.write_text(
        'description = "two steps side by side"\nstage = false\n\n'
        f'[[steps]]\nname = "a"\nrun = \'{stamp}\'\nexpected_s = 10\ntimeout_s = 60\nwith_next = true\n\n'
        f'[[steps]]\nname = "b"\nrun = \'{stamp}\'\nexpected_s = 4\ntimeout_s = 60\n\n'
        f'[[steps]]\nname = "c"\nrun = \'{stamp}\'\nexpected_s = 5\ntimeout_s = 60\n')
    loaded = campaign.load_campaign(str(toml))
    assert [[s.name for s in g] for g in campaign.step_groups(loaded.steps)] == [["a", "b"], ["c"]]
    assert loaded.expected_s == 15
    env = {**os.environ, "ATTNFUZZ_RUN_ROOT": str(tmp_path / "host"), "PYTHONPATH": str(ROOT), "OUT": str(tmp_path / "out")}
    for args in (("start", str(toml), "--commit", "pair123"), ("collect", "--wait", "120")):
        done = subprocess.run([sys.executable, str(SCRIPT), "device", *args], cwd=ROOT, capture_output=True, text=True,
                              env=env, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
    run = next((tmp_path / "host").glob("*-pair123-pair"))
    span = {name: tuple(map(float, (run / f"{name}.out").read_text().split())) for name in "abc"}
    assert span["b"][0] < span["a"][1] and span["a"][0] < span["b"][1], span  # a and b overlapped
    assert span["c"][0] >= max(span["a"][1], span["b"][1]), span  # c waited for both
    manifest = json.loads((run / "manifest.json").read_text())
    assert [s["rc"] for s in manifest["steps"]] == [0, 0, 0] and manifest["state"] == "done"


def test_with_next_on_the_last_step_or_on_three_steps_in_a_row_is_refused(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[steps]]\nname = "a"\nrun = "true"\nexpected_s = 1\nwith_next = true\n')
    with pytest.raises(campaign.CampaignError, match="last step"):
        campaign.load_campaign(str(bad))
    bad.write_text("".join(f'[[steps]]\nname = "{n}"\nrun = "true"\nexpected_s = 1\nwith_next = {w}\n\n'
                           for n, w in (("a", "true"), ("b", "true"), ("c", "false"))))
    with pytest.raises(campaign.CampaignError, match="two steps, not three"):
        campaign.load_campaign(str(bad))


def test_benchmarks_gpu_stays_small_and_every_manifest_the_findings_name_exists():
    """Issue 35: ``benchmarks/gpu/`` is one program, its campaign files and one manifest a run (at most
    40 files), and every ``results/<run>/manifest.json`` that ``docs/gpu-campaigns.md`` or a results
    note links to is there."""
    root = SCRIPT.parents[2]
    files = [p for p in (root / "benchmarks" / "gpu").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert len(files) <= 40, sorted(str(p.relative_to(root)) for p in files)
    named = set()
    for doc in [root / "docs" / "gpu-campaigns.md", *(root / "benchmarks" / "gpu" / "results").rglob("*.md")]:
        named |= set(re.findall(r"results/(\d{4}-\d\d-\d\d-[0-9a-f]{7}-[\w-]+)/manifest\.json", doc.read_text()))
        named |= set(re.findall(r"`(\d{4}-\d\d-\d\d-[0-9a-f]{7}-[\w-]+)`", doc.read_text()))
    assert named, "no run named"
    missing = sorted(n for n in named if not (root / "benchmarks" / "gpu" / "results" / n / "manifest.json").exists())
    assert not missing, missing
