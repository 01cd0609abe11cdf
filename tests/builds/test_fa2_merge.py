"""Per-build FA4 environments with FlashAttention 2 in the shared stack (issue 15, FA2.md).

FA2's ``flash_attn/__init__.py`` makes ``flash_attn`` a regular package, which wins over the
namespace portions flash-attn-4 wheels ship: with FA2 in the shared stack, a per-build FA4 folder
ahead on ``PYTHONPATH`` is not what ``flash_attn.cute`` imports. Fake packages on disk stand in for
FA2 and two FA4 builds; a child interpreter shows which ``flash_attn.cute`` it imports, and what
`fuzzer.backends.fa4.fa4_imported_build` (what ``attnfuzz backends`` and the fingerprint report)
and `fa4_build_mismatch` say there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fuzzer.builds.envs import adopt_build_dir, prepare_from_wheelhouse
from fuzzer.builds.shared_fa import find_shared_fa2, find_shared_fa4
from tests.builds.fakebuilds import write_wheel

PROJECT = Path(__file__).resolve().parents[2]


def fa4_files(version: str) -> dict[str, str]:
    """flash-attn-4's layout: a namespace ``flash_attn`` (no ``__init__.py``) with ``cute``."""
    return {
        "flash_attn/cute/__init__.py": f'__version__ = "{version}"\n',
        "flash_attn/cute/interface.py": f'BUILD = "{version}"\n\ndef flash_attn_func(*args, **kwargs):\n    return BUILD\n',
    }


def write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def dist_info(root: Path, dist: str, version: str) -> None:
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "RECORD").write_text("")


@pytest.fixture
def gpu_site(tmp_path) -> Path:
    """/tmp/gpu-site as gpu_stage.py leaves it: FA2 (a regular package, with a stale FA4 copy
    under flash_attn/cute as the sdist ships it) and the newest FA4 unpacked into it."""
    site = tmp_path / "gpu-site"
    write_tree(site, fa4_files("4.0.0b36"))
    write_tree(
        site,
        {
            "flash_attn/__init__.py": '__version__ = "2.8.3.post2"\nfrom flash_attn.flash_attn_interface import flash_attn_func\n',
            "flash_attn/flash_attn_interface.py": "def flash_attn_func(*args, **kwargs):\n    return 'FA2'\n",
            "flash_attn/ops/__init__.py": "",
        },
    )
    dist_info(site, "flash-attn", "2.8.3.post2")
    dist_info(site, "flash-attn-4", "4.0.0b36")
    return site


PROBE = """
import json, sys
import flash_attn, flash_attn.cute.interface as interface
from fuzzer.backends.fa4 import fa4_build_mismatch, fa4_imported_build
print(json.dumps({"build": interface.BUILD, "fa2": flash_attn.flash_attn_func(), "imported": fa4_imported_build(interface),
                  "mismatch": fa4_build_mismatch(interface), "fa2_version": flash_attn.__version__}))
"""


def probe(pythonpath: str) -> dict:
    """What a child interpreter with ``PYTHONPATH=pythonpath`` imports (a replay child's path:
    the build's paths, the project, the shared stack)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = pythonpath
    completed = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_the_trap_a_build_folder_ahead_of_fa2_is_not_what_flash_attn_cute_imports(tmp_path, gpu_site):
    """The control: /tmp/fa4/<v> first on PYTHONPATH still imports the shared stack's FA4, and
    the mismatch check sees it (so the fix below is needed and the tests can tell)."""
    folder = tmp_path / "fa4" / "4.0.0b30"
    write_tree(folder, fa4_files("4.0.0b30"))
    dist_info(folder, "flash-attn-4", "4.0.0b30")
    seen = probe(os.pathsep.join([str(folder), str(PROJECT), str(gpu_site)]))
    assert seen["build"] == "4.0.0b36"
    assert seen["imported"]["flash_attn_4"] == "4.0.0b36", "the imported build is reported, not the metadata's"
    assert seen["mismatch"] is not None and "4.0.0b30" in seen["mismatch"]


def test_find_shared_fa2_finds_the_first_regular_flash_attn_package(tmp_path, gpu_site):
    namespace_only = tmp_path / "fa4-only"
    write_tree(namespace_only, fa4_files("4.0.0b30"))
    assert find_shared_fa2([str(namespace_only), str(gpu_site)]) == gpu_site.resolve()
    assert find_shared_fa2([str(namespace_only)]) is None


def test_a_wheelhouse_build_with_fa2_shared_imports_the_intended_fa4_and_keeps_fa2(tmp_path, gpu_site):
    wheelhouse = tmp_path / "wheels"
    wheelhouse.mkdir()
    write_wheel(wheelhouse, "flash-attn-4", "4.0.0b30", fa4_files("4.0.0b30"))
    env = prepare_from_wheelhouse(
        "flash-attn-4", "4.0.0b30", [wheelhouse], tmp_path / "builds", shared_version=lambda name: None,
        shared_fa2=lambda: gpu_site,
    )
    site = env.paths[0]
    assert (site / "flash_attn" / "__init__.py").is_file(), "FA2 merged into the build's site"
    assert (site / "flash_attn" / "cute" / "interface.py").read_text().startswith('BUILD = "4.0.0b30"')
    assert [(e.name, e.version) for e in env.extras] == [("flash-attn", "2.8.3.post2")]
    seen = probe(env.pythonpath(PROJECT, gpu_site))
    assert seen == {
        "build": "4.0.0b30",
        "fa2": "FA2",
        "imported": {"flash_attn_4": "4.0.0b30", "flash_attn_4_module": str((site / "flash_attn" / "cute").resolve())},
        "mismatch": None,
        "fa2_version": "2.8.3.post2",
    }
    again = prepare_from_wheelhouse(
        "flash-attn-4", "4.0.0b30", [wheelhouse], tmp_path / "builds", shared_version=lambda name: None,
        shared_fa2=lambda: gpu_site,
    )
    assert again.prepared_at == env.prepared_at, "an up-to-date merged build is reused"


def test_a_wheelhouse_build_without_fa2_is_left_alone(tmp_path):
    wheelhouse = tmp_path / "wheels"
    wheelhouse.mkdir()
    write_wheel(wheelhouse, "flash-attn-4", "4.0.0b30", fa4_files("4.0.0b30"))
    env = prepare_from_wheelhouse(
        "flash-attn-4", "4.0.0b30", [wheelhouse], tmp_path / "builds", shared_version=lambda name: None,
        shared_fa2=lambda: None,
    )
    assert env.extras == () and not (env.paths[0] / "flash_attn" / "__init__.py").exists()


def test_an_adopted_build_dir_with_fa2_shared_imports_the_intended_fa4(tmp_path, gpu_site):
    folder = tmp_path / "fa4" / "4.0.0b30"
    write_tree(folder, fa4_files("4.0.0b30"))
    dist_info(folder, "flash-attn-4", "4.0.0b30")
    env = adopt_build_dir(
        folder, "flash-attn-4", tmp_path / "builds", shared_version=lambda name: None, shared_fa2=lambda: gpu_site
    )
    assert env.paths[1] == folder.resolve() and len(env.paths) == 2
    seen = probe(env.pythonpath(PROJECT, gpu_site))
    assert seen["build"] == "4.0.0b30" and seen["fa2"] == "FA2"
    assert seen["imported"] == {"flash_attn_4": "4.0.0b30", "flash_attn_4_module": str((folder / "flash_attn" / "cute").resolve())}
    assert seen["mismatch"] is None


def test_a_fa2_build_keeps_the_shared_fa4_instead_of_the_copy_its_wheel_carries(tmp_path, gpu_site):
    """Bisecting FA2: the FA2 build's regular package comes first, so without care flash_attn.cute
    would be the early FA4 the FA2 sdist ships (or none). The build links the shared FA4 instead."""
    wheelhouse = tmp_path / "wheels"
    wheelhouse.mkdir()
    fa2_files = {
        "flash_attn/__init__.py": '__version__ = "2.7.4"\nfrom flash_attn.flash_attn_interface import flash_attn_func\n',
        "flash_attn/flash_attn_interface.py": "def flash_attn_func(*args, **kwargs):\n    return 'FA2 2.7.4'\n",
        "flash_attn/cute/__init__.py": "",
        "flash_attn/cute/interface.py": 'BUILD = "stale copy in the FA2 sdist"\n',
    }
    write_wheel(wheelhouse, "flash-attn", "2.7.4", fa2_files)
    assert find_shared_fa4([str(gpu_site)]) == (gpu_site / "flash_attn" / "cute").resolve()
    env = prepare_from_wheelhouse(
        "flash-attn", "2.7.4", [wheelhouse], tmp_path / "builds", shared_version=lambda name: None,
        shared_fa2=lambda: gpu_site, shared_fa4=lambda: find_shared_fa4([str(gpu_site)]),
    )
    assert [(e.name, e.version) for e in env.extras] == [("flash-attn-4", "4.0.0b36")]
    seen = probe(env.pythonpath(PROJECT, gpu_site))
    assert seen["fa2_version"] == "2.7.4" and seen["fa2"] == "FA2 2.7.4"
    assert seen["build"] == "4.0.0b36" and seen["imported"]["flash_attn_4"] == "4.0.0b36"
    assert seen["mismatch"] is None
