"""The ``attnfuzz`` console entry point: `main()` runs the typer app of `service.cli.main`.

Kept apart so the entry point and ``python -m attnfuzz`` name a module of attnfuzz's own (a
project with its own ``service`` package on ``sys.path`` cannot shadow it when child processes
are started with ``-m attnfuzz``).
"""

from __future__ import annotations


def main() -> None:
    """Run ``attnfuzz`` with ``sys.argv``; exits with the codes listed in ``attnfuzz --help``.
    ``attnfuzz --version`` alone answers without loading the CLI (typer, rich)."""
    import sys

    if sys.argv[1:] == ["--version"]:
        from attnfuzz import __version__

        print(f"attnfuzz {__version__}")
        return
    from service.cli.main import app

    app(prog_name="attnfuzz")
