"""``attnfuzz fleet up/status/down``: a campaign of fuzz workers on a running Ray cluster, one
actor per GPU (or per CPU slot), restarted when it dies, drained on stop (`service.fleet`).

Needs the ``fleet`` extra (``pip install 'attnfuzz[fleet]'``: Ray); without it each command exits 1
saying so.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from oracle.errors import AttnFuzzError
from service.cli.common import Device, db_url, fail, id_column, out, print_json, print_table

fleet_app = typer.Typer(help="A campaign of fuzz workers on a Ray cluster: one actor per GPU (or CPU slot).",
                        no_args_is_help=True)

AddressOption = Annotated[
    Optional[str],
    typer.Option("--address", envvar="RAY_ADDRESS", show_envvar=True,
                 help="The Ray cluster (host:port of its head; default: the cluster started on this machine)."),
]
CampaignOption = Annotated[
    str, typer.Option("--campaign", help="The campaign's name (its actors' Ray namespace: attnfuzz-fleet-NAME).")
]


def _env_pairs(values: list[str]) -> dict[str, str]:
    """``--env NAME`` (its value from this environment) or ``--env NAME=VALUE``."""
    import os

    from service.errors import FieldValidationError

    env = {}
    for value in values:
        name, sep, given = value.partition("=")
        if not name or not (name[0].isalpha() or name[0] == "_") or not all(c.isalnum() or c == "_" for c in name):
            raise FieldValidationError("env", f"{value!r} is not NAME or NAME=VALUE")
        if not sep:
            if name not in os.environ:
                raise FieldValidationError("env", f"{name} is not set in this environment")
            given = os.environ[name]
        env[name] = given
    return env


def up(
    fuzz_args: Annotated[
        Optional[list[str]],
        typer.Argument(help="Further 'attnfuzz fuzz' options, after '--'; {worker} in them is the worker's index "
                       "(e.g. -- --backend torch-cpu-math --ledger /tmp/ledger-{worker}.jsonl)."),
    ] = None,
    address: AddressOption = None,
    campaign: CampaignOption = "default",
    workers: Annotated[Optional[int], typer.Option("--workers", min=1, help="Actors to start (default: one per GPU, "
                                                   "or per CPU slot of --cpus-per-worker, of the whole cluster).")] = None,
    device: Annotated[Device, typer.Option(help="cuda: one GPU per worker (Ray num_gpus=1); cpu: --cpus-per-worker "
                                           "CPUs each; auto: cuda when the cluster has GPUs.")] = Device.auto,
    cpus_per_worker: Annotated[float, typer.Option(min=0.01, help="Ray CPUs per worker (a CPU worker keeps about 1.2 "
                                                   "cores busy).")] = 1.0,
    target: Annotated[Optional[str], typer.Option("--target", envvar="ATTNFUZZ_FLEET_TARGET", show_envvar=True,
                                                  help="Where the workers store: the service's http(s) URL (--server: "
                                                  "no database credentials on the workers; the writer token with --env "
                                                  "ATTNFUZZ_WRITER_TOKEN) or a database URL (--db), passed to them by "
                                                  "environment. Default: "
                                                  "the workers' own default ($ATTNFUZZ_DATABASE_URL on their nodes).")] = None,
    target_option: Annotated[Optional[str], typer.Option("--target-option", help="The 'fuzz' option --target is "
                                                         "given as (default: --server for an http(s) URL, else --db); "
                                                         "a database URL goes by environment, never on a command line.")] = None,
    time_budget: Annotated[Optional[float], typer.Option("--time-budget", min=1, help="Seconds the campaign lasts "
                                                         "(a restarted worker gets what is left); default: until "
                                                         "'fleet down'.")] = None,
    env: Annotated[Optional[list[str]], typer.Option("--env", help="NAME (from this environment) or NAME=VALUE, set "
                                                     "for every worker (a writer token); repeatable.")] = None,
    workdir: Annotated[Optional[str], typer.Option("--workdir", help="The workers' working directory on their nodes "
                                                   "(default: this one; plugins module:attr are imported from it).")] = None,
    log_dir: Annotated[Optional[str], typer.Option("--log-dir", help="Where each worker writes worker-<i>.log on its "
                                                   "node (default: --workdir).")] = None,
    max_restarts: Annotated[int, typer.Option("--max-restarts", min=-1, help="Restarts of a worker whose process "
                                              "died (-1: no bound).")] = -1,
    wait: Annotated[bool, typer.Option("--wait", help="Stay until every worker has ended (its --time-budget), "
                                       "then remove the actors; SIGTERM or Ctrl-C meanwhile drains them all (fleet "
                                       "down). For batch jobs: Slurm, a KubeRay RayJob.")] = False,
    poll: Annotated[float, typer.Option("--poll", min=0.1, help="With --wait: seconds between looks at the "
                                        "workers.")] = 30.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the started workers as JSON.")] = False,
) -> None:
    """Start a campaign: one detached Ray actor per worker, each running 'attnfuzz fuzz'.

    Workers are spread over the nodes; a worker whose process dies (a node lost, kill -9) is
    restarted by Ray and takes over what its worker left where it can (docs/fleet.md).
    """
    import os

    from service import fleet

    try:
        target_value = target
        option = target_option or fleet.target_option_for(target)
        if target_value is not None and option == "--db":
            target_value = db_url(target_value)  # a SQLite path made a URL, a bad URL refused here
        ray = fleet.connect(address, campaign) if workers is None else None
        spec_workers = workers
        if spec_workers is None:  # the whole cluster
            probe = fleet.FleetSpec(campaign=campaign, workers=1, device=Device(device).value, cpus_per_worker=cpus_per_worker)
            if probe.device == "auto":
                probe.device = "cuda" if ray.cluster_resources().get("GPU", 0) >= 1 else "cpu"
            spec_workers = fleet.cluster_slots(ray, probe)
            if spec_workers < 1:
                fail(AttnFuzzError(f"workers: the cluster at {address or 'this machine'} has no slot for a {probe.device} worker"), code=2)
        workdir = os.path.abspath(workdir or os.getcwd())
        spec = fleet.FleetSpec(
            campaign=campaign, workers=spec_workers, device=Device(device).value, cpus_per_worker=cpus_per_worker,
            target_option=option, target=target_value,
            ends_at=None if time_budget is None else time.time() + time_budget, fuzz_args=list(fuzz_args or []),
            env=_env_pairs(env or []), workdir=workdir, log_dir=os.path.abspath(log_dir or workdir),
            max_restarts=max_restarts,
        )
        started = fleet.up(address, spec)
    except AttnFuzzError as exc:
        fail(exc)
    for info in started:
        info["spec"] = _printable_spec(info["spec"])
    if as_json:
        print_json(started)
        return
    for info in started:
        out.print(f"worker {info['index']}: {info['state']} on {escape(info['host'])} (fuzz pid {info['fuzz_pid']}), "
                  f"log {escape(info['log'])}", soft_wrap=True)
    out.print(f"campaign {campaign}: {len(started)} workers; 'attnfuzz fleet status --campaign {campaign}' shows them")
    if wait:
        _wait_then_down(address, campaign, poll)


def _wait_then_down(address: str | None, campaign: str, poll_s: float) -> None:
    """``fleet up --wait``: `service.fleet.wait_for_end`, then remove the actors; a stop signal
    meanwhile (a scheduler's SIGTERM, Ctrl-C) drains them (`service.fleet.down`) and exits
    143/130; a worker that failed makes the exit code 1."""
    from fuzzer.results import stop_exit_code, stop_on_signals
    from service import fleet

    restore = stop_on_signals()
    try:
        try:
            records = fleet.wait_for_end(address, campaign, poll_s=poll_s)
        except KeyboardInterrupt:
            out.print(f"campaign {campaign}: stop signal, draining its workers")
            with _signals_held():
                fleet.down(address, campaign)
            raise typer.Exit(stop_exit_code()) from None
        with _signals_held():
            fleet.down(address, campaign)
    except AttnFuzzError as exc:
        fail(exc)
    finally:
        restore()
    failed = [r for r in records if r.get("state") == "failed"]
    for r in records:
        out.print(f"worker {r['index']}: {r.get('state')}, exit {r.get('exit_code')}, restarts {r['restarts']}")
    if failed:
        raise typer.Exit(1)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM ignored while the workers drain (a scheduler that signals every
    process, or a second Ctrl-C, must not cut the drain short); restored afterwards."""
    import signal

    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def _heartbeats(records: list[dict[str, Any]], db: str | None, server: str | None) -> dict:
    """The worker rows of the live records' fuzz processes, from ``--server``, else ``--db``, else
    the campaign's own database target; {} (with a warning) when none can be read."""
    from service import fleet

    keys = [(r["host"], r["fuzz_pid"]) for r in records if r.get("fuzz_pid")]
    spec = next((r["spec"] for r in records if r.get("spec")), None)
    try:
        if server:
            return fleet.heartbeats_from_service(server, keys)
        url = db_url(db) if db else None
        if url is None and spec and spec.get("target") and spec.get("target_option") == "--db":
            url = spec["target"]
        return fleet.heartbeats_from_db(url, keys) if url else {}
    except Exception as exc:  # noqa: BLE001 - the actors' state is shown all the same
        from fuzzer.text import masked_text

        out.print(f"[yellow]heartbeats not read:[/] {escape(masked_text(str(exc))[:300])}", soft_wrap=True)
        return {}


def _printable_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A campaign's spec fit to print: the target's password masked (`fuzzer.text.masked_url`),
    the values of ``--env`` variables (a writer token) hidden."""
    from fuzzer.text import masked_url

    shown = dict(spec)
    if shown.get("target"):
        shown["target"] = masked_url(shown["target"])
    shown["env"] = {name: "***" for name in shown.get("env") or {}}
    return shown


def status(
    address: AddressOption = None,
    campaign: CampaignOption = "default",
    db: Annotated[Optional[str], typer.Option("--db", help="Read the workers' heartbeats here (default: the "
                                              "campaign's --target when it is a database).")] = None,
    server: Annotated[Optional[str], typer.Option("--server", help="Read them from this 'attnfuzz serve' "
                                                  "(GET /api/workers) instead.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON list, a record per worker.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds each live actor has to answer "
                                           "(a busy node's actors answer slowly; one that does not shows an error).")] = 10.0,
) -> None:
    """Each worker of a campaign: Ray's actor state and restarts, its process, and from the
    database (or the service) its worker row's status, cases run and last heartbeat."""
    from service import fleet

    try:
        records = fleet.status(address, campaign, timeout_s=timeout)
    except AttnFuzzError as exc:
        fail(exc)
    beats = _heartbeats(records, db, server)
    for record in records:
        record["worker"] = beats.get((record.get("host"), record.get("fuzz_pid")))
        if record.get("spec"):
            record["spec"] = _printable_spec(record["spec"])
    if as_json:
        print_json(records)
        return
    table = Table(title=f"campaign {campaign}")
    id_column(table, "worker", [r["index"] for r in records])
    for header in ("actor", "restarts", "state", "host", "fuzz pid", "row", "cases", "last heartbeat"):
        table.add_column(header)
    for r in records:
        w = r.get("worker") or {}
        table.add_row(str(r["index"]), r["actor_state"], str(r["restarts"]), str(r.get("state", r.get("error", "-"))),
                      escape(str(r.get("host", "-"))), str(r.get("fuzz_pid") or "-"), str(w.get("status", "-")),
                      str(w.get("cases_run", "-")), str(w.get("last_heartbeat", "-")))
    print_table(table)


def down(
    address: AddressOption = None,
    campaign: CampaignOption = "default",
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds each worker has to flush and stop after "
                                           "SIGTERM before it is killed.")] = 30.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print each drained worker as JSON.")] = False,
) -> None:
    """Stop a campaign: every worker gets SIGTERM at once (it stores or spools what it holds and
    stops, exit 143), is killed after --timeout if it has not, and its actor is removed."""
    from service import fleet

    try:
        drained = fleet.down(address, campaign, timeout_s=timeout)
    except AttnFuzzError as exc:
        fail(exc)
    for info in drained:
        if info.get("spec"):
            info["spec"] = _printable_spec(info["spec"])
    if as_json:
        print_json(drained)
        return
    for info in drained:
        out.print(f"worker {info.get('index')}: {info.get('state', info.get('error'))}, exit {info.get('exit_code')}",
                  soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``fleet up/status/down`` to ``app``."""
    fleet_app.command("up")(up)
    fleet_app.command("status")(status)
    fleet_app.command("down")(down)
    app.add_typer(fleet_app, name="fleet")
