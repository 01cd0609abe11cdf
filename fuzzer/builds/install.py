"""Installing wheels into a build's ``site``: ``uv`` (offline, no index, no dependencies), ``pip
--target``, or unpacking the archives (``unpack``). Everything is installed without dependencies:
the rest of the stack is shared on purpose (`fuzzer.builds.envs`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from fuzzer.builds.versions import BuildError, BuildPrepareError


INSTALLERS = ("auto", "uv", "unpack", "pip")


def _safe_member(name: str) -> bool:
    path = PurePosixPath(name)
    return not path.is_absolute() and ".." not in path.parts


def unpack_wheel(wheel: str | Path, site: str | Path) -> None:
    """Unpack a wheel into ``site`` the way gpu_stage.py does (merging folders that exist),
    moving ``<name>.data/purelib`` and ``platlib`` into ``site`` (other ``.data`` parts, scripts
    and headers, are not needed to import it).

    Raises:
        BuildPrepareError: the wheel is not a zip file or has a member outside ``site``.
    """
    wheel, site = Path(wheel), Path(site)
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = archive.namelist()
            bad = [m for m in members if not _safe_member(m)]
            if bad:
                raise BuildPrepareError(f"{wheel}: member {bad[0]!r} would be written outside the target")
            archive.extractall(site)
    except zipfile.BadZipFile as exc:
        raise BuildPrepareError(f"{wheel}: not a wheel (zip) file: {exc}") from exc
    for data_dir in site.glob("*.data"):
        for scheme in ("purelib", "platlib"):
            source = data_dir / scheme
            if source.is_dir():
                shutil.copytree(source, site, dirs_exist_ok=True)
        shutil.rmtree(data_dir)


def _pip_install(wheels: Sequence[Path], site: Path, wheelhouses: Sequence[Path]) -> None:
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile"]
    for wheelhouse in wheelhouses:
        command += ["--find-links", str(wheelhouse)]
    command += ["--target", str(site), *map(str, wheels)]
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode:
        tail = (completed.stderr or completed.stdout).strip()[-2000:]
        raise BuildPrepareError(f"pip install into {site} failed (exit {completed.returncode}): {tail}")


def uv_command() -> list[str] | None:
    """How to run uv here: the ``uv`` executable on ``PATH``, else the one the ``uv`` Python
    package ships (``pip install uv``); None when there is none."""
    found = shutil.which("uv")
    if found:
        return [found]
    try:
        import uv  # type: ignore[import-not-found]

        return [uv.find_uv_bin()]
    except (ImportError, FileNotFoundError, AttributeError):
        return None


def resolve_installer(installer: str) -> str:
    """The installer ``installer`` means here: ``auto`` is ``uv`` when uv is available (`uv_command`),
    else ``unpack``.

    Raises:
        BuildError: an unknown installer, or ``uv`` asked for where there is no uv.
    """
    check_installer(installer)
    if installer == "auto":
        return "uv" if uv_command() is not None else "unpack"
    if installer == "uv" and uv_command() is None:
        raise BuildError(
            "installer: 'uv' needs uv (the uv executable on PATH, or pip install uv); "
            f"allowed here: {', '.join(i for i in INSTALLERS if i != 'uv')}"
        )
    return installer


def _uv_install(wheels: Sequence[Path], site: Path, wheelhouses: Sequence[Path]) -> None:
    """``uv pip install --offline --no-index --no-deps --find-links WHEELHOUSE --target SITE``
    of the exact wheels `fuzzer.builds.wheels.resolve_extras` chose: uv installs (RECORD, ``.data`` directories), the
    manifest's resolution (the build's Requires-Dist, the rules, what the shared stack already
    satisfies) stays attnfuzz's data."""
    command = [*(uv_command() or ["uv"]), "pip", "install", "--quiet", "--offline", "--no-index", "--no-deps"]
    command += ["--python", sys.executable]
    for wheelhouse in wheelhouses:
        command += ["--find-links", str(wheelhouse)]
    command += ["--target", str(site), *map(str, wheels)]
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode:
        tail = (completed.stderr or completed.stdout).strip()[-2000:]
        raise BuildPrepareError(f"uv pip install into {site} failed (exit {completed.returncode}): {tail}")


def install_wheels(wheels: Sequence[Path], site: Path, installer: str, wheelhouses: Sequence[Path]) -> None:
    site.mkdir(parents=True, exist_ok=True)
    installer = resolve_installer(installer)
    if not wheels:  # an adopted build may need a site only for the FlashAttention 2 merge
        return
    if installer == "pip":
        _pip_install(wheels, site, wheelhouses)
    elif installer == "uv":
        _uv_install(wheels, site, wheelhouses)
    else:
        for wheel in wheels:
            unpack_wheel(wheel, site)


def check_installer(installer: str) -> None:
    if installer not in INSTALLERS:
        raise BuildError(f"installer: unknown value {installer!r} (allowed: {', '.join(INSTALLERS)})")


__all__ = [
    "check_installer",
    "install_wheels",
    "resolve_installer",
    "unpack_wheel",
    "uv_command",
]
