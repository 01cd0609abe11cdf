"""One environment per build: where a build lives, how it is prepared or adopted, and its manifest.

A *build environment* (`BuildEnvironment`) is a list of directories that go first on a child
process's ``PYTHONPATH`` (the project root and the rest of the stack come after them, shared), the
way a GPU host selects a flash-attn-4 build with ``PYTHONPATH=$PWD:/tmp/fa4/<version>:...``.
Environments are prepared from an offline wheelhouse (GPU hosts are often air-gapped) into
``<builds_dir>/<package>-<version>/site`` (`prepare_from_wheelhouse`: the wheel and its extras,
`fuzzer.builds.wheels.resolve_extras`, installed by `fuzzer.builds.install`), or adopted from a
directory that already holds the build (`adopt_build_dir`, e.g. ``/tmp/fa4/4.0.0b11``). Each is
described by ``build.json`` beside its ``site``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from fuzzer.builds.install import check_installer, install_wheels
from fuzzer.builds.shared_fa import (
    FA2_PACKAGE,
    FA4_PACKAGE,
    fa2_extra_label,
    fa4_extra_label,
    find_shared_fa2,
    find_shared_fa4,
    keep_shared_fa4,
    merge_shared_fa2,
)
from fuzzer.results import version_key
from fuzzer.builds.versions import (
    BuildError,
    BuildPrepareError,
    installed_version,
    normalise_package,
    parse_version,
)
from fuzzer.builds.wheels import (
    ExtraPackage,
    ExtraRule,
    requirements_from,
    resolve_extras,
    scan_wheelhouse,
    wheel_requirements,
)


MANIFEST_NAME = "build.json"


MANIFEST_SCHEMA_VERSION = 1


BUILDS_DIR_ENV = "ATTNFUZZ_BUILDS_DIR"


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
    check_installer(installer)
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
        extras = [*extras, fa2_extra_label(fa2_dir)]
    fa4_cute = shared_fa4() if name == FA2_PACKAGE else None
    if fa4_cute is not None:
        extras = [*extras, fa4_extra_label(fa4_cute)]
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
        install_wheels([wheel.path, *(by_name[e.wheel] for e in wheel_extras)], staged / "site", installer, wheelhouses)
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
    check_installer(installer)
    directory = Path(directory).resolve()
    name = normalise_package(package)
    if not directory.is_dir():
        raise BuildError(f"build_dir: {str(directory)!r} is not a directory")
    dist = distribution_in(directory, name)
    if dist is None:
        raise BuildError(f"build_dir: {str(directory)!r} holds no {name} distribution (no {name}-*.dist-info in it)")
    version = dist.version
    requirements = requirements_from(dist.requires or [], f"{directory}/{name}.dist-info")
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
        install_wheels([by_name[e.wheel] for e in extras], staged / "site", installer, wheelhouses)
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


__all__ = [
    "BuildEnvironment",
    "adopt_build_dir",
    "default_builds_dir",
    "load_environments",
    "prepare_from_wheelhouse",
]
