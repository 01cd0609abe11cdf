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
