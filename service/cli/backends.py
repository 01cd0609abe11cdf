"""``attnfuzz backends``: every known backend (built-ins, entry points, ``--backend module:attr``)
with its device, variants, versions, what its child process loaded, and why it is unavailable here.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from oracle.errors import AttnFuzzError
from service.cli.common import cwd_importable, fail, id_column, print_json, print_table, terminal_text, visible_text


def backends(
    backend: Annotated[Optional[list[str]], typer.Option("--backend", help="Extra plugin module:attr.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List every known backend: device, variants, versions, and why it is unavailable here.

    The opt-in backends (`fuzzer.registry.OPT_IN_MODULES`: the CPU context-parallel ring and its
    planted variants, which exercise attnfuzz itself) are listed too, marked 'opt-in': a fuzz
    run takes them only when named with --backend."""
    from fuzzer import registry

    specs = [b for b in (backend or []) if ":" in b]
    if specs:
        cwd_importable()  # as fuzz and export do: --backend mymod:MyBackend finds ./mymod.py
    try:
        found = registry.discover(specs, opt_in=True)
    except AttnFuzzError as exc:
        fail(exc)
    from fuzzer.executor import probe_backends

    rows = []
    # CUDA backends are loaded in their own children, as a worker loads them: what is listed is
    # what runs (the cuDNN each child loaded, the flash-attn-4 build flash_attn.cute came from)
    availability, runtime = probe_backends([found[name] for name in sorted(found)])
    for name, (b, spec) in sorted(found.items()):
        reason = availability.get(name)
        opt_in = spec.partition(":")[0] in registry.OPT_IN_MODULES
        rows.append(
            {
                "name": name,
                "device": b.device,
                "variants": list(b.variants),
                "versions": b.versions(),
                "available": reason is None,
                "reason": reason or "",
                "spec": spec,
                "opt_in": opt_in,
                "runtime": runtime.get(name, {}),
            }
        )
    if as_json:
        print_json(rows)
        return
    table = Table(title="attnfuzz backends")
    id_column(table, "backend", [visible_text(row["name"]) for row in rows])  # names are never cut (README)
    id_column(table, "device", [row["device"] for row in rows])
    id_column(table, "variants", [v for row in rows for v in row["variants"]])  # one per line, whole
    table.add_column("versions", overflow="fold")
    table.add_column("status", overflow="fold")
    for row in rows:
        status = "[green]available[/]" if row["available"] else f"[yellow]unavailable:[/] {terminal_text(row['reason'])}"
        if row["opt_in"]:
            status += f"\nopt-in: fuzzed only with --backend {terminal_text(row['name'])}"
        versions = "\n".join(f"{k}={v}" for k, v in row["versions"].items())
        versions += _runtime_text(row["runtime"])
        table.add_row(terminal_text(row["name"]), terminal_text(row["device"]), "\n".join(terminal_text(v) for v in row["variants"]),
                      "\n".join(terminal_text(line) for line in versions.split("\n")), status)
    print_table(table)


def _runtime_text(runtime: dict[str, str]) -> str:
    """What a backend's child loaded, for the backends table: the imported FA4 build (module
    path and version), FA2, and the cuDNN/cuBLASLt/NCCL versions with cuDNN's file."""
    parts = []
    if runtime.get("flash_attn_4_module"):
        parts.append(f"flash_attn.cute={runtime['flash_attn_4_module']} ({runtime.get('flash_attn_4', 'unknown')})")
    if runtime.get("flash_attn"):
        parts.append(f"flash_attn(FA2)={runtime['flash_attn']}")
    if runtime.get("cudnn"):
        parts.append(f"cuDNN={runtime['cudnn']} ({runtime.get('cudnn_library', '?')})")
    for key, label in (("cublaslt", "cuBLASLt"), ("nccl", "NCCL")):
        if runtime.get(key):
            parts.append(f"{label}={runtime[key]}")
    if runtime.get("cudnn_conflict"):
        parts.append(runtime["cudnn_conflict"])
    return ("\nloaded: " + "; ".join(parts)) if parts else ""


def register(app: typer.Typer) -> None:
    """Add ``backends`` to ``app`` (the ``attnfuzz`` typer application)."""
    app.command()(backends)
