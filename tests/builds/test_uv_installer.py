"""Builds installed with uv when it is available (issue 15): ``--installer auto`` prefers uv,
the manifest's resolution stays attnfuzz's (same extras, versions and fingerprints as with
``unpack``), and asking for uv where there is none is a clear error.

uv is not installed on the CI machine: a stand-in ``uv`` executable on ``PATH`` records its
command line and unpacks the wheels it is given, the way ``uv pip install --no-deps --target``
does. A test with the real uv runs where one is found.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from fuzzer.builds.envs import prepare_from_wheelhouse
from fuzzer.builds.install import resolve_installer, uv_command
from fuzzer.builds.versions import BuildError
from fuzzer.builds.wheels import load_rules
from tests.builds.fakebuilds import DEP, KERNEL

FAKE_UV = '''#!{python}
"""A stand-in for uv: logs argv, unpacks the wheel arguments into --target."""
import json, sys, zipfile
args = sys.argv[1:]
with open({log!r}, "a") as fh:
    fh.write(json.dumps(args) + "\\n")
target = args[args.index("--target") + 1]
for arg in args:
    if arg.endswith(".whl"):
        zipfile.ZipFile(arg).extractall(target)
'''


@pytest.fixture
def fake_uv(tmp_path, monkeypatch) -> Path:
    """A ``uv`` on a PATH that holds nothing else; returns the log of its command lines."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "uv.log"
    script = bin_dir / "uv"
    script.write_text(FAKE_UV.format(python=sys.executable, log=str(log)))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setitem(sys.modules, "uv", None)  # no uv Python package either
    return log


@pytest.fixture
def no_uv(tmp_path, monkeypatch) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setitem(sys.modules, "uv", None)


def test_auto_prefers_uv_and_falls_back_to_unpack(fake_uv, monkeypatch, tmp_path):
    assert uv_command() == [str(tmp_path / "bin" / "uv")]
    assert resolve_installer("auto") == "uv" and resolve_installer("unpack") == "unpack"
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert uv_command() is None and resolve_installer("auto") == "unpack"


def test_asking_for_uv_where_there_is_none_names_the_field_and_the_alternatives(no_uv):
    with pytest.raises(BuildError, match=r"installer: 'uv' needs uv .*allowed here: auto, unpack, pip"):
        resolve_installer("uv")
    with pytest.raises(BuildError, match="installer: unknown value 'conda'"):
        resolve_installer("conda")


def test_uv_installs_the_resolved_wheels_offline_and_the_manifest_is_unchanged(
    fake_uv, fake_wheelhouse, fake_rules, tmp_path
):
    """fakekernel 1.0 needs the old fakedep (a rule): uv gets exactly both wheels, offline, no
    index, no dependency resolution of its own; the environment equals the unpacked one."""
    rules = load_rules(fake_rules)
    by_uv = prepare_from_wheelhouse(KERNEL, "1.0", [fake_wheelhouse], tmp_path / "uv", rules=rules, installer="auto")
    (line,) = [json.loads(text) for text in fake_uv.read_text().splitlines()]
    assert line[:6] == ["pip", "install", "--quiet", "--offline", "--no-index", "--no-deps"]
    assert line[line.index("--find-links") + 1] == str(fake_wheelhouse)
    site = by_uv.paths[0]
    assert line[line.index("--target") + 1].endswith(os.path.join(f"{KERNEL}-1.0.tmp-{os.getpid()}", "site"))
    wheels = sorted(Path(a).name for a in line if a.endswith(".whl"))
    assert wheels == [f"{DEP.replace('-', '_')}-1.0-py3-none-any.whl", f"{KERNEL.replace('-', '_')}-1.0-py3-none-any.whl"]
    assert (site / "attnfuzz_fakekernel" / "__init__.py").is_file()
    by_unpack = prepare_from_wheelhouse(KERNEL, "1.0", [fake_wheelhouse], tmp_path / "unpack", rules=rules, installer="unpack")
    assert (by_uv.package, by_uv.version, by_uv.extras, by_uv.unresolved) == (
        by_unpack.package, by_unpack.version, by_unpack.extras, by_unpack.unresolved
    )
    assert len(fake_uv.read_text().splitlines()) == 1, "unpack does not call uv"


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed here (pip install uv)")
def test_the_real_uv_installs_a_build(fake_wheelhouse, fake_rules, tmp_path):
    env = prepare_from_wheelhouse(KERNEL, "1.0", [fake_wheelhouse], tmp_path, rules=load_rules(fake_rules), installer="uv")
    assert (env.paths[0] / "attnfuzz_fakekernel" / "__init__.py").is_file()
    assert any(p.name.startswith("attnfuzz_fakedep-1.0") for p in env.paths[0].glob("*.dist-info"))
