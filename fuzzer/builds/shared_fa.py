"""FlashAttention 2 and 4 in one build: ``flash_attn`` is a regular package in FlashAttention 2 and
a namespace portion in flash-attn-4 wheels, so a shared FA2 would shadow a build's FA4 (and a
shared FA4's ``flash_attn/cute`` an FA2 build's). The helpers here find the shared one and merge
it into a build's ``site`` so that ``flash_attn.cute`` is the build under test (``docs/build-matrix.md``).
"""

from __future__ import annotations

import email.parser
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from packaging.utils import canonicalize_name

from fuzzer.builds.versions import BuildPrepareError
from fuzzer.builds.wheels import ExtraPackage


#: The distribution whose namespace portion a shared FlashAttention 2 shadows.
FA4_PACKAGE = "flash-attn-4"


FA2_PACKAGE = "flash-attn"


def find_shared_fa2(search_path: Sequence[str] | None = None) -> Path | None:
    """The directory of the shared stack whose ``flash_attn/__init__.py`` Python would import
    first (FlashAttention 2's regular package), None when ``flash_attn`` is no regular package
    there (FA4 alone ships only namespace portions). Default search path: ``sys.path``."""
    for entry in sys.path if search_path is None else search_path:
        if (Path(entry or ".") / "flash_attn" / "__init__.py").is_file():
            return Path(entry or ".").resolve()
    return None


def _fa2_dist_infos(directory: Path) -> list[Path]:
    found = []
    for info in sorted(directory.glob("*.dist-info")):
        try:
            name = email.parser.Parser().parsestr((info / "METADATA").read_text(errors="replace"))["Name"] or ""
        except OSError:
            continue
        if canonicalize_name(name) == FA2_PACKAGE:
            found.append(info)
    return found


def merge_shared_fa2(site: Path, fa2_dir: Path, fa4_cute: Path | None = None) -> ExtraPackage:
    """Make ``site`` hold FlashAttention 2's regular ``flash_attn`` package *with this build's*
    ``flash_attn/cute`` inside it, as ``pip install flash-attn flash-attn-4==V`` would.

    A regular package anywhere on ``sys.path`` wins over namespace portions, so with FA2 in the
    shared stack (``/tmp/gpu-site``) a build folder ahead on ``PYTHONPATH`` is not what
    ``flash_attn.cute`` imports (``shared/gpu/FA2.md``). FA2's files are copied into ``site``
    (its ``flash_attn/`` without any ``cute/`` it carries, and its ``*.dist-info``); the build's
    ``cute`` is already there (a wheel unpacked into ``site``) or linked from ``fa4_cute`` (an
    adopted directory). FA2's compiled extension (``flash_attn_2_cuda*.so``, top level) keeps
    coming from the shared stack.

    Returns:
        The `ExtraPackage` recorded in the manifest (so a changed FA2 prepares the build again).

    Raises:
        BuildPrepareError: ``fa2_dir`` holds no FA2 package, or the build's ``cute`` is missing.
    """
    source = fa2_dir / "flash_attn"
    if not (source / "__init__.py").is_file():
        raise BuildPrepareError(f"{fa2_dir}: no flash_attn/__init__.py (FlashAttention 2) to merge")
    target = site / "flash_attn"
    target.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        if entry.name in ("cute", "__pycache__"):
            continue  # the build's own cute; never FA2's stale copy or the shared FA4's
        if entry.is_dir():
            shutil.copytree(entry, target / entry.name, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(entry, target / entry.name)
    infos = _fa2_dist_infos(fa2_dir)
    for info in infos:
        shutil.copytree(info, site / info.name, dirs_exist_ok=True)
    if fa4_cute is not None and not (target / "cute").exists():
        (target / "cute").symlink_to(fa4_cute.resolve(), target_is_directory=True)
    if not (target / "cute").is_dir():
        raise BuildPrepareError(f"{site}: no flash_attn/cute of the build to keep beside FlashAttention 2")
    return fa2_extra_label(fa2_dir)


def find_shared_fa4(search_path: Sequence[str] | None = None) -> Path | None:
    """The ``flash_attn/cute`` directory of the shared stack's flash-attn-4 (the first
    ``sys.path`` entry holding ``flash_attn/cute/interface.py`` beside a ``flash_attn_4-*.dist-info``),
    None without one."""
    for entry in sys.path if search_path is None else search_path:
        root = Path(entry or ".")
        if (root / "flash_attn" / "cute" / "interface.py").is_file() and any(root.glob("flash_attn_4-*.dist-info")):
            return (root / "flash_attn" / "cute").resolve()
    return None


def keep_shared_fa4(site: Path, fa4_cute: Path) -> ExtraPackage:
    """In a FlashAttention 2 build's ``site``, make ``flash_attn/cute`` the shared stack's
    flash-attn-4 (a link), replacing any copy the FA2 wheel ships (the FA2 sdist carries an early
    FA4 under ``flash_attn/cute``; ``shared/gpu/FA2.md``): FA2's regular package in the build's
    site would otherwise hide the shared FA4 from ``fa4``, ``te-fa4`` and TE's own import of it.

    Returns:
        The `ExtraPackage` the manifest records.
    """
    target = site / "flash_attn" / "cute"
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(fa4_cute, target_is_directory=True)
    return fa4_extra_label(fa4_cute)


def fa4_extra_label(fa4_cute: Path) -> ExtraPackage:
    root = fa4_cute.parent.parent
    infos = sorted(root.glob("flash_attn_4-*.dist-info"))
    version = "unknown"
    if infos:
        version = email.parser.Parser().parsestr((infos[0] / "METADATA").read_text(errors="replace"))["Version"] or version
    return ExtraPackage(
        FA4_PACKAGE,
        version,
        f"(shared: {root})",
        "this FlashAttention 2 build's regular flash_attn package would hide the shared flash-attn-4: "
        "flash_attn/cute links to it (any FA4 copy the FA2 wheel carries is dropped)",
    )


def fa2_extra_label(fa2_dir: Path) -> ExtraPackage:
    """The manifest's record of a FlashAttention 2 merged from ``fa2_dir``."""
    infos = _fa2_dist_infos(fa2_dir)
    version = "unknown"
    if infos:
        version = email.parser.Parser().parsestr((infos[0] / "METADATA").read_text(errors="replace"))["Version"] or version
    return ExtraPackage(
        FA2_PACKAGE,
        version,
        f"(shared: {fa2_dir})",
        "FlashAttention 2's regular flash_attn package in the shared stack would shadow this build's "
        "namespace portion: merged so that flash_attn.cute is this build",
    )


__all__ = [
    "fa2_extra_label",
    "fa4_extra_label",
    "find_shared_fa2",
    "find_shared_fa4",
    "keep_shared_fa4",
    "merge_shared_fa2",
]
