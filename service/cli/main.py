"""The ``attnfuzz`` command line (typer): the `app`, its global options (``--version``,
``--log-level``) and the list of commands, each defined in its own module:

======================================  ===========================================
``fuzz``                                `service.cli.fuzz` (display: `service.cli.fuzz_display`)
``backends``                            `service.cli.backends`
``report``                              `service.cli.report`
``serve``                               `service.cli.serve`
``export``                              `service.cli.export`
``replay``, ``regressions``, ``bisect``,
``builds``, ``corpus``                  `service.cli.matrix`
``db upgrade``/``current``              `service.cli.db`
``cases list``/``show``/``add``         `service.cli.cases`
``buckets``                             `service.cli.buckets`
``fleet up``/``status``/``down``        `service.cli.fleet` (the actors: `service.fleet`)
======================================  ===========================================

What they share (``--db``, migrating, the exit codes `EXIT_CODES`) is in `service.cli.common`.
The CLI composes the fuzzer (worker, backends) with storage (the SQL store, behind the worker's
local spool, `fuzzer.spool`); its only extra job is turning `AttnFuzzError` subclasses into exit
codes (shown by ``attnfuzz --help`` and in the README).

Nothing at import time loads torch or Hypothesis (``attnfuzz --help`` and ``--version`` stay
fast); each command imports what it runs. ``python -m service.cli.main`` runs the app.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from service.cli import matrix as matrix_cli
from service.cli import backends, buckets, cases, db, export, fleet, fuzz, report, serve
from service.cli.common import EXIT_CODES_HELP, LogLevel, configure_logging, out


class _LogLevelEverywhere(TyperGroup):
    """The ``attnfuzz`` group: its ``--log-level`` is an option of every command too, so
    ``attnfuzz fuzz --log-level info`` works as ``attnfuzz --log-level info fuzz`` does (after the
    command it used to be a usage error). Each command gets a copy of the group's option that
    calls `configure_logging` when given (and does nothing when not); a level given after the
    command wins over one given before it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        option = next(p for p in self.params if p.name == "log_level")
        for command in _commands(self):
            if not any(p.name == "log_level" for p in command.params):
                command.params.append(_command_log_level(option))


def _commands(group: Any) -> list[Any]:
    """Every command under ``group`` (subgroups' commands included, and the subgroups)."""
    found = []
    for command in getattr(group, "commands", {}).values():
        found.append(command)
        found += _commands(command)
    return found


def _command_log_level(option: Any) -> Any:
    """A copy of the group's ``--log-level`` option for one command: not passed to the command,
    no envvar (the group reads ``$ATTNFUZZ_LOG_LEVEL``), applied before the command's other
    options (eager)."""
    copied = copy.copy(option)
    copied.expose_value = False
    copied.is_eager = True
    copied.envvar = None
    copied.show_envvar = False
    copied.default = None
    copied.callback = _apply_log_level
    return copied


def _apply_log_level(ctx: Any, param: Any, value: Any) -> None:
    """Callback of a command's ``--log-level``: `configure_logging` when the option is given."""
    if value is not None and not ctx.resilient_parsing:
        configure_logging(getattr(value, "value", value).lower())


app = typer.Typer(
    cls=_LogLevelEverywhere,
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
            help="Messages of attnfuzz on stderr from this level up (what the worker does: info); the libraries' "
            "(SQLAlchemy, Alembic, uvicorn, httpx, Hypothesis) from warning up, or debug. Also after the command.",
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
matrix_cli.register(app)
buckets.register(app)
fleet.register(app)

if __name__ == "__main__":
    app()
