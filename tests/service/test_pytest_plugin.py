"""The pytest plugin (attnfuzz/pytest_plugin.py): corpus entries run as tests with their recorded
expectations, in a separate pytest process as a user would run it."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fuzzer.builds.corpus import CorpusEntry, save_entry
from oracle.config import AttentionCase

ROOT = Path(__file__).resolve().parents[2]
PLANTED = "tests.fuzzer.standins:PlantedWindowBackend"
CORRECT = "tests.fuzzer.standins:CorrectBackend"
CAUSAL = AttentionCase(seqlen_q=8, seqlen_k=8, num_heads=2, head_dim=16, dtype="float32", causal=True)


def _plugin_args() -> list[str]:
    installed = any(ep.value == "attnfuzz.pytest_plugin" for ep in importlib.metadata.entry_points(group="pytest11"))
    return [] if installed else ["-p", "attnfuzz.pytest_plugin"]


def _run(corpus: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pytest", *_plugin_args(), "-p", "no:cacheprovider", "-rA", "-q",
               "--attnfuzz-corpus", str(corpus), *extra, str(corpus)]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def _entry(backend: str, variant: str, status: str, signature: str | None, case: AttentionCase = CAUSAL) -> CorpusEntry:
    return CorpusEntry(case=case, backend=backend, variant=variant, why="test", expected_status=status,
                       expected_signature=signature)


def test_entries_that_behave_as_recorded_pass(tmp_path: Path) -> None:
    save_entry(tmp_path, _entry("planted-fa4", "te_window", "fail", "out:all_zero"))
    save_entry(tmp_path, _entry("planted-fa4", "native", "pass", None))
    run = _run(tmp_path, "--attnfuzz-backend", PLANTED)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout
    assert "planted-fa4/te_window[" in run.stdout and "planted-fa4/native[" in run.stdout


def test_an_entry_that_now_behaves_differently_fails_naming_the_signature(tmp_path: Path) -> None:
    save_entry(tmp_path, _entry("planted-fa4", "te_window", "pass", None))
    save_entry(tmp_path, _entry("standin-ok", "native", "fail", "out:all_zero"))
    run = _run(tmp_path, "--attnfuzz-backend", PLANTED, "--attnfuzz-backend", CORRECT)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "2 failed" in run.stdout
    assert "expected pass, got fail out:all_zero" in run.stdout
    assert "expected to fail with out:all_zero, but it passes" in run.stdout


def test_unknown_backends_skip_with_the_reason_and_bad_files_are_collection_errors(tmp_path: Path) -> None:
    save_entry(tmp_path, _entry("planted-fa4", "te_window", "fail", "out:all_zero"))
    run = _run(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 skipped" in run.stdout and "planted-fa4" in run.stdout and "--attnfuzz-backend" in run.stdout
    (tmp_path / "broken.json").write_text(json.dumps({"schema_version": 1, "case": {"seqlen_q": -1}}))
    run = _run(tmp_path)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "broken.json" in run.stdout and "seqlen_q" in run.stdout


def test_the_repository_corpus_is_collected_one_item_per_file(tmp_path: Path) -> None:
    import re

    run = _run(ROOT / "corpus", "--collect-only")
    assert run.returncode == 0, run.stdout + run.stderr
    expected = len(list((ROOT / "corpus").rglob("*.json")))
    assert re.search(rf"\b{expected} tests? collected", run.stdout), run.stdout
    assert "fa4/te_style[2fc6d5479e7969a3]" in run.stdout


def test_without_the_option_the_plugin_collects_nothing(tmp_path: Path) -> None:
    save_entry(tmp_path, _entry("planted-fa4", "te_window", "fail", "out:all_zero"))
    command = [sys.executable, "-m", "pytest", *_plugin_args(), "-p", "no:cacheprovider", "-q", str(tmp_path)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 5, run.stdout + run.stderr  # "no tests ran"
