"""Rendering a repro: `render_repro` turns a case, its adapter's backend call
(`service.export.backend.repro_call`) and its allowances (`service.export.allowance`) into one
standalone pytest file (`Repro`), filling `service.export.template` with literals only
(`service.export.safety.fill_template`). What the file does is in the `service.export` docstring.
"""

from __future__ import annotations

import math
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fuzzer.backends.base import Backend
from oracle.config import AttentionCase
from service.export.allowance import TENSOR_NAMES, Allowance, computed_allowance, needed_tensors, required_tensors
from service.export.backend import repro_call, resolve_backend
from service.export.safety import SIGNATURE_PATTERN, ExportError, Slot, check_names, docstring_literal, fill_template
from oracle import mask_kinds
from oracle.config import INPUT_FAMILY_DEFAULTS
from service.export.template import HEADER, JUDGE, PORTABLE_BEGIN, PORTABLE_END, RUNTIME


@dataclass(frozen=True)
class Repro:
    """A generated repro: a file name and the source text."""

    filename: str
    source: str


def repro_filename(backend: str, variant: str, case_id: str) -> str:
    """``test_attnfuzz_<backend>_<variant>_<case_id>.py`` (``-``, ``.`` and ``+`` become ``_``)."""
    clean = re.sub(r"[^A-Za-z0-9_]", "_", f"{backend}_{variant}")
    return f"test_attnfuzz_{clean}_{case_id}.py"


def _plain(text: str) -> str:
    """``text`` as docstring text: printable ASCII, no backslash or double quote (stored text the
    file only quotes)."""
    kept = "".join(c if " " <= c <= "~" else "?" for c in " ".join(str(text).split()))
    return kept.replace("\\", "/").replace('"', "'")


def _finite_float(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _recorded_text(recorded: dict[str, Any] | None) -> str:
    """The stored figures of the recorded result, one line per judged tensor (plain ASCII)."""
    lines = []
    for name in TENSOR_NAMES:
        figures = (recorded or {}).get(name)
        if not isinstance(figures, dict):
            continue
        parts = []
        for key, label in (("error_ratio", "error ratio"), ("err_backend", "error"), ("allowed", "allowed")):
            value = figures.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                parts.append(f"{label} {float(value):.4g}")
            elif value in ("inf", "-inf", "nan"):
                parts.append(f"{label} {value}")
        index = figures.get("worst_index")
        if isinstance(index, list) and all(type(i) is int for i in index):
            parts.append(f"worst index {tuple(index)}")
        signatures = [x for x in figures.get("signatures") or [] if isinstance(x, str) and SIGNATURE_PATTERN.match(x)]
        lines.append(f"  {name}: {', '.join(signatures) or 'passed'}; " + ", ".join(parts))
    return "\n".join(lines)


def portable_source() -> str:
    """The text of ``oracle/portable.py`` as it is on disk (what every repro copies, byte for byte).

    Raises:
        ExportError: the file cannot be read (an installation without the sources).
    """
    from oracle import portable

    try:
        return Path(portable.__file__).read_text(encoding="utf-8")
    except (OSError, TypeError) as exc:
        raise ExportError("repro", f"the oracle's portable core cannot be read: {exc}") from None


def render_repro(
    case: AttentionCase,
    backend: Backend | str,
    variant: str,
    signature: str | None,
    *,
    allowance: dict[str, Allowance] | None = None,
    allowed: dict[str, float] | None = None,
    recorded: dict[str, Any] | None = None,
    design_note: str | None = None,
) -> Repro:
    """The standalone pytest file reproducing ``case`` on ``backend``/``variant``.

    The file fails exactly when the kernel still shows ``signature`` (with ``signature`` None: when
    it shows any), judged as `oracle.compare` judged it (see the module docstring).

    Args:
        case: the (minimised) case.
        backend: the adapter (`fuzzer.backends.base.Backend`) or a name `resolve_backend` finds.
        variant: the API variant the failure was seen with.
        signature: the recorded failure signature, or None to export a plain regression test.
        allowance: per tensor, the stored `Allowance` (`stored_allowance`); default
            `computed_allowance` (the float64 oracle: never in a web request).
        allowed: whole-tensor allowances only (tests); tiles are then not checked.
        recorded: the stored metrics of the recorded result (written into the docstring).
        design_note: attnfuzz's verdict when the failure is the limit of the backend's design
            (`service.export.target.export_target`): written into the docstring, first.

    Returns:
        `Repro` (file name and source).

    Raises:
        ExportError: a name or signature of the wrong form, an unknown backend or one without a
            repro call, a variant the backend cannot encode the case with, a missing allowance, or a
            value that is not a plain literal.
    """
    name = backend.name if isinstance(backend, Backend) else backend
    check_names(name, variant, signature)
    if not isinstance(case, AttentionCase):
        raise ExportError("case", "must be an AttentionCase")
    if case.cp_size != 1:
        raise ExportError("case.cp_size", "context-parallel cases (cp_size > 1) cannot be exported")
    adapter = backend if isinstance(backend, Backend) else resolve_backend(name)
    call = repro_call(adapter, case, variant)
    if allowance is None and allowed is not None:
        allowance = {n: Allowance(float(x)) for n, x in allowed.items()}
    if allowance is None:
        allowance = computed_allowance(case)
    missing = [n for n in required_tensors(case) if n not in allowance]
    if missing:
        raise ExportError("allowance", f"no allowed error for {', '.join(missing)}")
    judged = [n for n in needed_tensors(case) if n in allowance]

    from oracle import compare, signatures

    packages = ", ".join(("torch", "pytest", *call.packages))
    untiled = [n for n in judged if allowance[n].tiles is None]
    tile_note = (
        f"Tile allowances were not stored for {', '.join(untiled)}: those are judged whole only."
        if untiled else "Every tensor is judged whole and per tile, as attnfuzz judged it."
    )
    if "lse" not in judged:
        tile_note += " No lse allowance was stored (the recorded call returned none): lse is not judged."
    recorded_text = _recorded_text(recorded)
    note = ""
    if design_note:
        note = "\n".join(textwrap.wrap(_plain(design_note), 96)) + "\n\n"
    doc = note + textwrap.dedent(
        f"""\
        attnfuzz repro: {name} / {variant} / {signature or "(no recorded failure)"}, case {case.case_id}.

        {case.describe()}

        Standalone: needs only {packages}; skips with the reason when the package, a CUDA GPU or
        the GPU architecture is missing. Run it with pytest: `pytest FILE`, or inside a project whose
        pytest settings add options (xdist's -n, say) `pytest -c /dev/null FILE`.

        What it does: regenerates the inputs bit for bit with attnfuzz's own code (its portable
        core, oracle/portable.py, copied below verbatim), calls {name} exactly as the variant
        {variant!s} did (call_backend), computes a dense float64 reference (reference) and judges
        every tensor (out, lse, dq, dk, dv) as the attnfuzz judge did (judge): no NaN, no +-inf where the reference is finite, lse
        infinite exactly on rows that see no key (natural log), not all zero, the L2 error of the
        whole tensor within ALLOWED[tensor]["whole"] (mismatch) and of every tile of TILE_ROWS rows
        of one (batch, head) within ALLOWED[tensor]["tiles"] (tile_mismatch).

        It FAILS exactly when the kernel still shows the recorded signature SIGNATURE (without one:
        any signature), naming every signature found and the figures (error, allowed, worst tile).

        Tolerance: ALLOWED holds the allowed errors stored when attnfuzz judged this case, from its
        error model (oracle/tolerance.py): factor * max(||round_dtype(R) - R||_2, u * ||sigma||_2) +
        floor * sqrt(numel) over the whole tensor or the tile, with R the float64 reference,
        round_dtype the rounding to {case.dtype} (float32 for lse), u that dtype's unit roundoff,
        sigma the first-order rounding error of an fp32-accumulating kernel per row, and the
        calibrated factor per tensor for {case.dtype}. {tile_note}
        """
    )
    if recorded_text:
        doc += "\nRecorded by attnfuzz for this backend variant:\n" + recorded_text + "\n"

    def allowance_literal(a: Allowance) -> dict[str, Any]:
        return {"whole": float(a.whole), "tiles": None if a.tiles is None else [[float(x) for x in row] for row in a.tiles]}

    values: dict[str, Any] = {
        "docstring": Slot(docstring_literal(doc.rstrip() + "\n")),
        "case_id": case.case_id,
        "backend": name,
        "variant": variant,
        "signature": signature,
        "batch_size": case.batch_size,
        "seqlen_q": case.seqlen_q,
        "seqlen_k": case.seqlen_k,
        "seqlens_q": tuple(case.seqlens_q_list),
        "seqlens_k": tuple(case.seqlens_k_list),
        "num_heads": case.num_heads,
        "num_heads_kv": case.num_heads_kv,
        "head_dim": case.head_dim,
        "head_dim_v": case.head_dim_v,
        "dtype": case.dtype,
        "qkv_format": case.qkv_format,
        "causal": case.causal,
        "causal_alignment": case.causal_alignment,
        "window_size_left": case.window_size_left,
        "window_size_right": case.window_size_right,
        "softmax_scale": case.softmax_scale,
        "softcap": case.softcap,
        "backward": case.backward,
        "input_distribution": case.input_distribution,
        "seed": case.seed,
        "device": call.device,
        "allowed": {n: allowance_literal(allowance[n]) for n in judged},
        "tile_rows": compare.TILE_ROWS,
        "kinds": signatures.tensor_kinds(),
        # +-inf on rows without a visible key is accepted anyway; only a finite sentinel needs naming
        "masked_row_lse": call.masked_row_lse if _finite_float(call.masked_row_lse) else None,
        "input_families": {name: getattr(case, name) for name in INPUT_FAMILY_DEFAULTS},
        "family_defaults": dict(INPUT_FAMILY_DEFAULTS),
        "mask_fields": {name: getattr(case, name) for kind in mask_kinds.MASK_KINDS for name in kind.fields},
    }
    if not isinstance(call.values, dict):
        raise ExportError("backend", f"{name}.repro: values must be a dict")
    overlap = set(values) & set(call.values)
    if overlap:
        raise ExportError("backend", f"repro slots {sorted(overlap)} clash with the file's own")
    values.update(call.values)
    copied = (PORTABLE_BEGIN + portable_source() + PORTABLE_END).replace("$", "$$")  # as is, after the slots
    if not isinstance(call.source, str):
        raise ExportError("backend", f"{name}.repro: source must be a string")
    template = (
        HEADER
        + copied
        + RUNTIME
        + "\n# ------------------------------------------------------------------- the backend call\n"
        + textwrap.dedent(call.source)
        + JUDGE
    )
    return Repro(filename=repro_filename(name, variant, case.case_id), source=fill_template(template, values))
