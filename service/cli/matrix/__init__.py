"""The build-matrix commands of the ``attnfuzz`` CLI, one module per group (`builds_command`, `replay_command`,
`bisect_command`, `corpus_command`; what they share: `options`); `register` adds them to the main typer app.

Commands:

=============================  ==================================================================
``builds fetch``               download wheels into a wheelhouse (``pip download``; a convenience
                               where the index is reachable)
``builds prepare``             one environment per build of a package from an offline wheelhouse
                               (or adopt directories like ``/tmp/fa4/<version>``)
``builds list``                prepared environments and the builds of a line in the database
``builds replay``              replay the corpus and every bucket's case on each build, each in
                               its own child process
``replay``                     replay them on the current build
``regressions``                regressions, new signatures and fixes along a package line
``bisect``                     the first failing build of a case, in O(log n) replays
``corpus export`` / ``import`` the readable corpus to and from the database
=============================  ==================================================================

Exit codes follow `service.cli.common.EXIT_CODES` (2 bad input, 5 database) plus 8 (a build cannot be prepared)
and 9 (a replay contradicts the corpus with ``--check``, or a bisection's endpoints do not
bracket the failure).
"""

from __future__ import annotations

import typer

from service.cli.matrix import bisect_command, builds_command, corpus_command, replay_command


def register(app: typer.Typer) -> None:
    """Add ``builds``, ``replay``, ``regressions``, ``bisect``, ``corpus export`` and
    ``corpus import`` to ``app`` (in the order ``attnfuzz --help`` lists them)."""
    builds_app = typer.Typer(help="Build environments: one per build of a package, replays across them.", no_args_is_help=True)
    app.add_typer(builds_app, name="builds")
    builds_app.command("fetch")(builds_command.builds_fetch)
    builds_app.command("prepare")(builds_command.builds_prepare)
    builds_app.command("list")(builds_command.builds_list)
    builds_app.command("replay")(builds_command.builds_replay)
    app.command("replay")(replay_command.replay)
    app.command("regressions")(replay_command.regressions)
    app.command("bisect")(bisect_command.bisect)
    corpus_app = typer.Typer(help="The readable JSON corpus (corpus/<backend>/<variant>-<case_id>.json).", no_args_is_help=True)
    app.add_typer(corpus_app, name="corpus")
    corpus_app.command("export")(corpus_command.corpus_export)
    corpus_app.command("import")(corpus_command.corpus_import)
