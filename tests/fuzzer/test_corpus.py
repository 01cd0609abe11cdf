"""Tests of fuzzer/builds/corpus.py: the shipped corpus is valid, entries round-trip, bad files are named."""

import json
from pathlib import Path

import pytest

from fuzzer.builds.corpus import CorpusEntry, CorpusError, Verdict, load_corpus, save_entry
from fuzzer.results import BuildFingerprint
from oracle.config import AttentionCase

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_corpus_loads_and_holds_the_seed_cases():
    entries = load_corpus(ROOT / "corpus")
    keys = {(e.backend, e.variant, e.case.head_dim, e.expected_signature) for e in entries}
    assert ("fa4", "te_style", 128, "out:all_zero") in keys
    assert ("te-fa4", "mask_type", 512, "out:all_zero") in keys
    assert ("fa4", "native", 128, None) in keys
    for entry in entries:
        assert (ROOT / "corpus" / entry.relative_path).exists()


def test_an_entry_round_trips_and_keeps_one_verdict_per_build(tmp_path):
    entry = CorpusEntry(AttentionCase(causal=True, seqlen_q=3, seqlen_k=3), "fa4", "te_style", "why", "fail", "out:all_zero")
    build = BuildFingerprint(flash_attn_4="4.0.0b36")
    entry = entry.with_verdict(Verdict(build, "pass", None, "t1")).with_verdict(Verdict(build, "fail", "out:all_zero", "t2"))
    assert len(entry.verdicts) == 1 and entry.verdicts[0].recorded_at == "t2"
    path = save_entry(tmp_path, entry)
    (loaded,) = load_corpus(tmp_path)
    assert loaded == entry and path.name.startswith("te_style-")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema_version=0), "schema_version"),
        (lambda d: d["case"].update(num_heads=3, num_heads_kv=2), "case.num_heads_kv"),
        (lambda d: d.update(backend="../etc"), "backend"),
        (lambda d: d.update(expected={"status": "maybe", "signature": None}), "expected.status"),
        (lambda d: d.update(expected={"status": "fail", "signature": "import os"}), "expected.signature"),
        (lambda d: d.update(colour="red"), "colour"),
    ],
)
def test_malformed_files_are_rejected_naming_the_file_and_field(tmp_path, mutate, message):
    entry = CorpusEntry(AttentionCase(), "fa4", "native", "why", "pass")
    data = entry.to_json()
    mutate(data)
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(CorpusError, match=message) as info:
        load_corpus(tmp_path)
    assert "bad.json" in str(info.value)
