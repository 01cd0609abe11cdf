"""The Jinja2 environment of the HTML pages (autoescaped) and its display filters."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

from fastapi.templating import Jinja2Templates

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"


def pretty_json(value: Any) -> str:
    """Indented, key-sorted JSON for a ``<pre>`` block (escaped by the template)."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def compact_json(value: Any) -> str:
    """One-line JSON for a table cell (escaped by the template)."""
    return json.dumps(value, sort_keys=True, default=str)


def format_datetime(value: datetime | None) -> str:
    """``2026-11-29 17:49:03 UTC``."""
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def format_number(value: Any) -> str:
    """Floats to 4 significant digits; everything else as is."""
    if isinstance(value, float):
        return str(value) if not math.isfinite(value) else f"{value:.4g}"
    return "" if value is None else str(value)


def metrics_table(metrics: Any) -> tuple[list[str], list[tuple[str, list[Any]]]] | None:
    """Per-tensor metrics ``{"out": {"error_ratio": 2.1, ...}, "lse": {...}}`` as (columns, rows).

    None when ``metrics`` is not a mapping of tensor name to mapping (the page then shows JSON).
    """
    if not isinstance(metrics, dict) or not metrics or not all(isinstance(v, dict) for v in metrics.values()):
        return None
    columns: list[str] = []
    for figures in metrics.values():
        columns.extend(k for k in figures if k not in columns)
    rows = [(tensor, [figures.get(c) for c in columns]) for tensor, figures in metrics.items()]
    return columns, rows


def make_templates() -> Jinja2Templates:
    """Templates from ``service/templates`` with the filters above."""
    templates = Jinja2Templates(directory=TEMPLATE_DIR)
    templates.env.filters.update(
        pretty_json=pretty_json, compact_json=compact_json, dt=format_datetime, num=format_number
    )
    templates.env.globals.update(metrics_table=metrics_table)
    return templates
