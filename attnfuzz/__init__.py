"""attnfuzz's own top-level name: what other processes import by name.

The project keeps its layout (``oracle``, ``fuzzer``, ``service``); this small package holds what
is looked up *by module name* from outside: the ``attnfuzz`` console entry (`attnfuzz.cli`,
also ``python -m attnfuzz``), the pytest plugin (`attnfuzz.pytest_plugin`, entry point
``pytest11: attnfuzz``) and, in a wheel, the Alembic migrations (``attnfuzz.migrations``, mapped
from the repository's ``alembic/`` directory by pyproject.toml). Importing it imports nothing else.

``__version__`` is the installed distribution's version (``importlib.metadata``), or
``"0+unknown"`` when attnfuzz runs from a source tree that was never installed.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("attnfuzz")
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
