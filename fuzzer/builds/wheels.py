"""Wheels and the extra packages a build needs: scanning an offline wheelhouse, reading a wheel's
``Requires-Dist``, the extra-package rules, and resolving what goes into a build's ``site``.

Extra packages a build needs (an older ``nvidia-cutlass-dsl`` for an older flash-attn-4) are
data, resolved by `resolve_extras`:

1. the build's own ``Requires-Dist`` (from the wheel's METADATA), and
2. the rules of a mapping file (`load_rules`; the shipped one is ``fuzzer/builds/build_rules.toml``),
   for what the metadata does not say (flash-attn-4 declares ``nvidia-cutlass-dsl>=4.4.0.dev1``
   and still breaks with newer ones).

A requirement already satisfied by the shared environment costs nothing; otherwise the newest
matching wheel of the wheelhouse goes into the build's ``site`` (and its own requirements are
resolved the same way). `fetch_wheels` fills a wheelhouse where an index is reachable.
"""

from __future__ import annotations

import email.parser
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import sys_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from fuzzer.builds.versions import (
    BuildError,
    BuildPrepareError,
    installed_version,
    normalise_package,
    parse_version,
)


DEFAULT_RULES = Path(__file__).resolve().parent / "build_rules.toml"


@dataclass(frozen=True)
class WheelFile:
    """One wheel of a wheelhouse.

    Attributes:
        path: the ``.whl`` file.
        name: normalised distribution name.
        version: its version.
    """

    path: Path
    name: str
    version: Version

    @property
    def label(self) -> str:
        return f"{self.name}=={self.version}"


def scan_wheelhouse(wheelhouses: Sequence[str | Path]) -> list[WheelFile]:
    """Every wheel installable by this interpreter (tags from `packaging.tags.sys_tags`) in the
    given directories, sorted by name then version. Other files are ignored.

    Raises:
        BuildError: a wheelhouse is not a directory, or a ``.whl`` file has an invalid name.
    """
    supported = set(sys_tags())
    found: dict[tuple[str, Version], WheelFile] = {}
    for root in wheelhouses:
        root = Path(root)
        if not root.is_dir():
            raise BuildError(f"wheelhouse: {str(root)!r} is not a directory")
        for path in sorted(root.glob("*.whl")):
            try:
                name, version, _build, tags = parse_wheel_filename(path.name)
            except (InvalidWheelFilename, InvalidVersion) as exc:
                raise BuildError(f"wheelhouse: {path}: invalid wheel file name: {exc}") from exc
            if not tags & supported:
                continue
            found.setdefault((str(name), version), WheelFile(path, str(name), version))
    return sorted(found.values(), key=lambda w: (w.name, w.version))


def wheelhouse_versions(wheelhouses: Sequence[str | Path], package: str) -> list[str]:
    """The versions of ``package`` in the wheelhouse, oldest first (PEP 440 order)."""
    name = normalise_package(package)
    return [str(w.version) for w in scan_wheelhouse(wheelhouses) if w.name == name]


def _read_metadata_text(path: Path) -> str:
    with zipfile.ZipFile(path) as archive:
        names = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if not names:
            raise BuildPrepareError(f"{path}: no *.dist-info/METADATA in the wheel")
        return archive.read(names[0]).decode("utf-8", errors="replace")


def requirements_from(lines: Iterable[str], origin: str) -> list[Requirement]:
    requirements = []
    for line in lines:
        try:
            requirement = Requirement(line)
        except InvalidRequirement as exc:
            raise BuildPrepareError(f"{origin}: Requires-Dist {line!r} is invalid: {exc}") from exc
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # an extra's dependency, or another platform's
        requirements.append(requirement)
    return requirements


def wheel_requirements(path: str | Path) -> list[Requirement]:
    """The ``Requires-Dist`` of a wheel that apply here (markers evaluated, extras left out).

    Raises:
        BuildPrepareError: the wheel has no METADATA or an invalid requirement.
    """
    path = Path(path)
    message = email.parser.Parser().parsestr(_read_metadata_text(path))
    return requirements_from(message.get_all("Requires-Dist") or [], str(path))


@dataclass(frozen=True)
class ExtraRule:
    """Builds of ``package`` whose version is in ``versions`` also need ``requires``.

    Attributes:
        package: normalised distribution name of the build.
        versions: which of its versions the rule is for (pre-releases included).
        requires: requirements added to the build's own ``Requires-Dist``.
        why: the reason, shown in the manifest.
    """

    package: str
    versions: SpecifierSet
    requires: tuple[Requirement, ...]
    why: str = ""

    def matches(self, package: str, version: Version) -> bool:
        return normalise_package(package) == self.package and self.versions.contains(version, prereleases=True)


def load_rules(path: str | Path | None = None) -> list[ExtraRule]:
    """The extra-package rules of a TOML file (default: the shipped ``fuzzer/builds/build_rules.toml``)::

        [[rule]]
        package = "flash-attn-4"
        versions = "<4.0.0b27"
        requires = ["nvidia-cutlass-dsl==4.6.0.dev0", "quack-kernels==0.5.3"]
        why = "..."

    Raises:
        BuildError: the file cannot be read or a rule is malformed (the message names the file,
            the rule's index and the field).
    """
    path = Path(path) if path is not None else DEFAULT_RULES
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BuildError(f"rules: {path}: cannot read: {exc}") from exc
    rules = []
    raw_rules = data.get("rule", [])
    if not isinstance(raw_rules, list):
        raise BuildError(f"rules: {path}: 'rule' must be an array of tables ([[rule]])")
    for i, raw in enumerate(raw_rules):
        where = f"rules: {path}: rule[{i}]"
        if not isinstance(raw, dict):
            raise BuildError(f"{where}: must be a table")
        unknown = set(raw) - {"package", "versions", "requires", "why"}
        if unknown:
            raise BuildError(f"{where}.{sorted(unknown)[0]}: unknown field (allowed: package, versions, requires, why)")
        if not isinstance(raw.get("package"), str):
            raise BuildError(f"{where}.package: must be a distribution name")
        try:
            versions = SpecifierSet(str(raw.get("versions", "")))
        except InvalidSpecifier as exc:
            raise BuildError(f"{where}.versions: {raw.get('versions')!r} is not a version specifier") from exc
        requires_raw = raw.get("requires")
        if not isinstance(requires_raw, list) or not requires_raw:
            raise BuildError(f"{where}.requires: must be a non-empty list of requirements")
        requires = []
        for j, text in enumerate(requires_raw):
            try:
                requires.append(Requirement(str(text)))
            except InvalidRequirement as exc:
                raise BuildError(f"{where}.requires[{j}]: {text!r} is not a requirement: {exc}") from exc
        rules.append(ExtraRule(normalise_package(raw["package"]), versions, tuple(requires), str(raw.get("why", ""))))
    return rules


@dataclass(frozen=True)
class ExtraPackage:
    """A package installed into a build's own ``site`` because the shared stack does not satisfy
    a requirement of the build.

    Attributes:
        name, version: what was installed.
        wheel: the wheel file it came from.
        reason: which requirement asked for it, and from where (Requires-Dist or a rule).
    """

    name: str
    version: str
    wheel: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "wheel": self.wheel, "reason": self.reason}


def _best(candidates: list[WheelFile]) -> WheelFile:
    finals = [w for w in candidates if not w.version.is_prerelease]
    return max(finals or candidates, key=lambda w: w.version)


def resolve_extras(
    package: str,
    version: str | Version,
    requirements: Sequence[Requirement],
    wheels: Sequence[WheelFile],
    rules: Sequence[ExtraRule] = (),
    shared_version: Callable[[str], str | None] = installed_version,
    unresolved: list[str] | None = None,
) -> list[ExtraPackage]:
    """Which wheels a build needs in its own ``site`` beyond its own wheel.

    Args:
        package, version: the build.
        requirements: its ``Requires-Dist`` (see `wheel_requirements`).
        wheels: the wheelhouse (`scan_wheelhouse`).
        rules: the mapping-file rules (`load_rules`); those matching the build add requirements.
        shared_version: the version of a distribution in the shared stack, None when absent.
        unresolved: when given, a ``Requires-Dist`` requirement that nothing satisfies is
            appended here (as text) instead of raising; a rule's requirement still raises.

    Returns:
        The extra packages, in the order they were found (a requirement of an extra is resolved
        like the build's own).

    Raises:
        BuildPrepareError: a requirement is satisfied neither by the shared stack nor by any
            wheel of the wheelhouse, or two requirements ask for incompatible versions.
    """
    name = normalise_package(package)
    parsed = version if isinstance(version, Version) else parse_version(str(version))
    queue: list[tuple[Requirement, str, bool]] = [(r, f"Requires-Dist of {name} {parsed}", False) for r in requirements]
    for rule in rules:
        if rule.matches(name, parsed):
            why = f" ({rule.why})" if rule.why else ""
            queue.extend((r, f"rule for {rule.package} {rule.versions}{why}", True) for r in rule.requires)
    chosen: dict[str, ExtraPackage] = {}
    while queue:
        requirement, origin, from_rule = queue.pop(0)
        wanted = normalise_package(requirement.name)
        if wanted == name:
            continue
        if wanted in chosen:
            if not requirement.specifier.contains(chosen[wanted].version, prereleases=True):
                raise BuildPrepareError(
                    f"{name} {parsed}: {requirement} ({origin}) conflicts with {wanted}=={chosen[wanted].version} "
                    f"({chosen[wanted].reason})"
                )
            continue
        have = shared_version(wanted)
        if have is not None and requirement.specifier.contains(have, prereleases=True):
            continue
        candidates = [w for w in wheels if w.name == wanted and requirement.specifier.contains(w.version, prereleases=True)]
        if not candidates:
            shared = f"the shared stack has {have}" if have is not None else "the shared stack does not have it"
            if unresolved is not None and not from_rule:
                unresolved.append(f"{requirement} ({origin}; {shared})")
                continue
            raise BuildPrepareError(
                f"{name} {parsed} needs {requirement} ({origin}); {shared} and no wheel in the wheelhouse "
                f"matches (put one there, e.g. pip download --no-deps '{requirement}')"
            )
        best = _best(candidates)
        chosen[wanted] = ExtraPackage(best.name, str(best.version), best.path.name, f"{requirement} ({origin})")
        queue.extend((r, f"Requires-Dist of {best.label}", False) for r in wheel_requirements(best.path))
    return list(chosen.values())


def fetch_wheels(
    requirements: Sequence[str], wheelhouse: str | Path, pip_args: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """Download wheels into ``wheelhouse`` with ``pip download --no-deps --pre`` (a convenience
    where the index is reachable; ``pip_args`` passes e.g. ``--platform``/``--python-version``
    for another host, or ``--no-index --find-links DIR``).

    Raises:
        BuildPrepareError: pip failed (its output tail is in the message).
    """
    Path(wheelhouse).mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--pre", "-d", str(wheelhouse)]
    command += [*pip_args, *requirements]
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode:
        tail = (completed.stderr or completed.stdout).strip()[-2000:]
        raise BuildPrepareError(f"pip download failed (exit {completed.returncode}): {tail}")
    return completed


__all__ = [
    "ExtraPackage",
    "ExtraRule",
    "WheelFile",
    "fetch_wheels",
    "load_rules",
    "requirements_from",
    "resolve_extras",
    "scan_wheelhouse",
    "wheel_requirements",
    "wheelhouse_versions",
]
