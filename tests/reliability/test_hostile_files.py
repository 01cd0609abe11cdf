"""Hostile files given to the CLI (issue 38, red team): ``cases add`` choked on deeply nested JSON
(a RecursionError traceback), blocked forever on a FIFO and read ``/dev/zero`` without bound;
``corpus export`` followed a symlinked directory out of the corpus and wrote there. Each is now
refused with exit 2 naming the file and what is wrong, quickly, and nothing is stored or written
outside the corpus."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fuzzer.results import BuildFingerprint, CaseResult
from oracle.config import AttentionCase
from service.db.engine import make_engine
from service.db.store import SqlStore
from tests.reliability.conftest import counts

pytestmark = pytest.mark.timeout(300)

GOOD = AttentionCase(seqlen_q=3, seqlen_k=5, head_dim=16, dtype="float32", causal=True)
# generous for a CLI start on a loaded 2-core machine; a blocking read never ends at all
EXIT_WAIT_S = 180


def _hostile(kind: str, tmp_path: Path) -> tuple[str, str]:
    """``(path, message)``: a hostile case file of ``kind`` and what the refusal must say."""
    if kind == "deep-nesting":
        path = tmp_path / "deep.json"
        path.write_text("[" * 200_000 + "]" * 200_000)
        return str(path), "nested too deeply"
    if kind == "fifo":
        path = tmp_path / "case.json"
        os.mkfifo(path)  # no writer: a blocking open or read never returns
        return str(path), "not a regular file"
    if kind == "dev-zero":
        return "/dev/zero", "not a regular file"
    if kind == "huge":
        path = tmp_path / "huge.json"
        case = json.dumps(GOOD.to_json())  # a valid case, then 2 MiB of white space: far above the bound
        path.write_text(case + " " * (2 * 2**20))
        return str(path), "bytes (allowed: at most"
    if kind == "directory":
        path = tmp_path / "cases.json"
        path.mkdir()
        return str(path), "not a regular file"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["deep-nesting", "fifo", "dev-zero", "huge", "directory"])
def test_cases_add_refuses_a_hostile_file_quickly_with_exit_2_and_stores_nothing(cli, sqlite_url, tmp_path, kind) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(GOOD.to_json()))
    path, message = _hostile(kind, tmp_path)
    before = counts(sqlite_url)
    run = cli("cases", "add", str(good), path, "--db", sqlite_url)
    code = run.wait(EXIT_WAIT_S)
    output = " ".join(run.output().split())
    assert code == 2, output[-3000:]
    assert "Traceback" not in output and "RecursionError" not in output, output[-3000:]
    assert os.path.basename(path) in output and message in output, output[-3000:]
    assert counts(sqlite_url) == before, "the good file before it was not stored either"


def test_corpus_export_does_not_write_through_a_symlinked_directory_out_of_the_corpus(cli, sqlite_url, tmp_path) -> None:
    # a database with one bucket, then an export into a corpus whose backend folder is a
    # symlink to a folder outside it
    engine = make_engine(sqlite_url)
    store = SqlStore(engine)
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    store.record_case(GOOD.to_json(), "fuzz")
    store.record_result(CaseResult(GOOD.case_id, "torch-cpu-math", "bool_mask", "fail", signature="out:mismatch"), build_id, None)
    engine.dispose()
    exported = cli("corpus", "export", "--root", str(tmp_path / "plain"), "--db", sqlite_url, "--json")
    assert exported.wait(EXIT_WAIT_S) == 0, exported.output()
    written = [Path(p).relative_to(tmp_path / "plain") for p in json.loads(exported.output())["files"]]
    assert written, "the export wrote no file to aim the symlinks at"

    outside = tmp_path / "outside"
    outside.mkdir()
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    first = written[0]
    (corpus / first.parts[0]).symlink_to(outside, target_is_directory=True)  # a symlinked backend folder
    before = {p: p.read_text() for p in outside.rglob("*") if p.is_file()}

    run = cli("corpus", "export", "--root", str(corpus), "--db", sqlite_url)
    code = run.wait(EXIT_WAIT_S)
    output = " ".join(run.output().split())
    assert code == 2, output[-3000:]
    assert "symlink" in output and "outside the corpus" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    after = {p: p.read_text() for p in outside.rglob("*") if p.is_file()}
    assert after == before, f"corpus export wrote outside the corpus: {sorted(set(after) - set(before))}"
