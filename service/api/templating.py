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
    """Floats to 4 significant digits (the stored stand-in of a non-finite ratio,
    `fuzzer.results.STORED_NONFINITE_RATIO`, as ``inf``); everything else as is."""
    from fuzzer.results import STORED_NONFINITE_RATIO

    if isinstance(value, float):
        if value >= STORED_NONFINITE_RATIO:
            return "inf"
        return str(value) if not math.isfinite(value) else f"{value:.4g}"
    return "" if value is None else str(value)


def format_ratio(value: Any) -> str:
    """An error ratio as shown (`service.db.findings.ratio_text`): ``inf``, never ``1e+300``."""
    from service.db.findings import ratio_text

    return ratio_text(value)


def consensus_counts(consensus: Any) -> str:
    """A bucket's consensus in a table cell: ``2 pass, 1 fails otherwise, 1 limit`` (empty without one)."""
    if consensus is None:
        return ""
    labels = {"passes": "pass", "fails the same way": "fail the same way", "fails otherwise": "fail otherwise",
              "fails as a design limit": "limit", "unsupported": "unsupported"}
    counts = consensus.counts if hasattr(consensus, "counts") else {}
    return ", ".join(f"{n} {labels.get(how, how)}" for how, n in counts.items() if n) or "no other result"


def consensus_names(consensus: Any) -> str:
    """Who did what on a bucket's case, for the tooltip of `consensus_counts`: backend/variant
    names by how (the signatures are on the bucket's page)."""
    if consensus is None:
        return ""
    groups: dict[str, list[str]] = {}
    for peer in consensus.peers:
        groups.setdefault(peer.how, []).append(f"{peer.backend}/{peer.variant}")
    return "; ".join(f"{how}: {', '.join(names)}" for how, names in groups.items())


def metrics_table(metrics: Any) -> tuple[list[str], list[tuple[str, list[Any]]]] | None:
    """Per-tensor metrics ``{"out": {"error_ratio": 2.1, ...}, "lse": {...}}`` as (columns, rows).

    Only the tensors' figures (``out``, ``lse``, ``dq``, ``dk``, ``dv``) are rows; the other blocks
    (``design``, ``cp``) are shown apart (`metrics_blocks`). None when ``metrics`` holds no tensor's
    mapping (the page then shows JSON).
    """
    if not isinstance(metrics, dict) or not metrics:
        return None
    tensors = {k: v for k, v in metrics.items() if k in TENSOR_NAMES and isinstance(v, dict)}
    if not tensors or any(not isinstance(v, dict) for k, v in metrics.items() if k in TENSOR_NAMES):
        return None
    columns: list[str] = []
    for figures in tensors.values():
        columns.extend(k for k in figures if k not in columns)
    rows = [(tensor, [figures.get(c) for c in columns]) for tensor, figures in tensors.items()]
    return columns, rows


def metrics_blocks(metrics: Any) -> dict[str, Any]:
    """The blocks of a result's metrics that are not a tensor's figures (``design``: the design
    explanation, ``cp``: context parallelism), for the page to show as JSON."""
    if not isinstance(metrics, dict):
        return {}
    return {k: v for k, v in metrics.items() if k not in TENSOR_NAMES}


CASE_FIELD_GROUPS = (
    ("shapes", ("batch_size", "seqlen_q", "seqlen_k", "seqlens_q", "seqlens_k", "num_heads", "num_heads_kv",
                "head_dim", "head_dim_v")),
    ("layout", ("dtype", "qkv_format")),
    ("mask", ("causal", "causal_alignment", "window_size_left", "window_size_right")),
    ("scores", ("softmax_scale", "softcap")),
    ("run", ("backward", "input_distribution", "seed", "cp_size", "cp_comm_type")),
)
MAX_MASK_PICTURE = 48
TILE_ROWS = 64
MAX_GRID = 64
TENSOR_NAMES = ("out", "lse", "dq", "dk", "dv")


def case_groups(config: Any) -> list[tuple[str, list[tuple[str, Any]]]]:
    """The stored case JSON as (group, [(field, value)]) for a readable table; unknown fields go
    to an ``other`` group so that nothing stored is hidden."""
    if not isinstance(config, dict):
        return []
    seen: set[str] = {"schema_version"}
    groups = []
    for title, names in CASE_FIELD_GROUPS:
        rows = [(n, config[n]) for n in names if n in config]
        seen.update(names)
        if rows:
            groups.append((title, rows))
    other = [(k, v) for k, v in config.items() if k not in seen]
    if other:
        groups.append(("other", other))
    return groups


MAX_MASK_ROWS = 2**20
"""Largest ``batch * heads * seqlen`` whose visible rows the error grid computes (the mask of a
larger case is not drawn: a page's work stays bounded whatever case it shows)."""


def mask_picture(config: Any) -> str | None:
    """The visible-key mask of the case's first sequence as text (``1`` visible, ``.`` masked),
    drawn by `oracle.masks` for sequences up to 48 x 48; None when larger, unmasked or invalid."""
    from oracle.config import AttentionCase
    from oracle.errors import CaseValidationError

    try:
        case = AttentionCase.from_json(config)
    except (CaseValidationError, TypeError):
        return None
    len_q, len_k = case.seqlens_q_list[0], case.seqlens_k_list[0]
    if not case.has_mask or max(len_q, len_k) > MAX_MASK_PICTURE:
        return None
    from oracle.masks import render_mask, visible_mask

    return render_mask(visible_mask(case, len_q, len_k))


def error_grid(config: Any, tensor: str, figures: Any) -> dict[str, Any] | None:
    """Where a tensor's error sits: a grid of (batch, head) rows by tiles of 64 sequence rows.

    The cell holding ``worst_index`` (the first unexpected non-finite value, else the largest
    error at the worst place) is marked ``worst``; lse rows that see no key are ``masked``. When
    the metrics carry ``tile_error_ratios`` (``[groups][tiles]``) each cell shows its ratio.
    None when the case or the index cannot be read.
    """
    from oracle.config import AttentionCase
    from oracle.errors import CaseValidationError

    if not isinstance(figures, dict):
        return None
    try:
        case = AttentionCase.from_json(config)
    except (CaseValidationError, TypeError):
        return None
    kv = tensor in ("dk", "dv")
    heads = case.num_heads_kv if kv else case.num_heads
    seqlen = case.total_k if (kv and case.is_varlen) else case.total_q if case.is_varlen else (
        case.seqlen_k if kv else case.seqlen_q)
    batch = 1 if case.is_varlen else case.batch_size
    index = figures.get("worst_index")
    worst = None
    if isinstance(index, list) and all(type(i) is int for i in index):
        if tensor == "lse":
            parts = ([0] + index) if case.is_varlen else index  # [b, h, s] / [h, t]
            if len(parts) == 3:
                worst = (parts[0] * heads + parts[1], parts[2] // TILE_ROWS)
        else:
            parts = ([0] + index) if case.is_varlen else index  # [b, s, h, d] / [t, h, d]
            if len(parts) == 4:
                worst = (parts[0] * heads + parts[2], parts[1] // TILE_ROWS)
    groups, tiles = batch * heads, -(-seqlen // TILE_ROWS)
    ratios = figures.get("tile_error_ratios")
    masked_tiles: set[tuple[int, int]] = set()
    if tensor == "lse" and groups * seqlen <= MAX_MASK_ROWS:  # bounded by the case's size: no mask for huge cases
        from oracle.masks import visible_rows

        rows = visible_rows(case)
        rows = rows.reshape(-1, rows.shape[-1])
        for g in range(min(groups, MAX_GRID)):
            for t in range(min(tiles, MAX_GRID)):
                if not bool(rows[g, t * TILE_ROWS : (t + 1) * TILE_ROWS].any()):
                    masked_tiles.add((g, t))
    cells = []
    for g in range(min(groups, MAX_GRID)):
        row = []
        for t in range(min(tiles, MAX_GRID)):
            cls, title = "", f"batch {g // heads}, head {g % heads}, rows {t * TILE_ROWS}-{min((t + 1) * TILE_ROWS, seqlen) - 1}"
            if (g, t) in masked_tiles:
                cls, title = "masked", title + ": no visible key"
            style = ""
            if isinstance(ratios, list) and g < len(ratios) and isinstance(ratios[g], list) and t < len(ratios[g]):
                value = ratios[g][t]
                if isinstance(value, (int, float)) and math.isfinite(value):
                    level = min(1.0, max(0.0, math.log10(max(value, 1e-3)) / 3 + 1 / 3))
                    style = f"background: rgba(207, 34, 46, {level:.2f})"
                    title += f": error ratio {value:.3g}"
            if worst == (g, t):
                cls, title = "worst", title + ": worst place"
            row.append({"cls": cls, "title": title, "style": style})
        cells.append({"label": f"b{g // heads} h{g % heads}", "cells": row})
    truncated = groups > MAX_GRID or tiles > MAX_GRID
    return {"rows": cells, "tiles": min(tiles, MAX_GRID), "truncated": truncated, "has_worst": worst is not None,
            "has_ratios": isinstance(ratios, list)}


def result_matrix(results: list[Any]) -> dict[str, Any]:
    """Results of one case as rows (backend, variant) by columns (builds, oldest first); each
    cell is the newest result of that pair on that build."""
    builds: dict[int, Any] = {}
    rows: dict[tuple[str, str], dict[int, Any]] = {}
    for r in results:  # oldest first: later results overwrite earlier ones
        builds.setdefault(r.build_id, r.build)
        rows.setdefault((r.backend, r.variant), {})[r.build_id] = r
    return {
        "builds": [builds[k] for k in sorted(builds)],
        "rows": [(key, rows[key]) for key in sorted(rows)],
    }


def bar_width(value: float, peak: float, full_px: int = 240) -> int:
    """Pixels of a bar for ``value`` out of ``peak`` (at least 2 px for a non-zero value)."""
    if not peak or not value:
        return 0
    return max(2, round(full_px * value / peak))


def safe_url(value: Any) -> str | None:
    """``value`` when it is an absolute http(s) URL without control characters, else None: a
    stored ``upstream_url`` is checked again when rendered as a link (one written to the database
    by other means, e.g. ``javascript:...``, is not linked)."""
    from urllib.parse import urlsplit

    if not isinstance(value, str) or len(value) > 2048 or any(ord(c) < 32 or ord(c) == 127 for c in value):
        return None
    try:
        parts = urlsplit(value)
    except ValueError:
        return None
    return value if parts.scheme in ("http", "https") and parts.netloc else None


def make_templates() -> Jinja2Templates:
    """Templates from ``service/templates`` with the filters above."""
    templates = Jinja2Templates(directory=TEMPLATE_DIR)
    templates.env.filters.update(
        pretty_json=pretty_json, compact_json=compact_json, dt=format_datetime, num=format_number, ratio=format_ratio,
        safe_url=safe_url,
    )
    templates.env.globals.update(
        metrics_table=metrics_table,
        metrics_blocks=metrics_blocks,
        case_groups=case_groups,
        mask_picture=mask_picture,
        error_grid=error_grid,
        result_matrix=result_matrix,
        bar_width=bar_width,
        consensus_counts=consensus_counts,
        consensus_names=consensus_names,
    )
    return templates
