"""The ``attnfuzz`` command line (typer): the `app`, its global options (``--version``,
``--log-level``) and the list of commands, each defined in its own module:

======================================  ===========================================
``fuzz``                                `service.cli.fuzz` (display: `service.cli.fuzz_display`)
``backends``                            `service.cli.backends`
``report``                              `service.cli.report`
``serve``                               `service.cli.serve`
``export``                              `service.cli.export`
``replay``, ``regressions``, ``bisect``,
``builds``, ``corpus``                  `service.cli.builds`
``db upgrade``/``current``              `service.cli.db`
``cases list``/``show``/``add``         `service.cli.cases`
``buckets``                             `service.cli.buckets`
======================================  ===========================================

What they share (``--db``, migrating, the exit codes `EXIT_CODES`) is in `service.cli.common`.
The CLI composes the fuzzer (worker, backends) with storage (the SQL store, behind the worker's
local spool, `fuzzer.spool`); its only extra job is turning `AttnFuzzError` subclasses into exit
codes (shown by ``attnfuzz --help`` and in the README).

Nothing at import time loads torch or Hypothesis (``attnfuzz --help`` and ``--version`` stay
fast); each command imports what it runs. ``python -m service.cli.main`` runs the app.
"""

from __future__ import annotations

from typing import Annotated

import typer

from service.cli import builds as builds_cli
from service.cli import backends, buckets, cases, db, export, fuzz, report, serve
from service.cli.common import EXIT_CODES_HELP, LogLevel, configure_logging, out

app = typer.Typer(
    help="attnfuzz: differential fuzzing of attention kernels against a float64 oracle.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
)
app.add_typer(db.db_app, name="db")
app.add_typer(cases.cases_app, name="cases")


def _print_version(value: bool) -> None:
    if value:
        from service import __version__

        out.print(f"attnfuzz {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
    log_level: Annotated[
        LogLevel,
        typer.Option(
            "--log-level",
            envvar="ATTNFUZZ_LOG_LEVEL",
            show_envvar=True,
            case_sensitive=False,
            help="Messages of attnfuzz (and of SQLAlchemy, Alembic, uvicorn, Hypothesis) on stderr from this level up.",
        ),
    ] = LogLevel.warning,
) -> None:
    """attnfuzz: differential fuzzing of attention kernels against a float64 oracle."""
    configure_logging(log_level.value)


# Registration order is the order ``attnfuzz --help`` lists the commands in.
fuzz.register(app)
backends.register(app)
report.register(app)
serve.register(app)
export.register(app)
builds_cli.register(app)
buckets.register(app)

if __name__ == "__main__":
    app()
