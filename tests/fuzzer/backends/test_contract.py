"""The backend contract, one suite over every registered backend.

Backends: every built-in `fuzzer.registry` knows (``discover(opt_in=True)``: the default set and
the opt-in CPU context-parallel ones) plus a sample plugin, `tests.fuzzer.backends.sample_adapter`,
loaded the way a user's plugin is: a ``module:attr`` spec (what ``--backend module:attr`` and an
``attnfuzz.backends`` entry point hold). A new backend is that one file plus that one line.

The contract (xFormers' and PyTorch OpInfo's "declared capabilities tested both ways"):

1. *Declared is drawn consistently*: every case `fuzzer.strategies.attention_cases` draws inside a
   backend's `Capabilities` passes the base capability check (`Backend.unsupported_reasons` of
   the base class), and some variant of at least a quarter of them is supported.
2. *Outside the declaration is reported*: a case that steps outside one capability (dtype,
   qkv_format, head_dim, head_dim_v, GQA, causal_alignment, windows, softcap, backward, cp_size)
   is unsupported by every variant, with a reason naming that field.
3. *Reasons name fields*: every reason names a case field, a variant, or one of the
   `FIELD_ALIASES`.
4. *Repro hook*: `Backend.repro` is overridden and, for a supported case and variant, returns a
   `ReproCall` whose source fills its ``$slots`` from plain values, defines ``check_environment``
   and ``call_backend``, and compiles.
5. *Declared runs, variants are equivalent* (needs the backend's device; GPU backends skip here):
   each supported (case, variant) of a few small drawn cases runs, is never ``unsupported``, and
   all variants of one case get the float64 oracle's same verdict: ``pass`` for every backend but
   the ones that plant bugs on purpose (`PLANTED`), which must agree across their variants.
6. *The repro is the same encoding* (needs the backend's device): the file ``attnfuzz export``
   writes for each supported variant (`service.export.repro.render_repro`) passes on a case the
   fuzzer passes, and fails where the kernel is wrong.
7. *One file, one line*: ``attnfuzz fuzz --backend <SAMPLE_SPEC>`` fuzzes the sample plugin.

Cases are small (seqlen <= 32, a few heads) and few (`DRAWS`, `RUNS`), so the suite takes seconds on
the 2-core CI machine.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import string

import pytest
from hypothesis import HealthCheck, given, settings

from fuzzer import registry
from fuzzer.backends.base import Backend, Capabilities, ReproCall
from fuzzer.evaluate import Evaluator
from fuzzer.executor import InProcessExecutor
from fuzzer.strategies import attention_cases, merge_capabilities, merge_rules
from oracle.config import CAUSAL_ALIGNMENTS, DTYPES, QKV_FORMATS, AttentionCase

SAMPLE_SPEC = "tests.fuzzer.backends.sample_adapter:SampleBackend"
"""The sample plugin's registry line: the ``module:attr`` a user passes to ``--backend``."""

PLANTED = frozenset({"cp-cpu-planted-window", "cp-cpu-planted-merge"})
"""Backends that exist to carry planted bugs (`fuzzer.backends.cp_cpu`): they must fail, so only the
agreement of their variants is checked, not a pass."""

NO_REPRO = {
    "torch-flex": "flex_attention's mask_mod is a Python closure; no repro call written yet",
    "cp-cpu-ring": "the CPU context-parallel backends exercise attnfuzz itself; nothing to export",
    "cp-cpu-planted-window": "the CPU context-parallel backends exercise attnfuzz itself; nothing to export",
    "cp-cpu-planted-merge": "the CPU context-parallel backends exercise attnfuzz itself; nothing to export",
}
"""Built-ins without a repro hook today: each is an expected failure of `test_repro_hook_returns_a_call`
(strict: writing the hook turns it into a pass that must be removed from here)."""

FIELD_ALIASES = ("window", "gqa", "mqa", "context parallelism", "mask", "sbhd", "thd", "bshd")
"""Words a reason may use for a field: ``window`` (window_size_left/right), GQA/MQA (num_heads_kv),
context parallelism (cp_size), mask (the mask encoding a variant stands for), a qkv_format value."""

DRAWS = 24
RUNS = 6
CASE_FIELDS = tuple(f.name for f in dataclasses.fields(AttentionCase))


@functools.lru_cache(maxsize=1)
def registered() -> dict[str, Backend]:
    """Every built-in (opt-in ones included) and the sample plugin, by name."""
    found = registry.discover([SAMPLE_SPEC], opt_in=True)
    return {name: backend for name, (backend, _spec) in found.items()}


def backend_names() -> list[str]:
    return sorted(registered())


@pytest.fixture(params=backend_names())
def backend(request) -> Backend:
    return registered()[request.param]


@functools.lru_cache(maxsize=None)
def drawn(name: str, max_cp_size: int = 2) -> tuple[AttentionCase, ...]:
    """`DRAWS` small cases drawn inside backend ``name``'s declaration (derandomised)."""
    seen: list[AttentionCase] = []
    caps = registered()[name].capabilities

    @settings(max_examples=DRAWS, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(attention_cases(capabilities=caps, max_batch_size=2, max_heads_kv=2, max_seqlen=32,
                           max_work=2**14, max_cp_size=max_cp_size))
    def collect(case):
        seen.append(case)

    collect()
    return tuple(seen)


def supported_variants(backend: Backend, case: AttentionCase) -> list[str]:
    return [v for v in backend.variants if not backend.unsupported_reasons(case, v)]


def names_a_field(reason: str, variants: tuple[str, ...]) -> bool:
    words = CASE_FIELDS + tuple(variants) + FIELD_ALIASES
    return any(re.search(r"(?<![A-Za-z0-9])" + re.escape(word), reason, re.IGNORECASE) for word in words)


# ----------------------------------------------------------------------------- declarations
def test_registry_holds_the_built_ins_and_the_sample_plugin():
    names = set(registered())
    assert {"torch-cpu-math", "torch-cpu-flash", "fa4", "fa2", "te-fused", "cp-cpu-ring", "sample-plugin"} <= names, names
    assert type(registered()["sample-plugin"]).__module__ == "tests.fuzzer.backends.sample_adapter"


def test_sample_plugin_is_selected_by_its_spec_like_a_user_plugin():
    selected = registry.select([], [SAMPLE_SPEC])
    assert [(b.name, spec) for b, spec in selected] == [("sample-plugin", SAMPLE_SPEC)]


def test_drawn_cases_pass_the_declared_capability_check(backend):
    cases = drawn(backend.name)
    assert cases, f"{backend.name}: nothing drawn inside its declaration"
    for case in cases:
        for variant in backend.variants:
            base = Backend.unsupported_reasons(backend, case, variant)
            assert not base, f"{backend.name}/{variant}: drawn inside its Capabilities but refused by them: {base} ({case.describe()})"


def test_most_drawn_cases_have_a_supported_variant(backend):
    cases = drawn(backend.name)
    runnable = [c for c in cases if supported_variants(backend, c)]
    assert len(runnable) * 4 >= len(cases), (  # cuDNN SDPA refuses seqlen_k 1 and head_dim < 16: 10 of 24
        f"{backend.name}: only {len(runnable)} of {len(cases)} cases drawn inside the declaration have a supported "
        "variant: the Capabilities block claims more than unsupported_reasons grants"
    )


def _inside(backend: Backend) -> AttentionCase:
    """A small case inside every part of ``backend``'s declaration (non-causal, no window)."""
    caps = backend.capabilities
    head_dim = max(caps.head_dim_multiple, min(64, caps.max_head_dim) // caps.head_dim_multiple * caps.head_dim_multiple)
    qkv_format = "bshd" if "bshd" in caps.qkv_formats else caps.qkv_formats[0]
    lengths = dict(batch_size=2, seqlens_q=(8, 8), seqlens_k=(8, 8)) if qkv_format == "thd" else {}
    return AttentionCase(seqlen_q=8, seqlen_k=8, num_heads=2, num_heads_kv=2, head_dim=head_dim,
                         dtype=caps.dtypes[0], qkv_format=qkv_format, backward=caps.backward, **lengths)


def outside_cases(backend: Backend) -> list[tuple[str, AttentionCase]]:
    """``(field word, case)`` for each capability the backend does not fully grant: the case steps
    outside that one capability and stays inside the others."""
    caps, base = backend.capabilities, _inside(backend)
    out: list[tuple[str, AttentionCase]] = []
    if missing := [d for d in DTYPES if d not in caps.dtypes]:
        out.append(("dtype", dataclasses.replace(base, dtype=missing[0])))
    if missing := [f for f in QKV_FORMATS if f not in caps.qkv_formats and f != "thd"]:
        out.append(("qkv_format", dataclasses.replace(base, qkv_format=missing[0])))
    m = caps.head_dim_multiple
    if (too_big := (caps.max_head_dim // m + 1) * m) <= 1024:
        out.append(("head_dim", dataclasses.replace(base, head_dim=too_big, head_dim_v=too_big)))
    if m > 1:
        out.append(("head_dim", dataclasses.replace(base, head_dim=base.head_dim + 1, head_dim_v=base.head_dim + 1)))
    if not caps.head_dim_v_differs:
        out.append(("head_dim_v", dataclasses.replace(base, head_dim_v=base.head_dim // 2 or base.head_dim + m)))
    if not caps.gqa:
        out.append(("num_heads_kv", dataclasses.replace(base, num_heads=2, num_heads_kv=1)))
    if missing := [a for a in CAUSAL_ALIGNMENTS if a not in caps.causal_alignments]:
        longer = dict(seqlen_k=12, seqlens_k=(12, 12) if base.is_varlen else None)
        out.append(("causal_alignment", dataclasses.replace(base, causal=True, causal_alignment=missing[0], **longer)))
    if not caps.windows:
        out.append(("window", dataclasses.replace(base, window_size_left=3)))
    if not caps.softcap:
        out.append(("softcap", dataclasses.replace(base, softcap=30.0)))
    if not caps.backward:
        out.append(("backward", dataclasses.replace(base, backward=True)))
    if not caps.cp:
        out.append(("cp_size", dataclasses.replace(base, cp_size=2, cp_comm_type="p2p")))
    return out


def test_the_inside_case_is_supported_by_some_variant(backend):
    case = _inside(backend)
    assert supported_variants(backend, case), (
        f"{backend.name}: a plain case inside its declaration is refused by every variant: "
        f"{ {v: backend.unsupported_reasons(case, v) for v in backend.variants} } ({case.describe()})"
    )


def test_outside_the_declaration_is_reported_naming_the_field(backend):
    cases = outside_cases(backend)
    for word, case in cases:
        for variant in backend.variants:
            reasons = backend.unsupported_reasons(case, variant)
            assert any(word in r for r in reasons), (
                f"{backend.name}/{variant}: a case outside its declared {word} got reasons {reasons} ({case.describe()})"
            )
            assert backend.supports(case, variant) is not None


def test_the_sample_plugin_has_something_outside_its_declaration():
    words = {word for word, _ in outside_cases(registered()["sample-plugin"])}
    assert {"dtype", "qkv_format", "head_dim", "num_heads_kv", "window", "softcap", "cp_size"} <= words, words


def test_unsupported_reasons_name_fields(backend):
    # the drawn cases of every backend's declaration (so variants' own limits show up too)
    union = [c for other in backend_names() for c in drawn(other)[:8]] + [c for _w, c in outside_cases(backend)]
    for case in union:
        for variant in backend.variants:
            for reason in backend.unsupported_reasons(case, variant):
                assert names_a_field(reason, backend.variants), f"{backend.name}/{variant}: reason names no field: {reason!r}"


def test_an_unknown_variant_is_unsupported_naming_it(backend):
    reasons = backend.unsupported_reasons(_inside(backend), "no-such-variant")
    assert any("variant" in r for r in reasons), reasons


# ----------------------------------------------------------------------------- repro hook
def _is_plain(value) -> bool:
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return value == value and abs(value) != float("inf")
    if isinstance(value, (tuple, list)):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


@pytest.fixture(params=backend_names())
def repro_backend(request) -> Backend:
    if request.param in NO_REPRO:
        request.applymarker(pytest.mark.xfail(reason=NO_REPRO[request.param], strict=True))
    return registered()[request.param]


def test_repro_hook_returns_a_call(repro_backend):
    backend = repro_backend
    assert type(backend).repro is not Backend.repro, f"{backend.name}: no repro hook (Backend.repro not overridden)"
    pairs = [(c, v) for c in (_inside(backend),) + drawn(backend.name) for v in supported_variants(backend, c)]
    assert pairs, f"{backend.name}: no supported case to write a repro for"
    for variant in backend.variants:
        case = next((c for c, v in pairs if v == variant), None)
        if case is None:
            continue
        call = backend.repro(case, variant)
        assert isinstance(call, ReproCall), f"{backend.name}/{variant}: repro returned {type(call).__name__}"
        assert call.device in ("cpu", "cuda") and _is_plain(call.values), (call.device, call.values)
        source = string.Template(call.source).substitute({k: repr(v) for k, v in call.values.items()})
        code = compile(source, f"<repro {backend.name}/{variant}>", "exec")
        assert {"check_environment", "call_backend"} <= set(code.co_names), f"{backend.name}/{variant}: {code.co_names}"


def test_the_sample_plugin_repro_refuses_an_unknown_variant():
    with pytest.raises(ValueError, match="variant"):
        registered()["sample-plugin"].repro(_inside(registered()["sample-plugin"]), "no-such-variant")


EXPORT_CASE = AttentionCase(seqlen_q=9, seqlen_k=12, num_heads=2, head_dim=32, causal=True,
                            causal_alignment="bottom_right", backward=True)
"""A case for the exported repros: causal with bottom-right alignment (rows 0..2 see 4..6 keys) and
gradients; a backend that cannot run it is given its first drawn supported case instead."""


def exported_test(backend: Backend, case: AttentionCase, variant: str):
    """The test function of the repro file ``attnfuzz export`` writes for ``case``/``variant``
    (`service.export.repro.render_repro`, signature None: it fails on any failure), loaded in
    this process."""
    from service.export.repro import render_repro

    repro = render_repro(case, backend, variant, None)
    namespace: dict = {"__name__": f"repro_{backend.name}_{variant}"}
    exec(compile(repro.source, repro.filename, "exec"), namespace)
    tests = [value for key, value in namespace.items() if key.startswith("test_")]
    assert len(tests) == 1, sorted(namespace)
    return tests[0]


def test_the_exported_repro_of_every_variant_runs_and_agrees_with_the_oracle(repro_backend):
    """Each variant's repro call (`Backend.repro`, pasted into the exported file) is the same
    encoding as `run`: on a case the fuzzer passes, the exported file passes too."""
    backend = repro_backend
    if type(backend).repro is Backend.repro:
        pytest.fail(f"{backend.name}: no repro hook")
    reason = backend.availability()
    if reason is not None:
        pytest.skip(f"{backend.name}: {reason}")
    case = EXPORT_CASE if supported_variants(backend, EXPORT_CASE) else next(
        c for c in drawn(backend.name, max_cp_size=1) if supported_variants(backend, c))
    for variant in supported_variants(backend, case):
        exported_test(backend, case, variant)()  # raises AssertionError naming the figures on a mismatch


def test_an_exported_repro_fails_where_the_kernel_is_wrong():
    """The check above can fail: the repro of a plugin that ignores softcap fails on a softcap case."""
    from tests.fuzzer.backends.sample_adapter import SampleBackend

    class ClaimsSoftcap(SampleBackend):
        name = "sample-claims-softcap"
        capabilities = dataclasses.replace(SampleBackend.capabilities, softcap=True)

    case = dataclasses.replace(EXPORT_CASE, softcap=2.0, backward=False)
    with pytest.raises(AssertionError):
        exported_test(ClaimsSoftcap(), case, "bool_mask")()


# ----------------------------------------------------------------------------- running
def test_declared_cases_run_and_variants_agree_with_the_oracle(backend):
    reason = backend.availability()
    if reason is not None:
        pytest.skip(f"{backend.name}: {reason}")
    cases = [c for c in drawn(backend.name, max_cp_size=1) if supported_variants(backend, c)][:RUNS]
    assert cases, f"{backend.name}: no runnable case drawn"
    specs = [(backend, backend.name)]
    evaluator = Evaluator(specs, InProcessExecutor(specs), device=backend.device)
    returned_lse = False
    with evaluator:
        for case in cases:
            results = evaluator.evaluate(case, tasks=[(backend.name, v) for v in supported_variants(backend, case)]).results
            statuses = {r.variant: r.status for r in results}
            assert "unsupported" not in statuses.values(), f"{backend.name}: declared but refused at run time: {statuses} ({case.describe()})"
            if backend.name in PLANTED:
                assert len(set(statuses.values())) == 1, f"{backend.name}: variants disagree: {statuses} ({case.describe()})"
            else:
                details = {r.variant: r.signature or r.detail for r in results if r.status != "pass"}
                assert set(statuses.values()) == {"pass"}, f"{backend.name}: {statuses} {details} ({case.describe()})"
            returned_lse = returned_lse or any(r.metrics.get("lse") for r in results)
    assert returned_lse or not backend.capabilities.lse, f"{backend.name}: declares lse, no variant returned one"


def test_a_declaration_that_claims_too_much_is_caught():
    """The checks above can fail: a copy of the sample plugin that declares softcap (and ignores
    it) no longer reports softcap as unsupported, and its softcap cases fail against the oracle."""
    from tests.fuzzer.backends.sample_adapter import SampleBackend

    class ClaimsSoftcap(SampleBackend):
        name = "sample-claims-softcap"
        capabilities = dataclasses.replace(SampleBackend.capabilities, softcap=True)

    liar = ClaimsSoftcap()
    assert "softcap" not in {word for word, _ in outside_cases(liar)}
    case = dataclasses.replace(_inside(liar), softcap=2.0, backward=False)
    assert supported_variants(liar, case) == list(liar.variants)
    specs = [(liar, liar.name)]
    with Evaluator(specs, InProcessExecutor(specs), device="cpu") as evaluator:
        statuses = {r.variant: r.status for r in evaluator.evaluate(case).results}
    assert statuses == {"bool_mask": "fail", "additive_bias": "fail"}, statuses


# ----------------------------------------------------------------------------- the union of declarations
def test_every_capability_field_has_a_union_rule():
    assert set(merge_rules()) == {f.name for f in dataclasses.fields(Capabilities)}


def test_a_new_int_field_without_a_union_rule_is_refused():
    wider = dataclasses.make_dataclass("Wider", [("max_batch_size", int, 8)], bases=(Capabilities,), frozen=True)
    with pytest.raises(TypeError, match="max_batch_size"):
        merge_rules(wider)


def test_a_new_bool_or_tuple_field_is_merged_not_left_at_its_default():
    wider = dataclasses.make_dataclass(
        "Wider", [("fp8", bool, False), ("mask_kinds", tuple[str, ...], ())], bases=(Capabilities,), frozen=True
    )
    merged = merge_capabilities([wider(fp8=True, mask_kinds=("block",)), wider(mask_kinds=("paged", "block"))])
    assert type(merged) is wider and merged.fp8 is True and merged.mask_kinds == ("block", "paged"), merged


def test_the_union_of_the_sample_plugin_and_te_unfused_takes_the_wider_of_each_field():
    sample, unfused = registered()["sample-plugin"].capabilities, registered()["te-unfused"].capabilities
    merged = merge_capabilities([sample, unfused])
    assert merged == dataclasses.replace(
        unfused, max_seqlen=max(sample.max_seqlen, unfused.max_seqlen), lse=True, cp=False
    ), merged
    narrow = merge_capabilities([sample, dataclasses.replace(sample, head_dim_multiple=8, dtypes=("float16", "bfloat16"))])
    assert narrow.head_dim_multiple == 1 and narrow.dtypes == ("bfloat16", "float16"), narrow


# ----------------------------------------------------------------------------- one file, one line
@pytest.mark.slow
def test_the_sample_plugin_is_fuzzed_end_to_end_by_its_registry_line(tmp_path, monkeypatch):
    """``attnfuzz fuzz --backend <SAMPLE_SPEC>``: the file and its line are all attnfuzz needs."""
    import json

    from typer.testing import CliRunner

    from service.cli.main import app

    monkeypatch.chdir(tmp_path)
    run = CliRunner().invoke(app, [
        "fuzz", "--backend", SAMPLE_SPEC, "--isolation", "none", "--max-cases", "4", "--db", "sqlite:///run.db",
        "--no-shrink", "--no-replay", "--corpus", "", "--json", "--spool-dir", str(tmp_path / "spool"),
    ], env={"COLUMNS": "250"})
    assert run.exit_code == 0, run.output
    summary = json.loads(run.stdout)
    evaluations = summary["evaluations_by_backend"]
    assert list(evaluations) == ["sample-plugin"] and set(evaluations["sample-plugin"]) == {"pass"}, summary
    assert summary["cases"] >= 1 and evaluations["sample-plugin"]["pass"] >= summary["cases"], summary
