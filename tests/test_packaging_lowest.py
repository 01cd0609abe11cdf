"""The lowest versions pyproject.toml allows install and work (issue 18, acceptance 3).

``uv pip compile --resolution lowest-direct`` resolves every direct dependency (and the ``test``
extra) to its declared floor; the resolution is installed with ``--no-deps`` into a fresh venv
together with attnfuzz itself (non-editable, from this tree), and a smoke test runs there:
every module of ``oracle``, ``fuzzer``, ``service`` and ``attnfuzz`` imports, the CLI migrates a
database, fuzzes three cases and reports, and the web app answers ``/api/overview``,
``/openapi.json`` and ``/metrics``.

torch is the one exception: its floor (``torch>=2.11``, the oldest torch attnfuzz has run on: the
H200 host's 2.11+cu130, where the GPU campaigns of docs/gpu-campaigns.md ran the whole product) has
no CPU wheel on this index (the CPU index holds 2.13.0 only, and on PyPI a Linux torch is a multi-GB
CUDA build); it is taken out of the resolution and this interpreter's CPU torch is linked into the
venv. Needs ``uv`` (``pip install uv``) and the package index; it skips without them unless
``ATTNFUZZ_TEST_LOWEST_REQUIRED=1``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from tests.build_lock import tree_build_lock

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TORCH_PARTS = ("torch", "torchgen", "functorch", "sympy", "mpmath", "networkx", "filelock", "fsspec")

SMOKE = textwrap.dedent("""
    import importlib, json, pkgutil, subprocess, sys
    from pathlib import Path

    import attnfuzz, fuzzer, oracle, service

    for package in (attnfuzz, oracle, fuzzer, service):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.startswith("attnfuzz.migrations"):
                continue  # Alembic scripts, run by alembic, not imported
            importlib.import_module(info.name)

    work = Path(sys.argv[1])
    attnfuzz_bin = Path(sys.executable).with_name("attnfuzz")

    def cli(*args):
        run = subprocess.run([str(attnfuzz_bin), *args], cwd=work, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, (args, run.stdout, run.stderr)
        return run.stdout

    assert json.loads(cli("db", "upgrade", "--json", "--db", "low.db"))["up_to_date"]
    summary = json.loads(cli("fuzz", "--max-cases", "3", "--backend", "torch-cpu-math", "--db", "low.db", "--no-shrink",
                             "--json", "--spool-dir", str(work / "spool")))
    assert summary["cases"] == 3
    report = json.loads(cli("report", "--json", "--db", "low.db"))
    assert report["cases"] >= 1

    from fastapi.testclient import TestClient
    from service.api.app import create_app
    from service.settings import Settings

    with TestClient(create_app(Settings(database_url=f"sqlite:///{work / 'low.db'}"))) as client:
        assert client.get("/api/overview").json()["case_count"] == report["cases"]
        assert client.get("/openapi.json").status_code == 200
        assert "attnfuzz_results_total" in client.get("/metrics").text
    print("SMOKE OK")
""")


def _uv() -> str | None:
    found = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    return found if Path(found).exists() else None


def _run(*args, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ATTNFUZZ_DATABASE_URL", "VIRTUAL_ENV")}
    run = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert run.returncode == 0, f"{args}: exit {run.returncode}\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    return run


def test_the_lowest_declared_versions_install_and_pass_a_smoke_test(tmp_path: Path) -> None:
    uv = _uv()
    if uv is None:
        if os.environ.get("ATTNFUZZ_TEST_LOWEST_REQUIRED") == "1":
            pytest.fail("uv is needed for the lowest-versions test (pip install uv)")
        pytest.skip("uv is not installed (pip install uv)")
    (tmp_path / "no-torch.txt").write_text('torch ; python_version < "3"\n')  # never true: torch left out
    pins = tmp_path / "lowest.txt"
    try:
        _run(uv, "pip", "compile", "-q", "--resolution", "lowest-direct", "--python-version", "3.11",
             "--override", tmp_path / "no-torch.txt", ROOT / "pyproject.toml", "--extra", "test", "-o", pins,
             cwd=tmp_path, timeout=600)
    except AssertionError as exc:
        if "network" in str(exc).lower() or "connect" in str(exc).lower():
            if os.environ.get("ATTNFUZZ_TEST_LOWEST_REQUIRED") != "1":
                pytest.skip(f"no package index: {str(exc)[-300:]}")
        raise
    floors = {line.split("==")[0]: line.split("==")[1].split()[0] for line in pins.read_text().splitlines() if "==" in line}
    assert floors["hypothesis"] == "6.126.0" and floors["starlette"] == "0.48.0"  # the declared floors were chosen
    venv = tmp_path / "venv"
    _run(uv, "venv", "-q", "--python", sys.executable, venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(uv, "pip", "install", "-q", "--python", python, "--no-deps", "-r", pins, cwd=tmp_path)
    with tree_build_lock(ROOT):  # setuptools builds in ROOT/build: one build at a time (tests/build_lock.py)
        _run(uv, "pip", "install", "-q", "--python", python, "--no-deps", ROOT, cwd=tmp_path)
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).stdout.strip())
    links = tmp_path / "torch-links"
    links.mkdir()
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in ours.iterdir():
        if entry.name.split("-")[0].lower() in TORCH_PARTS:
            (links / entry.name).symlink_to(entry)
    (site / "attnfuzz-test-torch.pth").write_text(f"{links}\n")
    work = tmp_path / "work"
    work.mkdir()
    smoke = _run(python, "-c", SMOKE, work, cwd=work)
    assert "SMOKE OK" in smoke.stdout
