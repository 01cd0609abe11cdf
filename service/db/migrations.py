"""Run the Alembic migrations in ``<repo>/alembic`` (``attnfuzz.migrations`` in a wheel) without an alembic.ini.

Every function takes either a database URL or an open `Connection`. With a Connection the
migrations run on it as is: inside the caller's transaction if one is open (the caller commits
or rolls back), which is how the tests build their schema.

Example:
    >>> from service import migrations
    >>> migrations.upgrade("sqlite:///attnfuzz.db")
    >>> migrations.current("sqlite:///attnfuzz.db")
    '0001'
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from service.db.engine import make_engine



def _script_location() -> Path:
    """Where the migrations are: ``<repo>/alembic`` in a source tree or an editable install, the
    package ``attnfuzz.migrations`` in an installed wheel (setup.py maps one onto the other).

    Checked by content (``env.py`` and ``versions/``): beside an installed wheel,
    ``<site-packages>/alembic`` is the Alembic library itself, not our migrations.
    """
    import importlib.util

    source_tree = Path(__file__).resolve().parents[2] / "alembic"
    candidates = [source_tree]
    try:
        spec = importlib.util.find_spec("attnfuzz.migrations")
    except ImportError:  # pragma: no cover - attnfuzz is not importable
        spec = None
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) for p in spec.submodule_search_locations]
    for candidate in candidates:
        if (candidate / "env.py").is_file() and (candidate / "versions").is_dir():
            return candidate
    raise RuntimeError(f"attnfuzz's migrations are missing: none of {[str(c) for c in candidates]} holds env.py")


SCRIPT_LOCATION = _script_location()
FILE_TEMPLATE = "%%(year)d_%%(month).2d_%%(day).2d_%%(rev)s_%%(slug)s"


def make_config(url: str | Connection | None = None) -> Config:
    """An Alembic `Config` for ``<repo>/alembic`` aimed at ``url`` (a URL or a Connection).

    ``None`` leaves the choice to env.py (``$ATTNFUZZ_DATABASE_URL``, else ``sqlite:///attnfuzz.db``).
    """
    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    config.set_main_option("file_template", FILE_TEMPLATE)
    config.set_main_option("truncate_slug_length", "40")
    if isinstance(url, Connection):
        config.attributes["connection"] = url
    elif url is not None:
        # Through attributes, not set_main_option: ConfigParser would read "%" in the URL
        # (escaped passwords, options=-csearch_path%3D...) as interpolation.
        config.attributes["url"] = url
    return config


def upgrade(url: str | Connection, revision: str = "head") -> None:
    """Migrate the database at ``url`` up to ``revision`` (default: the newest)."""
    command.upgrade(make_config(url), revision)


def downgrade(url: str | Connection, revision: str) -> None:
    """Migrate the database at ``url`` down to ``revision`` (``"base"`` drops every table)."""
    command.downgrade(make_config(url), revision)


def current(url: str | Connection) -> str | None:
    """The revision the database at ``url`` is at, or None when it has never been migrated."""
    if isinstance(url, Connection):
        return MigrationContext.configure(url).get_current_revision()
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def head() -> str:
    """The newest revision in ``<repo>/alembic/versions``."""
    revision = ScriptDirectory.from_config(make_config()).get_current_head()
    if revision is None:  # pragma: no cover - the repository always ships a revision
        raise RuntimeError(f"no migration found under {SCRIPT_LOCATION}")
    return revision


def revision(url: str | Connection, message: str, autogenerate: bool = True) -> None:
    """Write a new migration script comparing the models with the database at ``url``.

    Read and edit the generated file before committing it.
    """
    command.revision(make_config(url), message=message, autogenerate=autogenerate)
