"""Fixtures of the build-matrix tests: fake builds in a wheelhouse, the CLI, and the databases
of the service tests (SQLite, and PostgreSQL when reachable), built by the migrations."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tests.builds.fakebuilds import KERNEL_BEHAVIOUR, make_wheelhouse
from tests.service.conftest import (  # noqa: F401  (fixtures reused as they are)
    connection,
    database,
    db_kind,
    fresh_database_url,
    postgres_server,
    postgresql_database,
    session,
    sqlite_database,
    store,
)

FAKE_BACKEND_SPEC = "tests.builds.fake_backend:FakeKernelBackend"
BROKEN_VERSION = "1.2"


@pytest.fixture(scope="session")
def fake_wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every fakekernel version of `KERNEL_BEHAVIOUR` (1.2 broken to import) and both fakedeps;
    ``rules.toml`` beside it."""
    root = tmp_path_factory.mktemp("fake-builds")
    return make_wheelhouse(root / "wheels", list(KERNEL_BEHAVIOUR), broken=(BROKEN_VERSION,))


@pytest.fixture(scope="session")
def fake_rules(fake_wheelhouse: Path) -> Path:
    return fake_wheelhouse.parent / "rules.toml"


@pytest.fixture
def cli() -> Callable[..., object]:
    """``cli(*args)``: invoke the build-matrix commands on a local typer app (as `service.cli.main`
    will once it calls `service.cli.matrix.register`)."""
    from service.cli import matrix as cli_matrix
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """attnfuzz (test app)."""

    cli_matrix.register(app)
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)

    return invoke
