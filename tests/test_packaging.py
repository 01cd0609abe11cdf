"""attnfuzz as an installed package (issue 18, acceptance 1 and 2).

The wheel is built from this tree (``pip wheel``; ``--no-build-isolation`` when setuptools >= 77 is
installed here, so no network) and installed,
not editable, into a fresh virtual environment. The environment gets its third-party
dependencies (torch, SQLAlchemy, ...) from this test's interpreter through a ``.pth`` file that
names a folder of links to this interpreter's site-packages *minus attnfuzz* (its dist-info and
editable finder), so the only attnfuzz it sees is the wheel's and nothing is downloaded.

From a scratch directory outside the repository, the installed ``attnfuzz``:

1. answers ``--version``; ``db upgrade`` finds the migrations inside the wheel
   (``attnfuzz.migrations``); a short ``fuzz`` stores cases; ``serve`` answers ``/api/overview``
   and ``/docs`` (its Swagger UI assets served locally).
2. lives beside a project with its own ``service`` package: pytest in that project loads the
   attnfuzz plugin (``attnfuzz.pytest_plugin``) and its own tests pass, exit 0.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import sysconfig
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from tests.build_lock import tree_build_lock

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str | Path, cwd: Path, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ATTNFUZZ_DATABASE_URL")}
    run = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, **kwargs)
    assert run.returncode == 0, f"{args}: exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    return run


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with attnfuzz installed from a wheel built from this tree; its ``bin/``."""
    work = tmp_path_factory.mktemp("packaging")
    wheels = work / "wheels"
    with tree_build_lock(ROOT):  # setuptools builds in ROOT/build: one build at a time (tests/build_lock.py)
        _run(sys.executable, "-m", "pip", "wheel", "--no-deps", *_build_isolation(), "-q", "-w", wheels, ROOT, cwd=work)
    (wheel,) = wheels.glob("attnfuzz-*.whl")
    venv = work / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=work)
    bin_dir = venv / "bin"
    site = Path(_run(bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=work).stdout.strip())
    deps = work / "deps"
    deps.mkdir()
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in ours.iterdir():
        name = entry.name.lower()
        if name.startswith(("attnfuzz", "__editable__", "_pytest_attnfuzz")) or name.endswith(".pth"):
            continue
        if name in ("pip", "setuptools", "_distutils_hack") or name.startswith(("pip-", "setuptools-")):
            continue
        (deps / entry.name).symlink_to(entry)
    (site / "attnfuzz-test-deps.pth").write_text(f"{deps}\n")
    _run(bin_dir / "python", "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel, cwd=work)
    return bin_dir


def _build_isolation() -> list[str]:
    """``--no-build-isolation`` (offline, fast) when this interpreter has the setuptools that
    pyproject.toml's build-system asks for; else pip's isolated build (fetches it)."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    try:
        return ["--no-build-isolation"] if Version(version("setuptools")) >= Version("77") else []
    except PackageNotFoundError:
        return []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_wheel_installs_and_version_db_upgrade_fuzz_serve_work_from_another_directory(
    installed: Path, tmp_path: Path
) -> None:
    where = _run(installed / "python", "-c",
                 "import attnfuzz, service, service.db.migrations as m; print(service.__file__); print(m.SCRIPT_LOCATION)",
                 cwd=tmp_path).stdout.split()
    assert all(str(installed.parent) in line for line in where), where  # the wheel's copy, not this tree
    from attnfuzz import __version__

    version = _run(installed / "attnfuzz", "--version", cwd=tmp_path)
    assert version.stdout.strip() == f"attnfuzz {__version__}"

    upgraded = json.loads(_run(installed / "attnfuzz", "db", "upgrade", "--json", "--db", "wheel.db", cwd=tmp_path).stdout)
    assert upgraded["up_to_date"] and upgraded["revision"] == upgraded["head"]

    fuzzed = _run(installed / "attnfuzz", "fuzz", "--max-cases", "3", "--backend", "torch-cpu-math", "--db", "wheel.db",
                  "--no-shrink", "--json", "--spool-dir", tmp_path / "spool", cwd=tmp_path)
    summary = json.loads(fuzzed.stdout)
    assert summary["cases"] == 3 and not summary["interrupted"]
    listed = json.loads(_run(installed / "attnfuzz", "cases", "list", "--json", "--db", "wheel.db", cwd=tmp_path).stdout)
    assert listed["total"] >= 1

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    server = subprocess.Popen([installed / "attnfuzz", "serve", "--db", "wheel.db", "--port", str(port)],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        overview, docs, asset = None, None, None
        for _ in range(240):  # up to 120 s for the server to come up on a loaded machine
            if server.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/overview", timeout=5) as response:
                    overview = json.loads(response.read())
                break
            except OSError:
                time.sleep(0.5)
        assert overview is not None, server.stdout.read() if server.poll() is not None else "no answer"
        assert overview["case_count"] == listed["total"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/docs", timeout=10) as response:
            docs = response.read().decode()
        assert "cdn.jsdelivr.net" not in docs and "/static/swagger-ui/swagger-ui-bundle.js" in docs
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/static/swagger-ui/swagger-ui-bundle.js", timeout=10) as response:
            asset = response.read()
        assert len(asset) > 100_000
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_pytest_in_a_project_with_its_own_service_package_loads_the_plugin_and_passes(
    installed: Path, tmp_path: Path
) -> None:
    project = tmp_path / "kernels"
    (project / "service").mkdir(parents=True)
    (project / "service" / "__init__.py").write_text("WHO = 'the kernel team'\n")
    (project / "tests").mkdir()
    (project / "tests" / "test_own.py").write_text(textwrap.dedent("""
        import service


        def test_our_service_package_is_ours():
            assert service.WHO == "the kernel team"
    """))
    run = _run(installed / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=project)
    assert "1 passed" in run.stdout
    helped = _run(installed / "python", "-m", "pytest", "--help", cwd=project)
    assert "--attnfuzz-corpus" in helped.stdout  # the plugin is loaded there too
