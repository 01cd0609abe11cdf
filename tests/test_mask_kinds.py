"""One declaration per mask kind (`oracle.mask_kinds.MASK_KINDS`): the capabilities, the kernel
class and its templates, the strategies, the minimiser, the service's filter columns and the
bucket filter all read it, so a kind added there reaches every one of them."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import find as hypothesis_find
from sqlalchemy.dialects import sqlite

from fuzzer import minimise, strategies
from fuzzer.backends.base import Backend, BackendOutput, Capabilities
from fuzzer.worker import kernel_class
from fuzzer.strategies import KernelTemplate, attention_cases, merge_capabilities, usable_templates
from oracle import mask_kinds
from oracle.config import AttentionCase
from oracle.mask_kinds import MaskKind
from service.db import repository
from service.db.models import case_filter_columns
from service.errors import FieldValidationError
from service.export.repro import render_repro


@dataclasses.dataclass(frozen=True)
class ChunkedCase(AttentionCase):
    """`AttentionCase` with the field a newcomer adds to it for chunked local attention (Llama 4:
    a query sees the keys of its own chunk of ``chunk_size`` tokens; None = off)."""

    chunk_size: int | None = None


@dataclasses.dataclass(frozen=True)
class ChunkCapabilities(Capabilities):
    """`Capabilities` with the bool field the new kind's ``capability`` names."""

    chunks: bool = False


CHUNK = MaskKind(
    "chunk", ("chunk_size",), "bound", capability="chunks", reason="chunked attention",
    shrink="toward_zero", filter="chunk",
    filter_column="has_softcap",  # stands in for the column (and migration) a stored kind adds
)  # fmt: skip


@pytest.fixture
def chunk(monkeypatch: pytest.MonkeyPatch) -> MaskKind:
    """``chunk`` declared after the others, as a newcomer adds it; drawn cases are `ChunkedCase`
    (the field a newcomer adds to `AttentionCase` itself)."""
    monkeypatch.setattr(mask_kinds, "MASK_KINDS", (*mask_kinds.MASK_KINDS, CHUNK))
    monkeypatch.setattr(strategies, "AttentionCase", ChunkedCase)
    return CHUNK


class ChunkBackend(Backend):
    name = "chunk-standin"
    capabilities = ChunkCapabilities(windows=True)

    def run(self, case: AttentionCase, inputs, variant: str) -> BackendOutput:  # pragma: no cover - never run
        raise NotImplementedError


class PlainBackend(ChunkBackend):
    capabilities = ChunkCapabilities()


class ChunkingBackend(ChunkBackend):
    capabilities = ChunkCapabilities(windows=True, chunks=True)


FEW = settings(max_examples=60, database=None, deadline=None, suppress_health_check=list(HealthCheck))


def test_the_declaration_holds_today_s_kinds_and_their_readers_see_what_they_saw() -> None:
    assert [k.name for k in mask_kinds.MASK_KINDS] == ["causal", "window", "softcap"]
    assert mask_kinds.mask_filters() == ("none", "causal", "window", "causal_window") == repository.MASKS
    case = AttentionCase(seqlen_q=8, seqlen_k=8, causal=True, window_size_right=3, softcap=5.0)
    assert mask_kinds.switches(case) == (True, False, True, True)
    columns = case_filter_columns(case)
    assert {name: columns[name] for name in ("causal", "has_window", "has_softcap")} == dict.fromkeys(
        ("causal", "has_window", "has_softcap"), True)
    assert mask_kinds.filter_conditions("window") == {"causal": False, "has_window": True}
    backend = ChunkBackend()
    key = backend.kernel_key(case, "default")
    assert key == ("default", "bfloat16", 64, 64, False, True, False, True, True, "bshd", True)
    assert PlainBackend().unsupported_reasons(case, "default") == ["sliding window", "softcap"]
    assert kernel_class(case) == (True, False, True, True, True)
    assert case.has_mask and not AttentionCase(softcap=5.0).has_mask and AttentionCase(window_size_left=0).has_mask
    template = KernelTemplate.of(case)
    assert (template.causal, template.window_left, template.window_right, template.softcap, template.others) == (
        True, False, True, True, ())


def test_a_declared_kind_reaches_capabilities_and_the_kernel_class(chunk: MaskKind) -> None:
    case = ChunkedCase(seqlen_q=16, seqlen_k=16, chunk_size=4)
    backend = ChunkBackend()
    assert "chunked attention" in backend.unsupported_reasons(case, "default")  # capability not declared
    assert ChunkingBackend().unsupported_reasons(case, "default") == []
    assert backend.kernel_key(case, "default") != backend.kernel_key(case.replace(chunk_size=None), "default")
    assert kernel_class(case) == (False, False, False, False, True, True)  # the compile budget's class: + chunk
    assert case.has_mask and not case.replace(chunk_size=None).has_mask  # a kind of stage "mask" hides keys
    assert merge_capabilities([ChunkCapabilities(), ChunkCapabilities(chunks=True)]).chunks  # a bool merges by any
    template = KernelTemplate.of(case)
    assert template.others == (("chunk", (True,)),) and KernelTemplate.of(case.replace(chunk_size=None)).others == ()
    assert usable_templates([template], ChunkCapabilities(windows=True)) == ()
    assert usable_templates([template], ChunkCapabilities(chunks=True)) == (template,)


def test_a_declared_kind_is_drawn_only_where_granted_and_kept_by_templates(chunk: MaskKind) -> None:
    granted = ChunkCapabilities(dtypes=("bfloat16",), chunks=True)
    drawn = hypothesis_find(attention_cases(capabilities=granted, max_work=2**14), lambda c: c.chunk_size is not None, settings=FEW)
    assert isinstance(drawn, ChunkedCase) and drawn.chunk_size >= 0

    @FEW
    @given(attention_cases(capabilities=ChunkCapabilities(dtypes=("bfloat16",)), max_work=2**14))
    def never_without_the_capability(case: ChunkedCase) -> None:
        assert case.chunk_size is None

    never_without_the_capability()
    template = KernelTemplate.of(ChunkedCase(seqlen_q=4, seqlen_k=4, chunk_size=2))

    @FEW
    @given(attention_cases(capabilities=granted, max_work=2**14, kernel_templates=(template,), template_share=1.0))
    def from_the_template(case: ChunkedCase) -> None:
        assert case.chunk_size is not None and template.matches(case)

    from_the_template()


def test_a_declared_kind_is_shrunk_by_the_minimiser(chunk: MaskKind) -> None:
    case = ChunkedCase(seqlen_q=32, seqlen_k=32, chunk_size=17, softcap=7.0, seed=5)
    outcome = minimise.minimise(case, lambda c: c.chunk_size is not None and c.chunk_size >= 3, deadline_s=60)
    assert outcome.status == "minimised"
    assert outcome.case.chunk_size == 3 and outcome.case.softcap is None and isinstance(outcome.case, ChunkedCase)
    strategy, choices = minimise.neighbourhood(case)
    assert 17 in choices  # the bound is one integer choice, shrinking toward 0


def test_a_declared_kind_reaches_the_filter_columns_and_the_bucket_filter(chunk: MaskKind) -> None:
    assert case_filter_columns(ChunkedCase(chunk_size=2))["has_softcap"] is True
    assert case_filter_columns(ChunkedCase())["has_softcap"] is False
    assert "chunk" in mask_kinds.mask_filters() and "causal_window_chunk" in mask_kinds.mask_filters()
    assert mask_kinds.filter_conditions("causal_chunk") == {"causal": True, "has_window": False, "has_softcap": True}
    conditions = repository._bucket_filters(None, None, None, None, mask="window_chunk")
    sql = str(conditions[0].compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}))
    assert "cases.has_softcap = 1" in sql and "cases.has_window = 1" in sql and "cases.causal = 0" in sql
    with pytest.raises(FieldValidationError, match="causal_window_chunk"):
        repository._bucket_filters(None, None, None, None, mask="chunky")


def test_a_declaration_missing_its_words_or_its_column_is_refused() -> None:
    with pytest.raises(ValueError, match="reason"):
        MaskKind("x", ("seed",), "flag", capability="x")
    with pytest.raises(ValueError, match="filter_column"):
        MaskKind("x", ("seed",), "flag", filter="x")
    with pytest.raises(ValueError, match="template_fields"):
        MaskKind("x", ("seed",), "flag", template_fields=("a", "b"))


def test_a_declared_kind_s_fields_reach_the_exported_repro_s_case(chunk: MaskKind, tmp_path: Path) -> None:
    """The repro's ``CASE`` (what the portable core and the adapter's code read) carries every
    declared kind's fields: a new kind's field is there without a slot of its own."""
    case = ChunkedCase(seqlen_q=3, seqlen_k=5, num_heads=1, head_dim=8, dtype="float32", backward=False, chunk_size=2)
    source = render_repro(case, "torch-cpu-math", "is_causal", "out:mismatch", allowed={"out": 1.0, "lse": 1.0}).source
    path = tmp_path / "repro_chunk.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("repro_chunk", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.MASK_FIELDS == {"causal": False, "window_size_left": None, "window_size_right": None, "softcap": None,
                                  "chunk_size": 2}
    assert module.CASE.chunk_size == 2 and module.CASE.causal is False
