"""End to end on fake builds: environments that differ only in the installed version of
``attnfuzz-fakekernel`` (`tests.builds.fakebuilds`), each replayed in its own child process.

Acceptance: replay, regression and fix detection, and bisection with skips, through the CLI.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from sqlalchemy import select

from fuzzer.builds.bisect import max_replays
from fuzzer.results import version_key
from fuzzer.builds.corpus import CorpusEntry, save_entry
from oracle.config import AttentionCase
from service.db.engine import make_engine
from service.db.models import BisectRun, BisectStep, BuildPackage, Result
from tests.builds.conftest import BROKEN_VERSION, FAKE_BACKEND_SPEC
from tests.builds.fakebuilds import DEP, KERNEL

CASE = AttentionCase(seqlen_q=6, seqlen_k=6, num_heads=2, head_dim=16, dtype="float32", causal=True, backward=False)


def write_corpus(root: Path, te_style_expected: tuple[str, str | None]) -> Path:
    """The seed's two entries, on the fake kernel: TE's encoding and the library's own."""
    te_style = save_entry(root, CorpusEntry(CASE, "fake-kernel", "te_style", "TE's (-1, 0) encoding", *te_style_expected))
    save_entry(root, CorpusEntry(CASE, "fake-kernel", "native", "control: the library's own encoding", "pass"))
    return te_style


@pytest.mark.slow
def test_builds_replay_finds_the_regression_and_the_fix_and_skips_the_broken_build(cli, tmp_path, fake_wheelhouse, fake_rules):
    corpus = tmp_path / "corpus"
    write_corpus(corpus, ("pass", None))
    builds_dir, url = tmp_path / "builds", f"sqlite:///{tmp_path / 'matrix.db'}"
    versions = ["2.0", "1.0", BROKEN_VERSION, "1.2rc1", "1.1.2"]
    prepared = cli(
        "builds", "prepare", "--package", KERNEL, "--wheelhouse", fake_wheelhouse, "--builds-dir", builds_dir,
        "--rules", fake_rules, *[a for v in versions for a in ("--version", v)],
    )
    assert prepared.exit_code == 0, prepared.output

    replayed = cli(
        "builds", "replay", "--package", KERNEL, "--builds-dir", builds_dir, "--backend", FAKE_BACKEND_SPEC,
        "--corpus", corpus, "--db", url, "--isolation", "none", "--jobs", "2", "--json",
    )
    assert replayed.exit_code == 0, replayed.output
    report = json.loads(replayed.stdout)
    by_version = {b["version"]: b for b in report["builds"]}
    assert list(by_version) == sorted(versions, key=version_key), "builds replay in PEP 440 order (1.2rc1 < 1.2)"
    for version, build in by_version.items():
        assert build["reported_version"] == version, f"the child of {version} imported {build['reported_version']}"
    assert (by_version[BROKEN_VERSION]["results"], by_version[BROKEN_VERSION]["skips"]) == (0, 2)
    assert "cannot import attnfuzz_fakekernel" in by_version[BROKEN_VERSION]["verdicts"][0]["detail"]
    verdicts = {v: {r["variant"]: (r["status"], r["signature"]) for r in b["verdicts"]} for v, b in by_version.items()}
    assert verdicts["1.1.2"]["te_style"] == ("pass", None)
    assert verdicts["1.2rc1"]["te_style"] == ("fail", "out:all_zero")
    assert verdicts["2.0"]["te_style"] == ("pass", None)
    assert {verdicts[v]["native"] for v in verdicts if v != BROKEN_VERSION} == {("pass", None)}

    expected = [
        ("regression", "te_style", "1.1.2", "1.2rc1", "out:all_zero"),
        ("fix", "te_style", "1.2rc1", "2.0", None),
    ]
    assert [(t["kind"], t["variant"], t["before_version"], t["after_version"], t["after_signature"]) for t in report["transitions"]] == expected
    listed = cli("regressions", "--package", KERNEL, "--db", url, "--json")
    assert listed.exit_code == 0 and json.loads(listed.stdout) == report["transitions"]
    no_fixes = cli("regressions", "--package", KERNEL, "--db", url, "--no-fixes", "--json")
    assert [t["kind"] for t in json.loads(no_fixes.stdout)] == ["regression"]

    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(select(BuildPackage.build_id, BuildPackage.package, BuildPackage.version)).all()
    finally:
        engine.dispose()
    packages: dict[int, dict[str, str]] = {}
    for build_id, package, version in rows:
        packages.setdefault(build_id, {})[package] = version
    deps = {p[KERNEL]: p.get(DEP) for p in packages.values()}
    assert deps == {"1.0": "1.0", "1.1.2": "1.0", "1.2rc1": "1.0", BROKEN_VERSION: "1.0", "2.0": "2.0"}, (
        "each build ran with the dependency its rule or Requires-Dist asked for"
    )


@pytest.mark.slow
def test_bisect_finds_the_first_bad_build_in_five_replays_skipping_the_broken_one(cli, tmp_path, fake_wheelhouse, fake_rules):
    te_style = write_corpus(tmp_path / "corpus", ("fail", "out:all_zero"))
    builds_dir, url = tmp_path / "builds", f"sqlite:///{tmp_path / 'bisect.db'}"
    bisected = cli(
        "bisect", te_style, "--package", KERNEL, "--good", "1.0", "--bad", "1.4", "--plugin", FAKE_BACKEND_SPEC,
        "--wheelhouse", fake_wheelhouse, "--rules", fake_rules, "--builds-dir", builds_dir, "--db", url, "--json",
    )
    assert bisected.exit_code == 0, bisected.output
    report = json.loads(bisected.stdout)
    assert (report["status"], report["last_good"], report["first_bad"]) == ("found", "1.1.2", "1.2rc1")
    assert report["builds"] == 9 and report["replays"] == 5 <= max_replays(9, skips=1)
    steps = [(s["version"], s["verdict"]) for s in report["steps"]]
    assert steps == [("1.4", "bad"), ("1.0", "good"), ("1.1.2", "good"), (BROKEN_VERSION, "skip"), ("1.2rc1", "bad")]
    assert sorted(p.name for p in builds_dir.iterdir()) == sorted(f"{KERNEL}-{v}" for v, _ in steps), (
        "only the builds the search visited were prepared"
    )

    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            run = connection.execute(select(BisectRun.status, BisectRun.first_bad_version, BisectRun.replays)).one()
            stored = connection.execute(select(BisectStep.version, BisectStep.verdict, BisectStep.build_id).order_by(BisectStep.number)).all()
            results = connection.execute(select(Result.status, Result.signature).where(Result.phase == "replay")).all()
    finally:
        engine.dispose()
    assert tuple(run) == ("found", "1.2rc1", 5)
    assert [(v, verdict) for v, verdict, _ in stored] == steps and all(build_id is not None for *_, build_id in stored)
    assert sorted(results, key=str) == sorted([("fail", "out:all_zero")] * 2 + [("pass", None)] * 2, key=str)

    shutil.rmtree(builds_dir)
    resumed = cli(
        "bisect", te_style, "--package", KERNEL, "--good", "1.0", "--bad", "1.4", "--plugin", FAKE_BACKEND_SPEC,
        "--wheelhouse", fake_wheelhouse, "--rules", fake_rules, "--builds-dir", builds_dir, "--db", url, "--json",
    )
    again = json.loads(resumed.stdout)
    assert (again["status"], again["first_bad"], again["reused"]) == ("found", "1.2rc1", 4)
    assert [s["version"] for s in again["steps"] if not s["reused"]] == [BROKEN_VERSION], "only the skipped build is tried again"
    assert [p.name for p in builds_dir.iterdir()] == [f"{KERNEL}-{BROKEN_VERSION}"]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("--good", "1.0", "--bad", "b30"), 2, "bad: 'b30' is not a PEP 440 version"),
        (("--good", "1.0", "--bad", "9.0"), 2, "bad: no build attnfuzz-fakekernel==9.0"),
        (("--good", "1.4", "--bad", "1.0"), 2, "good: 1.4 must be older than bad: 1.0"),
    ],
)
def test_bisect_refuses_bad_ranges_naming_the_option(cli, tmp_path, fake_wheelhouse, args, code, message):
    te_style = write_corpus(tmp_path / "corpus", ("fail", "out:all_zero"))
    result = cli(
        "bisect", te_style, "--package", KERNEL, *args, "--plugin", FAKE_BACKEND_SPEC,
        "--wheelhouse", fake_wheelhouse, "--builds-dir", tmp_path / "builds", "--db", f"sqlite:///{tmp_path / 'x.db'}",
    )
    assert result.exit_code == code and message in " ".join(result.output.split())


def test_builds_prepare_needs_a_source_and_reports_a_build_it_cannot_prepare(cli, tmp_path, fake_wheelhouse, caplog):
    nothing = cli("builds", "prepare", "--package", KERNEL, "--builds-dir", tmp_path / "builds")
    assert nothing.exit_code == 2 and "wheelhouse: nothing to prepare" in " ".join(nothing.output.split())
    kernels_only = tmp_path / "kernels-only"
    kernels_only.mkdir()
    for version in ("1.1", "2.0"):
        shutil.copy(next(fake_wheelhouse.glob(f"attnfuzz_fakekernel-{version}-*.whl")), kernels_only)
    partial = cli("builds", "prepare", "--package", KERNEL, "--wheelhouse", kernels_only, "--builds-dir", tmp_path / "builds")
    # the failure is a logged error (the CLI's stdlib logging shows it on stderr) or in the output
    output = " ".join((partial.output + " " + caplog.text).split())
    assert partial.exit_code == 8 and "cannot prepare attnfuzz-fakekernel==2.0" in output and "attnfuzz-fakedep>=2" in output
    assert [p.name for p in (tmp_path / "builds").iterdir()] == [f"{KERNEL}-1.1"], "the other build is prepared all the same"
