"""Every saved corpus case keeps its recorded verdict where its backend is available.

Parametrised over ``corpus/**/*.json``: each entry is replayed on this machine (`fuzzer.builds.replay.
replay_here`) and must find what its ``expected`` says (``pass``, or a failure with the same
primary signature). An entry whose backend is not available here (the seed's entries are all GPU
backends) or that the backend declares unsupported here (head_dim 512 on SM90) is skipped with
the reason. The same check runs over a temporary corpus of CPU-backend entries, one of them a
planted failure, so that it demonstrably passes and fails on this machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fuzzer import registry
from fuzzer.builds.corpus import CorpusEntry, load_corpus, save_entry
from fuzzer.builds.replay import matches_expectation, replay_here, tasks_from_corpus
from oracle.config import AttentionCase

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "corpus"
PLANTED_SPEC = "tests.fuzzer.standins:PlantedWindowBackend"


def check_keeps_its_verdict(entry: CorpusEntry, plugins: tuple[str, ...] = ()) -> None:
    """Replay ``entry`` here and assert its expectation; skip (with the reason) when it cannot run."""
    known = registry.discover(plugins)
    if entry.backend not in known:
        pytest.skip(f"backend {entry.backend!r} is not known here (known: {', '.join(sorted(known))})")
    backend, spec = known[entry.backend]
    reason = backend.availability()
    if reason:
        pytest.skip(f"{entry.backend} is not available here: {reason}")
    (task,) = tasks_from_corpus([entry])
    isolation = "process" if backend.device == "cuda" else "none"
    outcome = replay_here([task], [(entry.backend, spec)], device=backend.device, isolation=isolation)
    verdict = outcome.verdict(task)
    if verdict.status in ("unsupported", "skip"):
        pytest.skip(f"{entry.backend}/{entry.variant} cannot run this case here: {verdict.detail}")
    expected = entry.expected_status + (f" {entry.expected_signature}" if entry.expected_signature else "")
    assert matches_expectation(task, verdict), (
        f"{entry.relative_path}: expected {expected}, got {verdict.status} {verdict.signature or ''} "
        f"on {outcome.fingerprint.device_name} ({entry.why}); detail: {verdict.detail[-300:]}"
    )


@pytest.mark.parametrize("path", sorted(CORPUS.rglob("*.json")), ids=lambda p: p.relative_to(CORPUS).as_posix())
def test_a_saved_case_keeps_its_recorded_verdict(path: Path) -> None:
    (entry,) = [e for e in load_corpus(CORPUS) if CORPUS / e.relative_path == path]
    check_keeps_its_verdict(entry)


CAUSAL = AttentionCase(seqlen_q=6, seqlen_k=6, num_heads=2, head_dim=16, dtype="float32", causal=True, backward=False)
CPU_ENTRIES = [
    CorpusEntry(CAUSAL, "torch-cpu-math", "is_causal", "causal on the math kernel", "pass"),
    CorpusEntry(CAUSAL.replace(window_size_left=2), "torch-cpu-math", "bool_mask", "a sliding window as a mask", "pass"),
    CorpusEntry(CAUSAL, "planted-fa4", "native", "control of the planted bug", "pass"),
    CorpusEntry(CAUSAL, "planted-fa4", "te_window", "the planted seed bug", "fail", "out:all_zero"),
]


@pytest.fixture
def cpu_corpus(tmp_path: Path) -> list[CorpusEntry]:
    for entry in CPU_ENTRIES:
        save_entry(tmp_path, entry)
    return load_corpus(tmp_path)


@pytest.mark.parametrize("index", range(len(CPU_ENTRIES)), ids=[f"{e.backend}-{e.variant}" for e in CPU_ENTRIES])
def test_a_cpu_corpus_case_keeps_its_recorded_verdict(cpu_corpus: list[CorpusEntry], index: int) -> None:
    (entry,) = [e for e in cpu_corpus if e.relative_path == CPU_ENTRIES[index].relative_path]
    check_keeps_its_verdict(entry, (PLANTED_SPEC,))


def test_a_case_that_lost_its_recorded_verdict_fails_the_check() -> None:
    wrong = CorpusEntry(CAUSAL, "planted-fa4", "te_window", "claims the planted bug is fixed", "pass")
    with pytest.raises(AssertionError, match=r"expected pass, got fail out:all_zero"):
        check_keeps_its_verdict(wrong, (PLANTED_SPEC,))
