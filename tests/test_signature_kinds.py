"""One declaration per signature kind (`oracle.signatures.KINDS`): the comparison, the severity,
the exported repro and the issue report all read it, so a kind added there shows everywhere."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from fuzzer import severity
from oracle import compare, emulate, signatures
from oracle.config import AttentionCase
from oracle.signatures import SignatureKind
from service.export import issue_report
from service.export.repro import render_repro

SIGN_FLIP = SignatureKind("sign_flip", "wrong", "returns {tensor} with the wrong sign", meaning="A = -R")


@pytest.fixture
def sign_flip(monkeypatch: pytest.MonkeyPatch) -> SignatureKind:
    """``sign_flip`` declared between ``all_zero`` and ``finite_on_masked``, as a newcomer adds it."""
    kinds = list(signatures.KINDS)
    kinds.insert([k.name for k in kinds].index("finite_on_masked"), SIGN_FLIP)
    monkeypatch.setattr(signatures, "KINDS", tuple(kinds))
    return SIGN_FLIP


def test_the_vocabulary_holds_today_s_kinds_in_compare_s_order() -> None:
    assert compare.SEVERITY == (
        "shape", "nan", "posinf", "neginf", "all_zero", "finite_on_masked", "mismatch", "tile_mismatch", "limit",
        "unjudgeable",
    )
    assert signatures.RATIO_KINDS.names() == {"mismatch", "tile_mismatch"}
    assert signatures.LIMIT_KINDS.names() == set(emulate.LIMIT_KINDS)  # the emulation's signatures are declared
    assert signatures.CRASH_SIGNATURES.names() == {"crash", "timeout", "oom"}
    assert set(signatures.SEVERITIES) == {k.severity for k in signatures.KINDS}
    for kind in signatures.KINDS:  # every phrase formats, with nothing left in braces
        text = signatures.phrase(f"out:{kind.name}" if kind.tensor else kind.name, tile_rows=64)
        assert "{" not in text and text != kind.name, kind


def test_grading_and_words_of_the_declared_kinds() -> None:
    assert severity.severity("out:all_zero") == "wrong"
    assert severity.severity("dq:mismatch", 2.0) == "imprecise"
    assert severity.severity("dq:mismatch", 10.0) == "wrong"
    assert severity.severity("dq:tile_mismatch", math.nan) == "wrong"
    assert severity.severity("dk:limit", math.inf) == "limit"
    assert severity.severity("dk:unjudgeable") == "limit"
    assert severity.severity("timeout") == "crash"
    assert severity.severity("error:ValueError") == "error"
    assert severity.severity("out:never_declared", 0.5) == "wrong"
    assert severity.severity("out:crash") == "wrong"  # a whole-call kind does not name a tensor
    assert severity.is_ratio_based("lse:tile_mismatch") and not severity.is_ratio_based("lse:nan")
    assert issue_report.signature_meaning("lse:tile_mismatch") == "returns a wrong lse in a tile of 64 rows"
    assert issue_report.signature_meaning("error:KeyError") == "raises KeyError"
    assert issue_report.signature_meaning("oom") == "runs out of memory"
    assert issue_report.signature_meaning("out:never_declared") == "out:never_declared"
    assert issue_report.signature_meaning(None) == "passes"


def test_a_kind_added_by_its_declaration_shows_in_compare_severity_export_and_report(
    sign_flip: SignatureKind, tmp_path: Path
) -> None:
    # compare: the verdict orders it where it is declared (after all_zero, before finite_on_masked)
    verdict = compare._verdict(
        "lse", ["mismatch", "finite_on_masked", "sign_flip", "all_zero"], rel_l2=1.0, max_abs=1.0,
        worst_tile_ratio=2.0, error_ratio=2.0, err_backend=1.0, err_baseline=0.5, worst_index=None, nan_count=0,
        posinf_count=0, neginf_count=0, is_all_zero=True,
    )
    assert verdict.signatures == ("lse:all_zero", "lse:sign_flip", "lse:finite_on_masked", "lse:mismatch")
    # severity: its declared severity, and the sets the service reads know it
    assert severity.severity("out:sign_flip", 1.5) == "wrong"
    assert "sign_flip" in severity.WRONG_KINDS and "sign_flip" not in severity.RATIO_KINDS
    # the issue report words it with its phrase
    assert issue_report.signature_meaning("dv:sign_flip") == "returns dv with the wrong sign"
    # the exported repro: its KINDS name it in order, and its judge writes it in that order
    case = AttentionCase(seqlen_q=3, seqlen_k=5, num_heads=1, head_dim=8, dtype="float32", backward=False)
    source = render_repro(case, "torch-cpu-math", "is_causal", "out:sign_flip", allowed={"out": 1.0, "lse": 1.0}).source
    path = tmp_path / "repro_sign_flip.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("repro_sign_flip", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.KINDS == signatures.tensor_kinds()
    assert module.KINDS.index("all_zero") + 1 == module.KINDS.index("sign_flip") == module.KINDS.index("finite_on_masked") - 1


def test_a_kind_is_checked_when_declared() -> None:
    with pytest.raises(ValueError, match="severity.*allowed: wrong, crash"):
        SignatureKind("sign_flip", "bad", "x")
    with pytest.raises(ValueError, match="not an identifier"):
        SignatureKind("sign flip", "wrong", "x")
