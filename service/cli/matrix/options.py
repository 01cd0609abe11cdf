"""What the build-matrix commands share: their options (``--package``, ``--builds-dir``,
``--wheelhouse``, ``--rules``, ``--installer``, ...), opening the database they write
(`open_engine`) and resolving the rules file and the builds directory. Their exit codes, 8 and 9
included, are `service.cli.common.EXIT_CODES`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Optional

import typer

from service.cli import common

PackageOption = Annotated[str, typer.Option("--package", help="The package line, e.g. flash-attn-4.")]
BuildsDirOption = Annotated[
    Optional[str],
    typer.Option(
        "--builds-dir",
        envvar="ATTNFUZZ_BUILDS_DIR",
        show_envvar=True,
        help="Where build environments live (default ~/.cache/attnfuzz/builds).",
    ),
]
BuildDirOption = Annotated[
    Optional[list[str]],
    typer.Option("--build-dir", help="A directory already holding one build (e.g. /tmp/fa4/4.0.0b11); repeatable."),
]
WheelhouseOption = Annotated[
    Optional[list[str]], typer.Option("--wheelhouse", help="A directory of wheels (offline); repeatable.")
]
RulesOption = Annotated[
    Optional[str], typer.Option("--rules", help="Extra-package rules (TOML; default fuzzer/builds/build_rules.toml).")
]
InstallerOption = Annotated[
    str,
    typer.Option(
        "--installer",
        help="auto (uv when available, else unpack), uv (uv pip install --offline --no-deps --target), "
        "unpack (unzip, as gpu_stage.py) or pip.",
    ),
]
AllowMissingOption = Annotated[
    bool,
    typer.Option(
        "--allow-missing",
        help="Prepare a build even when a Requires-Dist is in neither the shared stack nor the wheelhouse (the replay shows whether it runs).",
    ),
]
BackendOption = Annotated[
    Optional[list[str]],
    typer.Option("--backend", help="Backend name to replay, or module:attr of a plugin; repeatable (default: every backend the cases name)."),
]
DeviceOption = Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")]
IsolationOption = Annotated[
    str, typer.Option("--isolation", help="process (each backend in a child, crashes contained) or none.")
]
CaseTimeoutOption = Annotated[float, typer.Option("--case-timeout", help="Seconds per backend call.")]


def open_engine(db: str | None):
    """Migrate the database ``--db`` names and return an Engine on it (the caller disposes of it).

    Raises:
        ServiceError: the database cannot be opened or migrated (exit 5).
    """
    return common.open_database(db, write=True)[1]


def check_package(engine, package: str | None, known_elsewhere: Sequence[str] = ()) -> None:
    """A ``--package`` filter that names no package line in the database (nor in
    ``known_elsewhere``, e.g. prepared environments) is an error listing the lines it has.

    Raises:
        FieldValidationError: unknown package line (exit 2).
    """
    from service.errors import FieldValidationError
    from service.matrix.lines import package_lines

    if not package:
        return
    names = sorted({name for name, _count in package_lines(engine)} | set(known_elsewhere))
    if package not in names:
        raise FieldValidationError("package", f"no package line {package!r} (known: {', '.join(names) or 'none yet'})")


def load_rules(path: str | None):
    """The extra-package rules of ``--rules`` (default ``fuzzer/builds/build_rules.toml``)."""
    from fuzzer.builds import wheels

    return wheels.load_rules(path)


def builds_dir_path(path: str | None) -> Path:
    """``--builds-dir``, else the default (``~/.cache/attnfuzz/builds``)."""
    from fuzzer.builds.envs import default_builds_dir

    return Path(path) if path else default_builds_dir()
