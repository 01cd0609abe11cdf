"""`service.export`: the generated repro regenerates the inputs bit for bit, its inline reference
agrees with the oracle, it calls each backend as the adapter does, and only literals get in."""

from __future__ import annotations

import ast
import re
import importlib.util
import math
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from fuzzer.backends.base import Backend, ReproCall
from fuzzer.backends.fa2 import fa2_call_kwargs
from fuzzer.backends.fa4 import fa4_call_kwargs
from fuzzer.backends.te import TEFA4Backend, te_forward_kwargs, te_module_kwargs
from oracle.config import AttentionCase
from oracle.inputs import make_inputs
from oracle.reference import reference
from service.export.allowance import allowed_errors
from service.export.backend import exportable_backends
from service.export.repro import render_repro
from service.export.safety import ExportError, check_only_literals, fill_template, literal, validated_case
from tests.fuzzer.standins import _resolve_like_fa4_after_2490, attention_with_band

INPUT_CASES = [
    AttentionCase(batch_size=2, seqlen_q=5, seqlen_k=7, num_heads=4, num_heads_kv=2, head_dim=16),
    AttentionCase(seqlen_q=3, seqlen_k=9, head_dim=8, head_dim_v=24, dtype="float16", input_distribution="large_logits", seed=7),
    AttentionCase(batch_size=2, seqlen_q=33, seqlen_k=17, num_heads=2, head_dim=32, dtype="float32", input_distribution="outliers", seed=123),
    AttentionCase(seqlen_q=4, seqlen_k=65, num_heads=3, num_heads_kv=1, head_dim=16, input_distribution="near_constant", seed=2**32 - 1),
    AttentionCase(batch_size=3, seqlen_q=6, seqlen_k=9, num_heads=2, head_dim=8, qkv_format="thd",
                  seqlens_q=(6, 1, 4), seqlens_k=(9, 2, 3), dtype="float32"),
    AttentionCase(batch_size=2, seqlen_q=5, seqlen_k=5, num_heads=2, head_dim=8, qkv_format="sbhd", seed=99),
    # the input families: every one of them (found by a new-user trial: a repro of a case drawn with
    # families regenerated plain inputs and passed while the case failed)
    AttentionCase(batch_size=2, seqlen_q=6, seqlen_k=9, num_heads=4, num_heads_kv=2, head_dim=16, dtype="float16",
                  qk_rank=4, massive_channels=2, seq_scale_log2=2, attention_sink=True, peaked_rows=0.5,
                  score_offset=-60.0, score_offset_mode="row", dout_distribution="sparse", seed=5),
    AttentionCase(batch_size=3, seqlen_q=6, seqlen_k=9, num_heads=2, head_dim=8, qkv_format="thd",
                  seqlens_q=(6, 1, 4), seqlens_k=(9, 2, 3), dtype="bfloat16", qk_rank=2, score_offset=120.0,
                  peaked_rows=0.25, dout_distribution="large", seed=11),
    AttentionCase(seqlen_q=3, seqlen_k=40, num_heads=2, head_dim=8, dtype="float16", input_distribution="outliers",
                  dout_distribution="tiny", seed=17),
]

REFERENCE_CASES = [
    AttentionCase(batch_size=2, seqlen_q=5, seqlen_k=7, num_heads=4, num_heads_kv=2, head_dim=16, causal=True,
                  causal_alignment="bottom_right", dtype="float32"),
    AttentionCase(seqlen_q=9, seqlen_k=4, num_heads=2, head_dim=8, causal=True, causal_alignment="bottom_right",
                  dtype="float32"),  # rows without a visible key
    AttentionCase(seqlen_q=7, seqlen_k=11, num_heads=2, head_dim=8, window_size_left=2, window_size_right=1,
                  softcap=5.0, dtype="float32"),
    AttentionCase(batch_size=3, seqlen_q=6, seqlen_k=9, num_heads=4, num_heads_kv=2, head_dim=8, head_dim_v=12,
                  qkv_format="thd", seqlens_q=(6, 1, 4), seqlens_k=(9, 2, 3), causal=True,
                  causal_alignment="bottom_right", window_size_left=3, dtype="float32"),
    AttentionCase(seqlen_q=6, seqlen_k=6, num_heads=1, head_dim=8, window_size_left=0, backward=False),
]


def load_generated(source: str, tmp_path: Path, name: str = "generated_repro") -> types.ModuleType:
    """Import a generated repro file as a module."""
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu_repro(case: AttentionCase, tmp_path: Path, backend: str = "torch-cpu-math", variant: str = "is_causal"):
    return load_generated(render_repro(case, backend, variant, None).source, tmp_path)


# ---------------------------------------------------------------------------------- inputs
@pytest.mark.parametrize("case", INPUT_CASES, ids=lambda c: c.describe())
def test_inline_inputs_are_bit_identical_to_the_oracle(case: AttentionCase, tmp_path: Path) -> None:
    module = cpu_repro(case, tmp_path)
    q, k, v, dout, cu_q, cu_k = module.make_inputs("cpu")
    expected = make_inputs(case)
    for name, got in zip(("q", "k", "v", "dout"), (q, k, v, dout)):
        want = getattr(expected, name)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got.view(torch.int16 if got.element_size() == 2 else torch.int32),
                           want.view(torch.int16 if want.element_size() == 2 else torch.int32)), name
    if case.is_varlen:
        assert torch.equal(cu_q, expected.cu_seqlens_q) and torch.equal(cu_k, expected.cu_seqlens_k)
    else:
        assert cu_q is None and cu_k is None


# ------------------------------------------------------------------------------- reference
@pytest.mark.parametrize("case", REFERENCE_CASES, ids=lambda c: c.describe())
def test_inline_reference_agrees_with_the_oracle(case: AttentionCase, tmp_path: Path) -> None:
    module = cpu_repro(case, tmp_path, variant="bool_mask" if case.has_mask else "is_causal")
    q, k, v, dout, _, _ = module.make_inputs("cpu")
    inline = module.reference(q, k, v, dout)
    oracle = reference(case, make_inputs(case), backward=case.backward)
    for name in ("out", "lse", "dq", "dk", "dv"):
        want = getattr(oracle, name)
        got = inline[name]
        if want is None:
            assert got is None, name
            continue
        assert got.shape == want.shape, name
        assert torch.equal(torch.isinf(got), torch.isinf(want)), f"{name}: -inf rows differ"
        finite = torch.isfinite(want)
        assert torch.allclose(got[finite], want[finite], rtol=1e-10, atol=1e-12), name


def test_allowed_errors_are_the_oracles_global_allowance() -> None:
    case = REFERENCE_CASES[0]
    allowed = allowed_errors(case)
    assert set(allowed) == {"out", "lse", "dq", "dk", "dv"}
    assert all(0 < a < 1e-3 for a in allowed.values()), allowed  # float32: tight, but not zero


# -------------------------------------------------------------------------- whole files
def _run_pytest(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(path)],
        capture_output=True, text=True, timeout=300, cwd=path.parent,
    )


def test_a_cpu_sdpa_repro_passes_under_plain_pytest(tmp_path: Path) -> None:
    case = REFERENCE_CASES[0].replace(dtype="bfloat16")
    repro = render_repro(case, "torch-cpu-math", "bool_mask", None)
    path = tmp_path / repro.filename
    path.write_text(repro.source)
    run = _run_pytest(path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


def test_the_generated_file_imports_nothing_of_attnfuzz() -> None:
    source = render_repro(REFERENCE_CASES[0], "fa4", "te_style", "out:all_zero").source
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            modules.add((node.module or "").split(".")[0])
    assert modules <= {"__future__", "math", "os", "pytest", "torch", "warnings", "flash_attn"}, modules
    assert "oracle" not in source.replace("oracle/", "") and "service." not in source


@pytest.mark.parametrize("backend, variant", [("torch-cpu-math", "is_causal"), ("fa4", "te_style"), ("fa2", "native")])
def test_the_file_carries_the_oracle_s_portable_core_byte_for_byte(backend: str, variant: str) -> None:
    from oracle import portable
    from service.export.template import PORTABLE_BEGIN, PORTABLE_END

    core = Path(portable.__file__).read_bytes()
    source = render_repro(INPUT_CASES[6], backend, variant, "out:mismatch").source.encode()
    assert source.count(PORTABLE_BEGIN.encode()) == 1 and source.count(PORTABLE_END.encode()) == 1
    copy = source.split(PORTABLE_BEGIN.encode(), 1)[1].split(PORTABLE_END.encode(), 1)[0]
    assert copy == core
    # the file's inputs and judging are the core's: no second implementation of them in the file
    rest = source.replace(copy, b"")
    for name in (b"def _mix32", b"def hash_normal_torch", b"def _llm_like_and_offsets", b"def key_bounds",
                 b"def _attend", b"def tile_judge"):
        assert name in copy and name not in rest, name


def test_a_gpu_repro_skips_with_the_reason_without_cuda(tmp_path: Path) -> None:
    repro = render_repro(REFERENCE_CASES[0].replace(dtype="bfloat16"), "fa4", "te_style", "out:all_zero")
    path = tmp_path / repro.filename
    path.write_text(repro.source)
    run = _run_pytest(path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 skipped" in run.stdout and "needs a CUDA GPU" in run.stdout


def test_the_file_name_and_docstring_name_backend_variant_and_signature() -> None:
    repro = render_repro(REFERENCE_CASES[0], "te-fa4", "mask_type", "out:all_zero")
    assert repro.filename == f"test_attnfuzz_te_fa4_mask_type_{REFERENCE_CASES[0].case_id}.py"
    doc = ast.get_docstring(ast.parse(repro.source))
    assert "te-fa4 / mask_type / out:all_zero" in doc and "ALLOWED" in doc


# ------------------------------------------------------------- GPU snippets with fake libraries
def _fake_fa_module(planted: bool, calls: list[dict]):
    """flash_attn_func/flash_attn_varlen_func computing attention on the CPU; ``planted`` resolves
    windows like flash-attention after PR #2490 (the seed bug)."""

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), return_lse=False,
                        softcap=0.0, dropout_p=0.0, return_attn_probs=False):
        calls.append(dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size, return_lse=return_lse,
                          return_attn_probs=return_attn_probs, dropout_p=dropout_p))
        left, right = window_size
        left = None if left is not None and left < 0 and not planted else left
        right = None if right is not None and right < 0 and not planted else right
        if planted:
            left, right = _resolve_like_fa4_after_2490(causal, left, right)
        elif causal:
            right = 0
        out, lse = attention_with_band(q, k, v, softmax_scale, left, right, k.shape[1] - q.shape[1])
        return (out, lse, None) if return_attn_probs else (out, lse)

    return types.SimpleNamespace(flash_attn_func=flash_attn_func)


FA4_CASE = AttentionCase(batch_size=2, seqlen_q=9, seqlen_k=9, num_heads=2, head_dim=16, causal=True,
                         causal_alignment="bottom_right", dtype="bfloat16")


def _with_fake(monkeypatch, module, names: list[str], fake) -> None:
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, names[-1], fake)
    if len(names) > 1:
        monkeypatch.setattr(sys.modules[names[0]], names[1].split(".")[-1], fake, raising=False)
    monkeypatch.setattr(module, "DEVICE", "cpu")
    monkeypatch.setattr(module, "check_environment", lambda: None)


@pytest.mark.parametrize(("planted", "passes", "qkv_format"), [(False, True, "bshd"), (True, False, "bshd"),
                                                                (False, True, "sbhd")])
def test_fa4_snippet_calls_flash_attn_as_the_variant_did(monkeypatch, tmp_path: Path, planted: bool, passes: bool,
                                                         qkv_format: str) -> None:
    """The FA4 repro (with FA4's own layout helpers copied in, sbhd as strided views) against a
    fake flash_attn.cute: the planted build fails with the recorded signature, the fixed passes."""
    case = FA4_CASE.replace(qkv_format=qkv_format)
    module = load_generated(render_repro(case, "fa4", "te_style", "out:all_zero").source, tmp_path)
    calls: list[dict] = []
    fake = _fake_fa_module(planted, calls)
    _with_fake(monkeypatch, module, ["flash_attn", "flash_attn.cute", "flash_attn.cute.interface"], fake)
    monkeypatch.setattr(sys.modules["flash_attn.cute"], "interface", fake, raising=False)
    if passes:
        module.test_attnfuzz_repro()
    else:
        with pytest.raises(AssertionError, match=r"fa4/te_style: out:all_zero.*recorded signature out:all_zero"):
            module.test_attnfuzz_repro()
    expected = fa4_call_kwargs(case, "te_style")
    assert {k: calls[0][k] for k in expected} == expected
    assert calls[0]["window_size"] == (-1, 0)


def test_fa2_snippet_sends_the_fa2_keywords(monkeypatch, tmp_path: Path) -> None:
    case = FA4_CASE.replace(window_size_left=3)
    module = load_generated(render_repro(case, "fa2", "causal_as_window", None).source, tmp_path)
    calls: list[dict] = []
    _with_fake(monkeypatch, module, ["flash_attn"], _fake_fa_module(False, calls))
    module.test_attnfuzz_repro()
    expected = fa2_call_kwargs(case, "causal_as_window")
    assert {k: calls[0][k] for k in ("causal", "window_size", "softmax_scale", "return_attn_probs")} == {
        k: expected[k] for k in ("causal", "window_size", "softmax_scale", "return_attn_probs")
    }


def test_te_snippet_builds_the_module_and_forward_call_of_the_variant(monkeypatch, tmp_path: Path) -> None:
    case = FA4_CASE.replace(causal_alignment="top_left")
    module = load_generated(render_repro(case, "te-fa4", "explicit_window", "out:all_zero").source, tmp_path)
    seen: dict = {}

    class DotProductAttention(torch.nn.Module):
        def __init__(self, **kwargs):
            super().__init__()
            seen["module"] = kwargs

        def forward(self, q, k, v, **kwargs):
            seen["forward"] = kwargs
            out, _ = attention_with_band(q, k, v, kwargs.get("softmax_scale", case.softmax_scale), None, 0, 0)
            return out.reshape(*out.shape[:2], -1)

    fake = types.SimpleNamespace(DotProductAttention=DotProductAttention)
    _with_fake(monkeypatch, module, ["transformer_engine", "transformer_engine.pytorch"], fake)
    monkeypatch.setattr(sys.modules["transformer_engine"], "pytorch", fake, raising=False)
    module.test_attnfuzz_repro()
    assert seen["module"] == te_module_kwargs(case, "explicit_window")
    assert seen["forward"] == te_forward_kwargs(case, "explicit_window")
    assert module.TE_ENVIRONMENT == TEFA4Backend.env_vars


# ------------------------------------------------------------------------------- injection
@pytest.mark.parametrize(
    "value",
    [
        "x'); import os; os.system('id') #",
        "a\nb",
        "__import__('os')",
        float("nan"),
        float("inf"),
        object(),
        {1: 2},
        type("EvilStr", (str,), {"__repr__": lambda self: "__import__('os')"})("ok"),
        type("EvilInt", (int,), {"__repr__": lambda self: "__import__('os')"})(3),
        [1, "ok", ("fine", "bad value!")],
    ],
    ids=lambda value: re.sub(r" at 0x[0-9a-f]+", "", repr(value)),  # stable across processes (pytest-xdist)
)
def test_literal_refuses_anything_but_plain_data(value) -> None:
    with pytest.raises(ExportError):
        literal(value, where="case.dtype")


def test_literal_writes_plain_data_that_evaluates_back() -> None:
    data = {"causal": True, "window_size": (-1, 0), "scale": 0.125, "name": "fa4", "none": None, "one": (3,)}
    assert ast.literal_eval(literal(data)) == data


def test_the_literal_check_catches_code_in_a_slot_or_outside_one() -> None:
    template = "X = $value\n\ndef f():\n    return X\n"
    assert fill_template(template, {"value": (1, "a")}) == "X = (1, 'a')\n\ndef f():\n    return X\n"
    with pytest.raises(ExportError, match="literal-only"):
        check_only_literals(template, "X = __import__('os')\n\ndef f():\n    return X\n", {"value"})
    with pytest.raises(ExportError, match="literal-only"):
        check_only_literals(template, "X = 1\n\ndef f():\n    return print(X)\n", {"value"})
    with pytest.raises(ExportError, match="literal-only"):
        check_only_literals(template, "X = 1; import os\n\ndef f():\n    return X\n", {"value"})


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"backend": "fa4\"; import os"}, "backend"),
        ({"variant": "te_style'+__import__('os')+'"}, "variant"),
        ({"signature": "out:all_zero\"\"\"\nimport os"}, "signature"),
        ({"backend": "no-such-backend"}, "backend"),
        ({"variant": "bogus"}, "variant"),
    ],
)
def test_render_refuses_hostile_names_and_unknown_backends(kwargs: dict, field: str) -> None:
    args = {"backend": "fa4", "variant": "te_style", "signature": "out:all_zero", **kwargs}
    with pytest.raises(ExportError) as raised:
        render_repro(FA4_CASE, args["backend"], args["variant"], args["signature"], allowed=dict.fromkeys(("out", "lse", "dq", "dk", "dv"), 1.0))
    assert raised.value.field == field


def test_a_backend_without_a_repro_method_gets_told_what_to_add() -> None:
    with pytest.raises(ExportError, match=r"backend 'torch-flex' .* defines no repro call: add a method `repro") as raised:
        render_repro(FA4_CASE, "torch-flex", "mask_mod", None, allowed=dict.fromkeys(("out", "lse", "dq", "dk", "dv"), 1.0))
    assert raised.value.field == "backend"
    assert "torch-flex" not in exportable_backends() and "fa4" in exportable_backends()


class _EvilBackend(Backend):
    name = "evil-backend"
    variants = ("native",)

    def run(self, case, inputs, variant):
        raise NotImplementedError

    def repro(self, case, variant):
        return ReproCall(
            source="EVIL = $payload\n\ndef check_environment():\n    pass\n\n"
            "def call_backend(q, k, v, a, b):\n    return q, None\n",
            values={"payload": "x\"); __import__('os')"},
            device="cpu",
        )


class _CrashingRepro(_EvilBackend):
    def repro(self, case, variant):
        raise KeyError("a plugin bug")


def test_a_plugin_repro_cannot_smuggle_code_through_a_value() -> None:
    with pytest.raises(ExportError) as raised:
        render_repro(FA4_CASE, _EvilBackend(), "native", None, allowed=dict.fromkeys(("out", "lse", "dq", "dk", "dv"), 1.0))
    assert raised.value.field == "payload"


def test_a_plugin_repro_that_raises_is_an_export_error_naming_the_backend() -> None:
    with pytest.raises(ExportError, match="evil-backend.repro raised KeyError") as raised:
        render_repro(FA4_CASE, _CrashingRepro(), "native", None, allowed=dict.fromkeys(("out", "lse", "dq", "dk", "dv"), 1.0))
    assert raised.value.field == "backend"


def test_validated_case_names_the_hostile_field() -> None:
    config = {**FA4_CASE.to_json(), "dtype": "bfloat16'); import os; os.system('x'); ('"}
    with pytest.raises(ExportError) as raised:
        validated_case(config)
    assert raised.value.field == "case.dtype"
    config = {**FA4_CASE.to_json(), "seqlen_q": "1); __import__('os').system('x'"}
    with pytest.raises(ExportError) as raised:
        validated_case(config)
    assert raised.value.field == "case.seqlen_q"


def test_nan_in_the_allowed_errors_is_refused() -> None:
    with pytest.raises(ExportError):
        render_repro(FA4_CASE, "fa4", "te_style", None, allowed={"out": math.nan})


# ------------------------------------------------------------ the file judges as the oracle
JUDGE_CASE = AttentionCase(batch_size=2, seqlen_q=70, seqlen_k=67, num_heads=2, head_dim=16, dtype="bfloat16",
                           causal=True, causal_alignment="bottom_right")  # 2 tiles per group, rows without keys


def _plant(kind: str, out: torch.Tensor, lse: torch.Tensor, dq, dk, dv):
    out, lse, dk = out.clone(), lse.clone(), dk.clone()
    if kind == "out:all_zero":
        out.zero_()
    elif kind == "out:nan":
        out[0, 5, 1, 3] = math.nan
    elif kind == "out:posinf":
        out[1, 9, 0, 0] = math.inf
    elif kind == "out:mismatch":
        out *= 1.02
    elif kind == "out:tile_mismatch":
        out[1, 64:70, 0] *= 1.05  # the second tile of one (batch, head): 3.6x its allowance, whole tensor within
    elif kind == "lse:neginf":
        lse[0, 1, 40] = -math.inf
    elif kind == "lse:finite_on_masked":
        lse[0, 0, 0] = 0.0  # row 0 sees no key (bottom-right, seqlen_k < seqlen_q)
    elif kind == "lse:mismatch":
        lse = torch.where(torch.isfinite(lse), lse / math.log(2.0), lse)  # log2
    elif kind == "dk:mismatch":
        dk *= 1.1
    return out, lse, dq, dk, dv


@pytest.mark.parametrize(
    "kind",
    ["fixed", "out:all_zero", "out:nan", "out:posinf", "out:mismatch", "out:tile_mismatch", "lse:neginf",
     "lse:finite_on_masked", "lse:mismatch", "dk:mismatch"],
)
def test_the_files_judgement_is_the_oracles(kind: str, tmp_path: Path) -> None:
    """The exported file's `judge` finds exactly the signatures `oracle.compare` finds on the same
    kernel output (a planted bug per signature class, and the fixed kernel)."""
    from oracle.compare import compare_outputs

    case = JUDGE_CASE
    module = load_generated(render_repro(case, "torch-cpu-math", "bool_mask", kind if kind != "fixed" else None).source,
                            tmp_path)
    inputs = make_inputs(case)
    ref = reference(case, inputs, backward=True)
    # the "kernel": the float64 reference rounded to bf16 (lse float32), with the planted bug
    tensors = (ref.out.to(torch.bfloat16), ref.lse.to(torch.float32), ref.dq.to(torch.bfloat16),
               ref.dk.to(torch.bfloat16), ref.dv.to(torch.bfloat16))
    if kind != "fixed":
        tensors = _plant(kind, *tensors)
    verdict = compare_outputs(case, ref, **dict(zip(("out", "lse", "dq", "dk", "dv"), tensors)))
    q, k, v, dout, _, _ = module.make_inputs("cpu")
    inline = module.reference(q, k, v, dout)
    found = []
    for name, actual in zip(("out", "lse", "dq", "dk", "dv"), tensors):
        signatures, text = module.judge(name, actual, inline[name])
        found.extend(signatures)
        assert text.startswith(f"{name}: L2 error")
    assert tuple(found) == verdict.signatures
    assert (kind in found) == (kind != "fixed")


def test_the_files_judge_takes_the_correctly_rounded_overflow_as_no_defect(tmp_path: Path) -> None:
    """As `oracle.compare`: +inf where the reference rounds to +inf in float16 is no posinf; +inf
    elsewhere is (a planted one)."""
    case = AttentionCase(seqlen_q=4, seqlen_k=4, num_heads=1, head_dim=8, dtype="float16", backward=False)
    module = load_generated(render_repro(case, "torch-cpu-math", "is_causal", None,
                                         allowed={"out": 1.0, "lse": 1.0}).source, tmp_path)
    expected = torch.ones(1, 4, 1, 8, dtype=torch.float64)
    expected[0, 2, 0, 3] = 1e5  # above float16's 65504
    actual = expected.to(torch.float16)
    assert torch.isinf(actual[0, 2, 0, 3])
    assert module.judge("out", actual, expected)[0] == []
    actual[0, 1, 0, 0] = math.inf
    assert module.judge("out", actual, expected)[0] == ["out:posinf"]


def test_the_files_judge_takes_an_infinity_at_the_overflow_edge_as_no_defect_as_the_oracle_does(tmp_path: Path) -> None:
    """As `oracle.compare`: +inf where the reference is finite but within its tile's allowed error
    of float16's largest value is no posinf; +inf where it is far below is (a planted one); the
    file and the oracle agree on both."""
    from oracle.compare import compare_tensor

    case = AttentionCase(seqlen_q=4, seqlen_k=4, num_heads=1, head_dim=8, dtype="float16", backward=False)
    module = load_generated(render_repro(case, "torch-cpu-math", "is_causal", None,
                                         allowed={"out": 100.0, "lse": 1.0}).source, tmp_path)
    expected = torch.ones(1, 4, 1, 8, dtype=torch.float64)
    expected[0, 2, 0, 3] = 65_460.0  # finite in float16, 44 below its largest value; allowed 100
    actual = expected.to(torch.float16)
    actual[0, 2, 0, 3] = math.inf
    assert module.judge("out", actual, expected)[0] == []
    assert compare_tensor("out", actual, expected, "float16", factor=3.0).passed  # its tile allows about 1e2 there too
    actual[0, 1, 0, 0] = math.inf
    assert module.judge("out", actual, expected)[0] == ["out:posinf"]
    assert compare_tensor("out", actual, expected, "float16", factor=3.0).signatures[0] == "out:posinf"
