"""Builds as first-class things: package versions, build identity, and one environment per build.

A *build* is a `fuzzer.results.BuildFingerprint` plus the versions of every package the selected
backends name in ``Backend.packages`` (`build_packages`). A *package line* is every build that
has a version of one package (``flash-attn-4``, ``transformer-engine``, ``torch``, ``cudnn``,
...); builds of a line are ordered by `version_key` (PEP 440, pre-releases included:
``4.0.0b9 < 4.0.0b11 < 4.0.0rc1 < 4.0.0``), then by first-seen time.

A *build environment* (`BuildEnvironment`) is a list of directories that go first on a child
process's ``PYTHONPATH`` (the project root and the rest of the stack come after them, shared), the
way a GPU host selects a flash-attn-4 build with ``PYTHONPATH=$PWD:/tmp/fa4/<version>:...``.
Environments are prepared from an offline wheelhouse (GPU hosts are often air-gapped) into
``<builds_dir>/<package>-<version>/site`` (`prepare_from_wheelhouse`), or adopted from a directory
that already holds the build (`adopt_build_dir`, e.g. ``/tmp/fa4/4.0.0b11``). Each is described
by ``build.json`` beside its ``site``.

Extra packages a build needs (an older ``nvidia-cutlass-dsl`` for an older flash-attn-4) are
data, resolved by `resolve_extras`:

1. the build's own ``Requires-Dist`` (from the wheel's METADATA), and
2. the rules of a mapping file (`load_rules`; the shipped one is ``fuzzer/builds/build_rules.toml``),
   for what the metadata does not say (flash-attn-4 declares ``nvidia-cutlass-dsl>=4.4.0.dev1``
   and still breaks with newer ones).

A requirement already satisfied by the shared environment costs nothing; otherwise the newest
matching wheel of the wheelhouse goes into the build's ``site`` (and its own requirements are
resolved the same way). Everything is installed without dependencies: the rest of the stack is
shared on purpose.
"""

from __future__ import annotations

import email.parser
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import sys_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from fuzzer.results import BuildFingerprint, declared_packages
from oracle.errors import AttnFuzzError

MANIFEST_NAME = "build.json"
MANIFEST_SCHEMA_VERSION = 1
BUILDS_DIR_ENV = "ATTNFUZZ_BUILDS_DIR"
DEFAULT_RULES = Path(__file__).resolve().parent / "build_rules.toml"
INSTALLERS = ("auto", "uv", "unpack", "pip")

#: Package lines read from `BuildFingerprint` fields (line name -> field), from their
#: `fuzzer.results.package_line` declarations. ``cuda``, ``cudnn`` and ``nvidia-driver`` are not
#: pip packages but are lines all the same.
FINGERPRINT_LINES: dict[str, str] = BuildFingerprint.lines()


class BuildError(AttnFuzzError, ValueError):
    """Bad build input: a version that is not PEP 440, a malformed rules file or manifest, a
    directory that holds no build of the package. The message names the field or file."""


class BuildPrepareError(AttnFuzzError):
    """A build environment cannot be prepared: its wheel or an extra it needs is not in the
    wheelhouse, an install failed. A bisection treats such a build as ``skip``."""


# ------------------------------------------------------------------------------------ versions
def parse_version(text: str, field: str = "version") -> Version:
    """``text`` as a PEP 440 version.

    Raises:
        BuildError: ``text`` is not a PEP 440 version (the message names ``field``).
    """
    try:
        return Version(str(text))
    except InvalidVersion as exc:
        raise BuildError(f"{field}: {text!r} is not a PEP 440 version (e.g. 4.0.0b11, 2.13.0)") from exc


def version_key(text: str) -> tuple[int, Any]:
    """A sort key for version strings: PEP 440 order (pre-releases included) for valid versions;
    strings that are not PEP 440 sort before every valid one, alphabetically."""
    try:
        return (1, Version(str(text)))
    except InvalidVersion:
        return (0, str(text))


def normalise_package(name: str) -> str:
    """The PEP 503 normalised name (``Flash_Attn.4`` -> ``flash-attn-4``).

    Raises:
        BuildError: ``name`` is empty.
    """
    if not name or not str(name).strip():
        raise BuildError("package: must be a distribution name, got an empty string")
    return canonicalize_name(str(name).strip())


# ------------------------------------------------------------------------------------ identity
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


# ------------------------------------------------------------------------------------ wheelhouse
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


def _requirements_from(lines: Iterable[str], origin: str) -> list[Requirement]:
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
    return _requirements_from(message.get_all("Requires-Dist") or [], str(path))


# ------------------------------------------------------------------------------------ rules
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


# ------------------------------------------------------------------------------------ extras
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


# ------------------------------------------------------------------------------------ environments
@dataclass(frozen=True)
class BuildEnvironment:
    """Where one build of a package lives: directories to put first on ``PYTHONPATH``.

    Attributes:
        package: normalised distribution name (the line).
        version: the build's version of it.
        paths: directories in ``PYTHONPATH`` order (the build's ``site``, or an adopted directory
            after its extras' ``site``).
        source: ``"wheelhouse"`` (prepared from a wheel) or ``"build-dir"`` (adopted).
        extras: packages installed beside the build (`resolve_extras`).
        manifest: the ``build.json`` describing it, None for an environment not written down.
        prepared_at: when it was prepared (UTC ISO 8601), "" if unknown.
        unresolved: requirements nothing satisfied, kept with ``allow_missing`` (the replay then
            shows whether the build runs without them).
    """

    package: str
    version: str
    paths: tuple[Path, ...]
    source: str = "build-dir"
    extras: tuple[ExtraPackage, ...] = ()
    manifest: Path | None = None
    prepared_at: str = ""
    unresolved: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``flash-attn-4==4.0.0b11``."""
        return f"{self.package}=={self.version}"

    @property
    def sort_key(self) -> tuple[Any, str]:
        return (version_key(self.version), self.prepared_at)

    def pythonpath(self, *after: str | Path) -> str:
        """``PYTHONPATH`` for a child: this build's paths, then ``after`` (project root, the
        inherited ``PYTHONPATH``), empty entries dropped."""
        entries = [str(p) for p in self.paths] + [str(a) for a in after if str(a)]
        return os.pathsep.join(dict.fromkeys(e for e in entries if e))

    def cudnn_dir(self) -> Path | None:
        """The cuDNN this build ships (``nvidia/cudnn/lib`` of an unpacked ``nvidia-cudnn-cu1x``
        wheel in one of its paths), None when it ships none. A replay on such a build sets
        ``ATTNFUZZ_CUDNN`` to it, so every backend child of the replay loads that cuDNN
        (`fuzzer.environment.resolve_cudnn_choice`) and the fingerprint records its version."""
        from fuzzer.environment import TORCH_CUDNN_SUBDIRS

        for path in self.paths:
            for sub in TORCH_CUDNN_SUBDIRS:
                directory = Path(path) / sub
                if directory.is_dir() and any(p.name.startswith("libcudnn.so") for p in directory.iterdir()):
                    return directory
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "package": self.package,
            "version": self.version,
            "paths": [str(p) for p in self.paths],
            "source": self.source,
            "extras": [e.to_json() for e in self.extras],
            "prepared_at": self.prepared_at,
            "unresolved": list(self.unresolved),
        }

    @classmethod
    def from_json(cls, data: Any, origin: str = "<json>") -> BuildEnvironment:
        """Parse a manifest.

        Raises:
            BuildError: naming ``origin`` and the field.
        """
        if not isinstance(data, dict):
            raise BuildError(f"{origin}: expected a JSON object")
        if data.get("schema_version") != MANIFEST_SCHEMA_VERSION:
            raise BuildError(
                f"{origin}: schema_version {data.get('schema_version')!r} is not supported (allowed: {MANIFEST_SCHEMA_VERSION})"
            )
        for key in ("package", "version", "source"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise BuildError(f"{origin}: {key}: must be a non-empty string")
        parse_version(data["version"], f"{origin}: version")
        paths = data.get("paths")
        if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
            raise BuildError(f"{origin}: paths: must be a non-empty list of directories")
        extras = []
        for i, e in enumerate(data.get("extras", [])):
            try:
                extras.append(ExtraPackage(str(e["name"]), str(e["version"]), str(e["wheel"]), str(e.get("reason", ""))))
            except (KeyError, TypeError) as exc:
                raise BuildError(f"{origin}: extras[{i}]: needs name, version and wheel") from exc
        return cls(
            package=normalise_package(data["package"]),
            version=data["version"],
            paths=tuple(Path(p) for p in paths),
            source=data["source"],
            extras=tuple(extras),
            manifest=Path(origin) if origin != "<json>" else None,
            prepared_at=str(data.get("prepared_at", "")),
            unresolved=tuple(str(u) for u in data.get("unresolved", [])),
        )


def default_builds_dir() -> Path:
    """``$ATTNFUZZ_BUILDS_DIR``, else ``~/.cache/attnfuzz/builds``."""
    return Path(os.environ.get(BUILDS_DIR_ENV) or Path.home() / ".cache" / "attnfuzz" / "builds")


def _utcnow_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


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
    _check_installer(installer)
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
    of the exact wheels `resolve_extras` chose: uv installs (RECORD, ``.data`` directories), the
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


def _install(wheels: Sequence[Path], site: Path, installer: str, wheelhouses: Sequence[Path]) -> None:
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


def _check_installer(installer: str) -> None:
    if installer not in INSTALLERS:
        raise BuildError(f"installer: unknown value {installer!r} (allowed: {', '.join(INSTALLERS)})")


def _write_environment(env: BuildEnvironment, root: Path, staged: Path | None) -> BuildEnvironment:
    """Move the staged directory into ``root`` (atomically replacing an older one) and write the
    manifest, so a killed preparation never leaves a half environment behind."""
    if staged is not None:
        old = root.with_name(root.name + f".old-{os.getpid()}")
        if root.exists():
            root.rename(old)
        staged.rename(root)
        shutil.rmtree(old, ignore_errors=True)
    else:
        root.mkdir(parents=True, exist_ok=True)
    manifest = root / MANIFEST_NAME
    env = BuildEnvironment(
        env.package, env.version, env.paths, env.source, env.extras, manifest, env.prepared_at or _utcnow_iso(), env.unresolved
    )
    tmp = manifest.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(env.to_json(), indent=2, sort_keys=True) + "\n")
    tmp.replace(manifest)
    return env


def _environment_dir(builds_dir: Path, package: str, version: str) -> Path:
    return builds_dir / f"{package}-{version}"


# ------------------------------------------------------------------------------------ FA2 + FA4
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
    return _fa2_extra_label(fa2_dir)


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
    return _fa4_extra_label(fa4_cute)


def _fa4_extra_label(fa4_cute: Path) -> ExtraPackage:
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


def _fa2_extra_label(fa2_dir: Path) -> ExtraPackage:
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


def prepare_from_wheelhouse(
    package: str,
    version: str,
    wheelhouses: Sequence[str | Path],
    builds_dir: str | Path,
    *,
    rules: Sequence[ExtraRule] = (),
    installer: str = "auto",
    shared_version: Callable[[str], str | None] = installed_version,
    force: bool = False,
    allow_missing: bool = False,
    shared_fa2: Callable[[], Path | None] = find_shared_fa2,
    shared_fa4: Callable[[], Path | None] = find_shared_fa4,
) -> BuildEnvironment:
    """Prepare ``<builds_dir>/<package>-<version>/site`` from the wheelhouse: the build's wheel
    and the extras it needs (`resolve_extras`), all without dependencies. A build already
    prepared from the same wheel with the same extras is reused unless ``force``. A
    flash-attn-4 build gets the shared FlashAttention 2 merged in when there is one
    (`merge_shared_fa2`, recorded as an extra), so that ``flash_attn.cute`` is this build.

    Args:
        package, version: the build (``flash-attn-4``, ``4.0.0b11``).
        wheelhouses: directories of wheels (offline; nothing is downloaded).
        builds_dir: where build environments live.
        rules: extra-package rules (`load_rules`).
        installer: ``"auto"`` (``uv`` when uv is available, else ``unpack``), ``"uv"`` (``uv pip
            install --offline --no-index --no-deps --target``), ``"unpack"`` (unzip, merging
            folders, as gpu_stage.py does) or ``"pip"`` (``pip install --no-index --no-deps
            --target``).
        shared_version: versions of the shared stack (default: this interpreter's).
        force: prepare again even when an up-to-date environment exists.
        allow_missing: keep going when a ``Requires-Dist`` requirement is satisfied neither by
            the shared stack nor by the wheelhouse (recorded in ``unresolved``).
        shared_fa2: where the shared stack's FlashAttention 2 is (`find_shared_fa2`), None
            without one.
        shared_fa4: the shared stack's ``flash_attn/cute`` (`find_shared_fa4`): a FlashAttention
            2 build links it into its own ``flash_attn`` (`keep_shared_fa4`).

    Raises:
        BuildError: ``version`` is not PEP 440, or ``installer`` is unknown.
        BuildPrepareError: no wheel of the build, an extra cannot be resolved, or the install
            failed.
    """
    _check_installer(installer)
    name = normalise_package(package)
    wanted = parse_version(version)
    wheelhouses = [Path(w) for w in wheelhouses]
    wheels = scan_wheelhouse(wheelhouses)
    own = [w for w in wheels if w.name == name and w.version == wanted]
    if not own:
        have = ", ".join(str(w.version) for w in wheels if w.name == name) or "none"
        raise BuildPrepareError(
            f"no wheel of {name}=={version} for this interpreter in {', '.join(map(str, wheelhouses))} "
            f"(versions there: {have})"
        )
    wheel = own[0]
    unresolved: list[str] | None = [] if allow_missing else None
    extras = resolve_extras(name, wanted, wheel_requirements(wheel.path), wheels, rules, shared_version, unresolved)
    builds_dir = Path(builds_dir).resolve()
    root = _environment_dir(builds_dir, name, str(wheel.version))
    site = root / "site"
    manifest = root / MANIFEST_NAME
    fa2_dir = shared_fa2() if name == FA4_PACKAGE else None
    if fa2_dir is not None:
        extras = [*extras, _fa2_extra_label(fa2_dir)]
    fa4_cute = shared_fa4() if name == FA2_PACKAGE else None
    if fa4_cute is not None:
        extras = [*extras, _fa4_extra_label(fa4_cute)]
    if manifest.exists() and not force:
        try:
            existing = BuildEnvironment.from_json(json.loads(manifest.read_text()), str(manifest))
        except (BuildError, json.JSONDecodeError):
            existing = None
        if (
            existing is not None
            and existing.extras == tuple(extras)
            and existing.unresolved == tuple(unresolved or ())
            and existing.paths == (site,)
            and site.is_dir()
        ):
            return existing
    staged = root.with_name(root.name + f".tmp-{os.getpid()}")
    shutil.rmtree(staged, ignore_errors=True)
    try:
        by_name = {w.path.name: w.path for w in wheels}
        wheel_extras = [e for e in extras if e.wheel in by_name]
        _install([wheel.path, *(by_name[e.wheel] for e in wheel_extras)], staged / "site", installer, wheelhouses)
        if fa2_dir is not None:
            extras[-1] = merge_shared_fa2(staged / "site", fa2_dir)
        if fa4_cute is not None:
            extras[-1] = keep_shared_fa4(staged / "site", fa4_cute)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    env = BuildEnvironment(name, str(wheel.version), (site,), "wheelhouse", tuple(extras), unresolved=tuple(unresolved or ()))
    return _write_environment(env, root, staged)


def distribution_in(directory: str | Path, package: str) -> importlib.metadata.Distribution | None:
    """The ``package`` distribution whose ``*.dist-info`` is directly in ``directory``, or None."""
    name = normalise_package(package)
    for dist in importlib.metadata.distributions(path=[str(directory)]):
        if canonicalize_name(dist.metadata["Name"] or "") == name:
            return dist
    return None


def adopt_build_dir(
    directory: str | Path,
    package: str,
    builds_dir: str | Path | None = None,
    *,
    wheelhouses: Sequence[str | Path] = (),
    rules: Sequence[ExtraRule] = (),
    installer: str = "auto",
    shared_version: Callable[[str], str | None] = installed_version,
    allow_missing: bool = False,
    shared_fa2: Callable[[], Path | None] = find_shared_fa2,
) -> BuildEnvironment:
    """Use a directory that already holds a build (``/tmp/fa4/4.0.0b11``); its version comes from
    the ``*.dist-info`` inside it. Extras it needs (`resolve_extras`) go into
    ``<builds_dir>/<package>-<version>/site``, which then comes before ``directory``; with no
    extras needed and no ``builds_dir`` nothing is written. A flash-attn-4 build with a shared
    FlashAttention 2 (``shared_fa2``, `find_shared_fa2`) gets that site too, holding FA2 merged
    with a link to the directory's ``flash_attn/cute`` (`merge_shared_fa2`): otherwise FA2's
    regular package would make ``flash_attn.cute`` the shared stack's FA4, not this one.

    Raises:
        BuildError: ``directory`` does not exist or holds no distribution of ``package``.
        BuildPrepareError: an extra is needed and cannot be resolved from ``wheelhouses``.
    """
    _check_installer(installer)
    directory = Path(directory).resolve()
    name = normalise_package(package)
    if not directory.is_dir():
        raise BuildError(f"build_dir: {str(directory)!r} is not a directory")
    dist = distribution_in(directory, name)
    if dist is None:
        raise BuildError(f"build_dir: {str(directory)!r} holds no {name} distribution (no {name}-*.dist-info in it)")
    version = dist.version
    requirements = _requirements_from(dist.requires or [], f"{directory}/{name}.dist-info")
    wheelhouses = [Path(w) for w in wheelhouses]
    wheels = scan_wheelhouse(wheelhouses) if wheelhouses else []
    unresolved: list[str] | None = [] if allow_missing else None
    extras = resolve_extras(name, version, requirements, wheels, rules, shared_version, unresolved)
    fa2_dir = shared_fa2() if name == FA4_PACKAGE else None
    if fa2_dir is not None and fa2_dir == directory:
        fa2_dir = None  # the directory is itself the shared stack: nothing to shadow
    if not extras and fa2_dir is None:
        env = BuildEnvironment(name, version, (directory,), "build-dir", unresolved=tuple(unresolved or ()))
        if builds_dir is None:
            return env
        return _write_environment(env, _environment_dir(Path(builds_dir).resolve(), name, version), None)
    root = _environment_dir(Path(builds_dir or default_builds_dir()).resolve(), name, version)
    staged = root.with_name(root.name + f".tmp-{os.getpid()}")
    shutil.rmtree(staged, ignore_errors=True)
    try:
        by_name = {w.path.name: w.path for w in wheels}
        _install([by_name[e.wheel] for e in extras], staged / "site", installer, wheelhouses)
        if fa2_dir is not None:
            extras = [*extras, merge_shared_fa2(staged / "site", fa2_dir, directory / "flash_attn" / "cute")]
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    env = BuildEnvironment(
        name, version, (root / "site", directory), "build-dir", tuple(extras), unresolved=tuple(unresolved or ())
    )
    return _write_environment(env, root, staged)


def load_environments(builds_dir: str | Path, package: str | None = None) -> list[BuildEnvironment]:
    """Every prepared environment under ``builds_dir`` (of ``package`` if given), ordered by
    version (PEP 440) then preparation time. A missing ``builds_dir`` gives an empty list.

    Raises:
        BuildError: a manifest is malformed (the message names the file and the field).
    """
    builds_dir = Path(builds_dir)
    if not builds_dir.is_dir():
        return []
    wanted = normalise_package(package) if package else None
    found = []
    for manifest in sorted(builds_dir.glob(f"*/{MANIFEST_NAME}")):
        try:
            data = json.loads(manifest.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise BuildError(f"{manifest}: not readable JSON: {exc}") from exc
        env = BuildEnvironment.from_json(data, str(manifest))
        if wanted is None or env.package == wanted:
            found.append(env)
    return sorted(found, key=lambda e: (e.package, *e.sort_key))


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


@dataclass(frozen=True)
class BuildSelection:
    """The builds of one package line to replay or bisect, in order, each either ready
    (`BuildEnvironment`) or preparable on demand from the wheelhouse.

    Attributes:
        package: the line.
        versions: every version, oldest first.
        ready: environments already prepared or adopted, by version.
        wheelhouses, builds_dir, rules, installer, allow_missing: how a version that is not
            ready is prepared.
        failed: adopted directories that could not be made ready, by version: why.
    """

    package: str
    versions: tuple[str, ...]
    ready: Mapping[str, BuildEnvironment] = field(default_factory=dict)
    wheelhouses: tuple[Path, ...] = ()
    builds_dir: Path | None = None
    rules: tuple[ExtraRule, ...] = ()
    installer: str = "auto"
    allow_missing: bool = False
    failed: Mapping[str, str] = field(default_factory=dict)

    def environment(self, version: str) -> BuildEnvironment:
        """The environment of ``version``, prepared from the wheelhouse when needed.

        Raises:
            BuildPrepareError: it is not ready and cannot be prepared (an adopted directory whose
                extras could not be resolved says why).
        """
        if version in self.ready:
            return self.ready[version]
        if version in self.failed:
            raise BuildPrepareError(self.failed[version])
        if not self.wheelhouses:
            raise BuildPrepareError(f"{self.package}=={version}: not prepared and no wheelhouse given")
        return prepare_from_wheelhouse(
            self.package,
            version,
            self.wheelhouses,
            self.builds_dir or default_builds_dir(),
            rules=self.rules,
            installer=self.installer,
            allow_missing=self.allow_missing,
        )

    def between(self, good: str, bad: str) -> list[str]:
        """The versions from ``good`` to ``bad`` inclusive, in order.

        Raises:
            BuildError: ``good`` or ``bad`` is not PEP 440, not among the versions, or ``good``
                is not older than ``bad``.
        """
        wanted_good, wanted_bad = parse_version(good, "good"), parse_version(bad, "bad")
        parsed = {v: Version(v) for v in self.versions}
        for name, wanted in (("good", wanted_good), ("bad", wanted_bad)):
            if wanted not in parsed.values():
                known = ", ".join(self.versions) or "none"
                raise BuildError(f"{name}: no build {self.package}=={wanted} (known: {known})")
        if not wanted_good < wanted_bad:
            raise BuildError(f"good: {good} must be older than bad: {bad}")
        return [v for v in self.versions if wanted_good <= parsed[v] <= wanted_bad]


def select_builds(
    package: str,
    *,
    builds_dir: str | Path | None = None,
    build_dirs: Sequence[str | Path] = (),
    wheelhouses: Sequence[str | Path] = (),
    rules: Sequence[ExtraRule] = (),
    installer: str = "auto",
    versions: Sequence[str] = (),
    allow_missing: bool = False,
) -> BuildSelection:
    """Gather the builds of ``package``: adopted ``build_dirs`` first, then environments prepared
    in ``builds_dir``, then wheelhouse versions (prepared on demand). ``versions`` restricts the
    selection. A version found twice keeps the first source. ``allow_missing``: see
    `prepare_from_wheelhouse`.

    Raises:
        BuildError: a build directory or manifest is invalid, or a version in ``versions`` is
            not PEP 440 or is found nowhere. (An adopted directory whose extras cannot be
            resolved is kept in ``failed``: its `BuildSelection.environment` raises, so a
            bisection skips it.)
    """
    name = normalise_package(package)
    _check_installer(installer)
    ready: dict[str, BuildEnvironment] = {}
    failed: dict[str, str] = {}
    for directory in build_dirs:
        try:
            env = adopt_build_dir(
                directory, name, builds_dir, wheelhouses=wheelhouses, rules=rules, installer=installer, allow_missing=allow_missing
            )
        except BuildPrepareError as exc:
            dist = distribution_in(directory, name)
            failed.setdefault(dist.version, f"{directory}: {exc}")
            continue
        ready.setdefault(env.version, env)
    if builds_dir is not None:
        for env in load_environments(builds_dir, name):
            ready.setdefault(env.version, env)
    all_versions = set(ready) | set(failed)
    if wheelhouses:
        all_versions.update(wheelhouse_versions(wheelhouses, name))
    if versions:
        wanted = {parse_version(v, "version") for v in versions}
        missing = wanted - {Version(v) for v in all_versions}
        if missing:
            raise BuildError(f"version: no build {name}=={sorted(missing)[0]} (known: {', '.join(sorted(all_versions, key=version_key)) or 'none'})")
        all_versions = {v for v in all_versions if Version(v) in wanted}
    ordered = tuple(sorted(all_versions, key=version_key))
    return BuildSelection(
        name,
        ordered,
        {v: e for v, e in ready.items() if v in all_versions},
        tuple(Path(w) for w in wheelhouses),
        Path(builds_dir) if builds_dir is not None else None,
        tuple(rules),
        installer,
        allow_missing,
        {v: r for v, r in failed.items() if v in all_versions and v not in ready},
    )


__all__ = [
    "BuildEnvironment",
    "BuildError",
    "BuildPrepareError",
    "BuildSelection",
    "ExtraPackage",
    "ExtraRule",
    "FINGERPRINT_LINES",
    "WheelFile",
    "adopt_build_dir",
    "build_key",
    "build_packages",
    "default_builds_dir",
    "fetch_wheels",
    "find_shared_fa2",
    "find_shared_fa4",
    "installed_version",
    "load_environments",
    "load_rules",
    "keep_shared_fa4",
    "merge_shared_fa2",
    "normalise_package",
    "parse_version",
    "prepare_from_wheelhouse",
    "resolve_installer",
    "resolve_extras",
    "scan_wheelhouse",
    "select_builds",
    "unpack_wheel",
    "uv_command",
    "version_key",
    "wheel_requirements",
    "wheelhouse_versions",
]
