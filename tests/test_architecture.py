"""The import contracts of ``pyproject.toml`` (``[tool.importlinter]``, docs/architecture.md) hold on
the tree, and ``lint-imports`` fails, naming the contract, on a copy of the tree with a planted
forbidden import."""

from __future__ import annotations

import pkgutil
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import fuzzer

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("attnfuzz", "oracle", "fuzzer", "service")
RECORD_MODULES = frozenset({"fuzzer.results", "fuzzer.text", "fuzzer.severity", "fuzzer.coverage"})
"""The fuzzer modules service's storage and web modules may import: the declared record types."""


def contracts() -> dict[str, dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the packages under ``cwd`` (its pyproject.toml), as the CI runs it."""
    script = Path(sys.executable).with_name("lint-imports")
    command = [str(script)] if script.exists() else [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"]
    return subprocess.run(command + ["--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_lint_imports_keeps_every_contract_on_the_tree():
    run = lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"Contracts: {len(contracts())} kept, 0 broken." in run.stdout, run.stdout


def test_every_fuzzer_module_is_a_record_module_or_forbidden_to_the_service_storage():
    """A new fuzzer module cannot slip past the record-types contract: it is named in one list."""
    children = {f"fuzzer.{m.name}" for m in pkgutil.iter_modules(fuzzer.__path__)}
    forbidden = set(contracts()["service-reads-records"]["forbidden_modules"])
    assert children == RECORD_MODULES | forbidden, (
        f"not placed: {sorted(children - RECORD_MODULES - forbidden)}; gone: {sorted((RECORD_MODULES | forbidden) - children)}"
    )


@pytest.mark.parametrize(
    ("path", "planted", "contract"),
    [
        ("oracle/masks.py", "import fuzzer.results", "oracle-independent"),
        ("fuzzer/backends/base.py", "import fuzzer.worker", "backends-own-their-library"),
        ("service/db/store.py", "import fuzzer.evaluate", "service-reads-records"),
        ("fuzzer/results.py", "import fuzzer.worker", "no-circles"),
        ("oracle/mask_kinds.py", "import fuzzer.strategies", "oracle-independent"),
        ("service/matrix/grid.py", "import fuzzer.builds.replay", "service-reads-records"),
        ("service/matrix/lines.py", "import service.cli.matrix", "no-circles"),
        ("fuzzer/loop/shrinker.py", "import fuzzer.builds.replay", "loop-without-builds"),
    ],
)
def test_a_planted_forbidden_import_fails_naming_the_contract(tmp_path, path, planted, contract):
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "static", "templates", "*.toml"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / path
    target.write_text(target.read_text() + f"\n{planted}  # planted by tests/test_architecture.py\n")
    run = lint_imports(tmp_path)
    name = contracts()[contract]["name"]
    assert run.returncode != 0, run.stdout
    broken = " ".join(run.stdout.split())  # lint-imports wraps long names over lines
    assert f"{name} BROKEN" in broken, run.stdout


BUILD_WING = ("fuzzer/builds", "service/matrix", "service/cli/matrix", "service/db/build_rows.py", "service/api/routes/matrix.py")
"""The build matrix, one wing in three layers (docs/architecture.md): the fuzzer makes and runs
builds, the service stores and reads the matrix, the front ends stay with their peers."""


def test_no_module_name_of_the_build_wing_repeats_across_its_layers():
    """Each module of the wing has a name of its own (``fuzzer.builds.replay``,
    ``service.matrix.replay_rows``, ``service.cli.matrix.replay_command``): a name says the layer."""
    names: dict[str, list[str]] = {}
    for part in BUILD_WING:
        path = ROOT / part
        files = [path] if path.suffix == ".py" else sorted(path.glob("*.py"))
        assert files, part
        for file in files:
            if file.name != "__init__.py":
                names.setdefault(file.stem, []).append(str(file.relative_to(ROOT)))
    assert {n: places for n, places in names.items() if len(places) > 1} == {}
    assert not (ROOT / "service" / "builds").exists() and not (ROOT / "service" / "cli" / "builds").exists()
