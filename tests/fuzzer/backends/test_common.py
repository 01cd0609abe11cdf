"""fuzzer/backends/_common.py (the helpers adapters share) and `fuzzer.backends.base.environment_set`."""

from __future__ import annotations

import os

import pytest

from fuzzer.backends import fa2, fa4
from fuzzer.backends._common import FA_REPRO_HELPERS, fa_repro_source
from fuzzer.backends.base import environment_set


def test_the_fa4_and_fa2_repro_sources_are_the_one_template_with_their_own_library_call():
    for source, call, constants in (
        (fa4.FA4_REPRO_SOURCE, "interface.flash_attn_func(q, k, v, **FA4_KWARGS)", "FA4_KWARGS = $fa4_kwargs"),
        (fa2.FA2_REPRO_SOURCE, "flash_attn.flash_attn_func(q, k, v, **FA2_KWARGS)", "FA2_KWARGS = $fa2_kwargs"),
    ):
        assert source.startswith(FA_REPRO_HELPERS), source[:200]
        assert call in source and constants in source, source
        assert "def check_environment():\n    require_cuda(" in source, source
    rendered = fa_repro_source(constants="X = $x", kwargs_name="X", check_environment="    pass",
                               import_line="import somelib", module="somelib")
    assert "somelib.flash_attn_varlen_func(" in rendered and "**X" in rendered, rendered
    compile(rendered.replace("$$", "$").replace("$x", "{}"), "<repro>", "exec")  # valid Python once filled


def test_environment_set_restores_set_and_unset_variables_even_when_the_block_raises(monkeypatch):
    monkeypatch.delenv("ATTNFUZZ_TEST_UNSET", raising=False)
    monkeypatch.setenv("ATTNFUZZ_TEST_SET", "before")
    with pytest.raises(KeyError):
        with environment_set({"ATTNFUZZ_TEST_UNSET": "a", "ATTNFUZZ_TEST_SET": "b"}):
            assert (os.environ["ATTNFUZZ_TEST_UNSET"], os.environ["ATTNFUZZ_TEST_SET"]) == ("a", "b")
            raise KeyError("inside")
    assert "ATTNFUZZ_TEST_UNSET" not in os.environ
    assert os.environ["ATTNFUZZ_TEST_SET"] == "before"


def test_the_compile_timer_times_a_recompile_under_a_known_key_as_compilation():
    """A known key whose call moved the library's compile count is timed again like a new key
    (torch.compile recompiles for new shapes under one kernel key); without a count, or when it
    did not move, a known key reports 0."""
    import time

    from fuzzer.backends._common import CompileTimer

    compiled = {"n": 0, "slow": False}

    def call():
        if compiled["slow"]:  # this call compiles: slow once, then the compiled kernel is fast
            compiled["slow"] = False
            compiled["n"] += 1
            time.sleep(0.05)
        return "out"

    timer = CompileTimer(compiles=lambda: compiled["n"])
    compiled["slow"] = True
    assert timer.run(("k",), call, None)[1] > 0  # a new key
    assert timer.run(("k",), call, None) == ("out", 0.0)  # known, nothing compiled
    compiled["slow"] = True  # the next call under the same key recompiles
    result, compile_ms = timer.run(("k",), call, None)
    assert result == "out" and compile_ms > 0
    plain = CompileTimer()
    plain.run(("k",), call, None)
    compiled["slow"] = True
    assert plain.run(("k",), call, None)[1] == 0.0  # no count given: a known key is not re-timed
    broken = CompileTimer(compiles=lambda: 1 / 0)  # a counter that fails counts as no recompile
    broken.run(("k",), call, None)
    assert broken.run(("k",), call, None)[1] == 0.0


def test_the_dynamo_graph_count_moves_when_torch_compile_compiles():
    import torch

    from fuzzer.backends.sdpa import dynamo_graph_count

    before = dynamo_graph_count()
    torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(3))
    assert dynamo_graph_count() > before
