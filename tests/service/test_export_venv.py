"""Acceptance: the exported repro of the planted FA4-style bug runs under plain pytest in a fresh
virtual environment without attnfuzz; it fails against the planted library and passes against a
fixed one.

The planted "library" is a package ``planted_fa4`` with a ``flash_attn_func(q, k, v, *,
softmax_scale, causal, window_size)`` computing attention on the CPU; the planted build resolves
windows as flash-attention after PR #2490 does (``-1`` is a real bound, so TransformerEngine's
causal window ``(-1, 0)`` is an empty band: all zeros), the fixed build reads ``-1`` as unbounded.
Both use `tests.fuzzer.standins` code. The repro comes from the real path: the worker runs
`PlantedWindowBackend` and stores the failure in SQL, ``GET /api/cases/{id}/repro.py`` exports it.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fuzzer.worker import Worker, WorkerConfig
from oracle.config import AttentionCase
from service import export, migrations
from service.app import create_app
from service.db import make_engine
from service.settings import Settings
from service.store import SqlStore
from tests.fuzzer import standins

pytestmark = pytest.mark.slow

CASE = AttentionCase(batch_size=2, seqlen_q=12, seqlen_k=12, num_heads=2, head_dim=16, dtype="float32", causal=True)

_PLANTED_SOURCE = '''
PLANTED_KWARGS = $planted_kwargs


def check_environment():
    pytest.importorskip("planted_fa4", reason="planted_fa4 is not installed")


def call_backend(q, k, v, cu_seqlens_q, cu_seqlens_k):
    import planted_fa4

    return planted_fa4.flash_attn_func(q, k, v, **PLANTED_KWARGS)
'''


def planted_snippet(case: AttentionCase, variant: str) -> export.CallSnippet:
    """How `standins.PlantedWindowBackend` calls its "library" for ``variant``."""
    if variant == "te_window":
        left = -1 if case.window_size_left is None else case.window_size_left
        right = 0 if case.causal else (-1 if case.window_size_right is None else case.window_size_right)
    elif variant == "native":
        left, right = case.window_size_left, case.window_size_right
    else:
        raise export.ExportError("variant", f"unknown variant {variant!r} of planted-fa4")
    kwargs = {"softmax_scale": case.softmax_scale, "causal": case.causal, "window_size": (left, right)}
    return export.CallSnippet(source=_PLANTED_SOURCE, values={"planted_kwargs": kwargs}, device="cpu",
                              packages=("planted_fa4",))


def _library(root: Path, planted: bool) -> Path:
    package = root / ("planted" if planted else "fixed") / "planted_fa4"
    package.mkdir(parents=True)
    resolve = "_resolve_like_fa4_after_2490(causal, left, right)" if planted else (
        "(None if left is not None and left < 0 else left, 0 if causal else (None if right is not None and right < 0 else right))"
    )
    source = "import math\n\nimport torch\n\n\n" + inspect.getsource(standins.attention_with_band) + "\n\n"
    source += inspect.getsource(standins._resolve_like_fa4_after_2490) + "\n\n"
    source += textwrap.dedent(f'''
        def flash_attn_func(q, k, v, *, softmax_scale, causal=False, window_size=(None, None)):
            left, right = window_size
            left, right = {resolve}
            return attention_with_band(q, k, v, softmax_scale, left, right, k.shape[1] - q.shape[1])
        ''')
    (package / "__init__.py").write_text(source)
    return package.parent


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with only torch==2.13.0 (the local CPU wheel) and pytest."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "torch==2.13.0", "pytest"],
                             capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stdout + install.stderr
    return python


@pytest.fixture
def exported(tmp_path: Path) -> Path:
    """The repro as the service exports it after a worker stored the planted failure."""
    url = f"sqlite:///{tmp_path / 'attnfuzz.db'}"
    migrations.upgrade(url)
    engine = make_engine(url)
    export.register_snippet("planted-fa4", planted_snippet, replace=True)
    try:
        backend = standins.PlantedWindowBackend()
        config = WorkerConfig(backends=[(backend, "tests.fuzzer.standins:PlantedWindowBackend")], isolation="none",
                              shrink=False, replay_known=False, time_budget_s=None)
        with Worker(config, SqlStore(engine)) as worker:
            (result,) = worker.evaluate(CASE, tasks=[("planted-fa4", "te_window")])
        assert (result.status, result.signature) == ("fail", "out:all_zero")
        with TestClient(create_app(Settings(database_url=url))) as client:
            response = client.get(f"/api/cases/{CASE.case_id}/repro.py")
        assert response.status_code == 200, response.text
    finally:
        export.unregister_snippet("planted-fa4")
        engine.dispose()
    path = tmp_path / "repro" / "test_planted_repro.py"
    path.parent.mkdir()
    path.write_text(response.text)
    return path


def _pytest_in(python: Path, test_file: Path, library: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(library)
    return subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
                          cwd=test_file.parent, env=env, capture_output=True, text=True, timeout=300)


def test_the_exported_repro_fails_on_the_planted_library_and_passes_on_a_fixed_one(
    fresh_venv: Path, exported: Path, tmp_path: Path
) -> None:
    no_attnfuzz = subprocess.run([str(fresh_venv), "-c", "import oracle"], capture_output=True, text=True,
                                 cwd=exported.parent, env={"PATH": os.environ["PATH"]})
    assert no_attnfuzz.returncode != 0, "the fresh environment must not see attnfuzz"
    planted = _pytest_in(fresh_venv, exported, _library(tmp_path, planted=True))
    assert planted.returncode == 1, planted.stdout + planted.stderr
    assert "1 failed" in planted.stdout
    assert "planted-fa4/te_window: out:all_zero" in planted.stdout
    assert "recorded signature out:all_zero" in planted.stdout
    fixed = _pytest_in(fresh_venv, exported, _library(tmp_path, planted=False))
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "1 passed" in fixed.stdout
