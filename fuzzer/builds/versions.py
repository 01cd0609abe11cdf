"""Package versions and build identity: PEP 440 parsing and ordering, package-name normalisation,
the package versions of a build and its key, and the build wing's two errors.

A *build* is a `fuzzer.results.BuildFingerprint` plus the versions of every package the selected
backends name in ``Backend.packages`` (`build_packages`). A *package line* is every build that
has a version of one package (``flash-attn-4``, ``transformer-engine``, ``torch``, ``cudnn``,
...); builds of a line are ordered by `version_key` (PEP 440, pre-releases included:
``4.0.0b9 < 4.0.0b11 < 4.0.0rc1 < 4.0.0``), then by first-seen time.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping

from packaging.version import InvalidVersion, Version

from fuzzer import results
from fuzzer.results import BuildFingerprint, declared_packages
from oracle.errors import AttnFuzzError


#: Package lines read from `BuildFingerprint` fields (line name -> field), from their
#: `fuzzer.results.package_line` declarations. ``cuda``, ``cudnn`` and ``nvidia-driver`` are not
#: pip packages but are lines all the same.
FINGERPRINT_LINES: dict[str, str] = BuildFingerprint.lines()


class BuildError(AttnFuzzError, ValueError):
    """Bad build input: a version that is not PEP 440, a malformed rules file or manifest, a
    directory that holds no build of the package. The message names the field or file."""

    exit_code = 2


class BuildPrepareError(AttnFuzzError):
    """A build environment cannot be prepared: its wheel or an extra it needs is not in the
    wheelhouse, an install failed. A bisection treats such a build as ``skip``."""

    exit_code = 8


def parse_version(text: str, field: str = "version") -> Version:
    """``text`` as a PEP 440 version.

    Raises:
        BuildError: ``text`` is not a PEP 440 version (the message names ``field``).
    """
    try:
        return Version(str(text))
    except InvalidVersion as exc:
        raise BuildError(f"{field}: {text!r} is not a PEP 440 version (e.g. 4.0.0b11, 2.13.0)") from exc


def normalise_package(name: str) -> str:
    """The PEP 503 normalised name (``Flash_Attn.4`` -> ``flash-attn-4``): `fuzzer.results.normalise_package`
    with the build wing's error.

    Raises:
        BuildError: ``name`` is empty.
    """
    try:
        return results.normalise_package(name)
    except results.ResultValidationError as exc:
        raise BuildError(str(exc)) from exc


def build_packages(fingerprint: BuildFingerprint, versions: Mapping[str, str]) -> dict[str, str]:
    """Every package version of a build: `fuzzer.results.declared_packages` (the fingerprint's
    lines plus ``versions``, names normalised, absent ones left out).

    Raises:
        BuildError: a package name is empty.
    """
    return declared_packages(fingerprint, {normalise_package(name): version for name, version in versions.items()})


def build_key(fingerprint: BuildFingerprint, packages: Mapping[str, str]) -> str:
    """The 16-hex-digit identity of a build, stored in ``builds.fingerprint_id``: a hash over its
    device and every package version it declares (`fuzzer.results.build_identity`), so builds that
    differ in any package (a plugin's own one included) are different builds. A build of the
    fingerprint's lines alone has ``fingerprint.fingerprint_id`` (what a fuzz worker registers).

    Args:
        packages: `build_packages` of the build (the fingerprint's lines included).
    """
    return fingerprint.identity(packages)


def installed_version(name: str) -> str | None:
    """The version of distribution ``name`` visible to this interpreter (first on ``sys.path``),
    None when absent."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


__all__ = [
    "BuildError",
    "BuildPrepareError",
    "FINGERPRINT_LINES",
    "build_key",
    "build_packages",
    "installed_version",
    "normalise_package",
    "parse_version",
]
