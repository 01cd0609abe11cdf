"""Which builds of a package line to replay or bisect: adopted directories, prepared environments
and wheelhouse versions gathered into one ordered `BuildSelection`, each version prepared on demand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from fuzzer.builds.envs import (
    BuildEnvironment,
    adopt_build_dir,
    default_builds_dir,
    distribution_in,
    load_environments,
    prepare_from_wheelhouse,
)
from fuzzer.builds.install import check_installer
from fuzzer.results import version_key
from fuzzer.builds.versions import (
    BuildError,
    BuildPrepareError,
    normalise_package,
    parse_version,
)
from fuzzer.builds.wheels import ExtraRule, wheelhouse_versions


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
    check_installer(installer)
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
    "BuildSelection",
    "select_builds",
]
