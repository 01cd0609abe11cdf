"""Standalone pytest repros of stored failures (``attnfuzz export``, ``GET /api/cases/{id}/repro.py``).

A repro is one Python file that needs only ``torch``, ``pytest`` and the backend's own package
(never attnfuzz), so a kernel maintainer can drop it into flash-attention's or
TransformerEngine's tests. It

1. regenerates the inputs deterministically: `oracle.inputs.hash_normal_torch` is copied into the file
   verbatim (its source), and `make_inputs` re-implemented with the same constants, so the
   tensors are bit-identical to the ones the fuzzer used (``tests/service/test_export.py``
   checks this);
2. calls the backend exactly as the variant did, through the adapter's own repro call
   (`fuzzer.backends.base.Backend.repro` -> `fuzzer.backends.base.ReproCall`, written next to
   ``run``; found like every backend: built-ins, the ``attnfuzz.backends`` entry points, or
   ``module:attr``, `resolve_backend`). A backend without one gets an `ExportError` saying what
   to add;
3. computes a compact float64 reference inline (dense per sequence, the mask semantics of
   `oracle.masks`, the backward of FlashAttention-2 Algorithm 2);
4. judges every tensor as `oracle.compare.compare_tensor` did (``judge`` in the file): shape, NaN,
   +-inf where the reference is finite, lse finite exactly on rows that see a key (``-inf`` or
   ``+inf`` accepted on the others, and the backend's documented ``masked_row_lse``), all zero,
   the L2 error of the whole tensor against the stored whole-tensor allowance (``mismatch``) and
   of every tile of ``TILE_ROWS`` rows of one (batch, head) against the stored tile allowance
   (``tile_mismatch``). The allowances are the ones the worker stored with the case's results
   (``allowed_global``; ``tile_allowed`` on failing verdicts; `stored_allowance`): they depend on
   the reference only, so any result of the case supplies them. The test fails exactly when the
   recorded signature is among the signatures found (without one: when any is found) and names
   every signature with the figures (error, allowed, worst tile);
5. skips with a reason when the package, a CUDA GPU or the GPU architecture is missing.

`load_export` / `export_target` read everything from the store: no oracle runs unless the caller
asks for it (``compute_missing``, the CLI, for results stored before allowances were); the web
endpoints never do. A variant whose stored results are only ``unsupported`` or passing is
refused without ``force`` (`misleading_reason`).

Safety: generated code contains only validated literals. The stored case is validated again
(`AttentionCase.from_json`), names and signatures must match strict patterns, and every value
goes into the file through `literal`, which accepts only ``None``, ``bool``, ``int``, finite
``float``, strings of a small alphabet and tuples/lists/dicts of those. Finally
`check_only_literals` parses the template (with placeholders in the value slots) and the rendered
file and requires identical syntax trees except at the slots, where only literals
(`ast.literal_eval`) may stand. A hostile value stored in the database therefore raises
`ExportError`; it never becomes code.
"""

from __future__ import annotations

import ast
import functools
import inspect
import math
import re
import string
import textwrap
from dataclasses import dataclass
from typing import Any

from fuzzer.backends.base import Backend, ReproCall
from oracle.config import AttentionCase
from oracle.errors import CaseValidationError
from service.errors import FieldValidationError

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
"""Backend and variant names (as in `fuzzer.builds.corpus`)."""
SIGNATURE_PATTERN = re.compile(r"^[A-Za-z0-9_]{1,64}(:[A-Za-z0-9_.]{1,128})?$")
"""Failure signatures such as ``out:all_zero``, ``crash``, ``error:RuntimeError``."""
_SAFE_STRING = re.compile(r"^[A-Za-z0-9_.:+\-]{0,200}$")
_DOC_TEXT = re.compile(r"^[\x20-\x7e\n]*$")
TENSOR_NAMES = ("out", "lse", "dq", "dk", "dv")


class ExportError(FieldValidationError):
    """A repro cannot be generated; ``field`` names the offending input (HTTP 422)."""


# ---------------------------------------------------------------------------------- literals
def literal(value: Any, *, where: str = "value") -> str:
    """Python source for ``value``, which must be plain data.

    Accepted: ``None``, ``bool``, ``int``, finite ``float``, ``str`` of letters, digits and
    ``_ . : + -`` (at most 200), and ``tuple``/``list``/``dict`` (string keys) of those. Exact types
    only: subclasses (with their own ``__repr__``) are refused.

    Raises:
        ExportError: anything else; ``field`` is ``where``.
    """
    kind = type(value)
    if value is None or kind is bool or kind is int:
        return repr(value)
    if kind is float:
        if not math.isfinite(value):
            raise ExportError(where, f"non-finite float {value!r} cannot be exported")
        return repr(value)
    if kind is str:
        if not _SAFE_STRING.match(value):
            raise ExportError(where, f"string {value[:80]!r} has characters outside [A-Za-z0-9_.:+-]")
        return repr(value)
    if kind is tuple:
        items = [literal(v, where=where) for v in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if kind is list:
        return "[" + ", ".join(literal(v, where=where) for v in value) + "]"
    if kind is dict:
        parts = []
        for key, item in value.items():
            if type(key) is not str:
                raise ExportError(where, f"dict key {key!r} is not a string")
            parts.append(f"{literal(key, where=where)}: {literal(item, where=where)}")
        return "{" + ", ".join(parts) + "}"
    raise ExportError(where, f"a {kind.__name__} cannot be exported as a literal")


def docstring_literal(text: str) -> str:
    """``text`` as a triple-quoted string literal (printable ASCII, no backslash or triple quote).

    Raises:
        ExportError: ``text`` contains anything else.
    """
    if not _DOC_TEXT.match(text) or "\\" in text or '"""' in text or text.endswith('"'):
        raise ExportError("docstring", "contains characters that cannot be written into a docstring")
    return '"""' + text + '"""'


class _Slot:
    """Marks a value already rendered as a literal (the docstring)."""

    def __init__(self, source: str):
        self.source = source


def _slot_source(name: str, value: Any) -> str:
    return value.source if isinstance(value, _Slot) else literal(value, where=name)


def _compare_trees(template: ast.AST, rendered: ast.AST, slots: set[str]) -> None:
    if isinstance(template, ast.Name) and template.id in slots:
        ast.literal_eval(rendered)  # raises ValueError for anything but a literal
        return
    if type(template) is not type(rendered):
        raise ValueError(f"{type(rendered).__name__} where the template has {type(template).__name__}")
    for name, expected in ast.iter_fields(template):
        actual = getattr(rendered, name, None)
        if isinstance(expected, list):
            if not isinstance(actual, list) or len(actual) != len(expected):
                raise ValueError(f"{type(template).__name__}.{name} differs in length")
            for e, a in zip(expected, actual):
                if isinstance(e, ast.AST):
                    _compare_trees(e, a, slots)
                elif e != a:
                    raise ValueError(f"{type(template).__name__}.{name}: {a!r} != {e!r}")
        elif isinstance(expected, ast.AST):
            _compare_trees(expected, actual, slots)
        elif expected != actual:
            raise ValueError(f"{type(template).__name__}.{name}: {actual!r} != {expected!r}")


def fill_template(template: str, values: dict[str, Any]) -> str:
    """Substitute ``$name`` slots of ``template`` with literals of ``values`` and prove that only
    literals were added (`check_only_literals`).

    Raises:
        ExportError: a value is not a plain literal, a slot has no value, or the result differs
            from the template anywhere but at its slots.
    """
    try:
        rendered = string.Template(template).substitute({k: _slot_source(k, v) for k, v in values.items()})
    except KeyError as exc:
        raise ExportError(str(exc.args[0]), "the template has a slot without a value") from None
    check_only_literals(template, rendered, set(values))
    return rendered


def check_only_literals(template: str, rendered: str, slots: set[str]) -> None:
    """Require ``rendered`` to be ``template`` with literals at the ``$slot`` positions only.

    Raises:
        ExportError: the syntax trees differ elsewhere, or a slot holds a non-literal.
    """
    placeholders = {name: f"__attnfuzz_slot_{name}__" for name in slots}
    try:
        template_tree = ast.parse(string.Template(template).substitute(placeholders))
        rendered_tree = ast.parse(rendered)
        _compare_trees(template_tree, rendered_tree, set(placeholders.values()))
    except (SyntaxError, ValueError) as exc:
        raise ExportError("repro", f"generated code failed the literal-only check: {exc}") from None


# ---------------------------------------------------------------------------------- backends
CallSnippet = ReproCall
"""The former name of `fuzzer.backends.base.ReproCall`."""


def _discovered(extra_specs: tuple[str, ...] = ()) -> dict[str, Backend]:
    from fuzzer.backends.base import BackendError
    from fuzzer.registry import discover

    try:
        return {name: backend for name, (backend, _) in discover(extra_specs, opt_in=True).items()}
    except BackendError as exc:
        raise ExportError("backend", str(exc)) from None


def resolve_backend(name: str, spec: str | None = None) -> Backend:
    """The backend object that writes the repro call of ``name``.

    Args:
        name: the stored backend name (``"fa4"``, a plugin's name).
        spec: ``"module:attr"`` naming the plugin (``attnfuzz export --backend module:attr``);
            default: the built-ins and the ``attnfuzz.backends`` entry points (`fuzzer.registry`).

    Raises:
        ExportError: ``backend``: the spec cannot be loaded, or no known backend is called ``name``
            (the message lists the known ones and says how to make a plugin known).
    """
    from fuzzer.backends.base import BackendError
    from fuzzer.registry import load_spec

    if spec is not None:
        try:
            loaded = load_spec(spec)
        except BackendError as exc:
            raise ExportError("backend", str(exc)) from None
        for backend in loaded:
            if backend.name == name:
                return backend
        names = ", ".join(b.name for b in loaded)
        raise ExportError("backend", f"{spec} defines {names}, not the backend {name!r} the result was recorded for")
    known = _discovered()
    if name not in known:
        raise ExportError(
            "backend",
            f"no export for backend {name!r}: no installed backend has that name (known: {', '.join(sorted(known))}); "
            "install its package (entry-point group attnfuzz.backends) or name it with --backend module:attr",
        )
    return known[name]


def has_repro(backend: Backend) -> bool:
    """The backend's class overrides `Backend.repro`."""
    return getattr(type(backend), "repro", None) is not Backend.repro


@functools.lru_cache(maxsize=1)
def exportable_backends() -> tuple[str, ...]:
    """Names of the known backends (built-ins and entry points) that declare a repro call, sorted;
    read once per process (pages use it to offer the download)."""
    try:
        return tuple(sorted(name for name, backend in _discovered().items() if has_repro(backend)))
    except ExportError:
        return ()


def repro_call(backend: Backend, case: AttentionCase, variant: str) -> ReproCall:
    """``backend.repro(case, variant)``, its errors as `ExportError`.

    Raises:
        ExportError: ``backend``: the backend declares no repro (the message says what to add) or
            its ``repro`` failed or returned something else than a `ReproCall`; ``variant``: the
            variant cannot encode the case (a ``ValueError`` of the adapter).
    """
    from fuzzer.backends.base import ReproUnavailable

    try:
        call = backend.repro(case, variant)
    except ReproUnavailable as exc:
        raise ExportError("backend", str(exc)) from None
    except ValueError as exc:
        raise ExportError("variant", str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a plugin's bug must not crash the service
        raise ExportError("backend", f"{backend.name}.repro raised {type(exc).__name__}: {exc}") from None
    if not isinstance(call, ReproCall):
        raise ExportError("backend", f"{backend.name}.repro returned {type(call).__name__}, not a ReproCall")
    if call.device not in ("cpu", "cuda"):
        raise ExportError("backend", f"{backend.name}.repro: device {call.device!r} (allowed: cpu, cuda)")
    return call


# ------------------------------------------------------------------------------- allowances
@dataclass(frozen=True)
class Allowance:
    """The allowed error of one tensor, as `oracle.compare` judged it (reference-only figures).

    Attributes:
        whole: the allowed L2 error of the whole tensor.
        tiles: the allowed error of every tile, ``[group][tile]`` (groups in the order of the
            tensor's non-row dims, tiles of ``oracle.compare.TILE_ROWS`` rows), or None when not
            stored (the repro then checks the whole tensor only and says so).
    """

    whole: float
    tiles: list[list[float]] | None = None


def tile_grid(case: AttentionCase, name: str) -> tuple[int, int]:
    """``(groups, tiles)`` of tensor ``name`` of ``case`` as `oracle.compare.compare_tensor` tiles
    it: groups are batch x heads (thd: heads; dk/dv: kv heads), rows the sequence (thd: tokens)."""
    from oracle.compare import TILE_ROWS

    heads = case.num_heads_kv if name in ("dk", "dv") else case.num_heads
    if case.is_varlen:
        rows = case.total_k if name in ("dk", "dv") else case.total_q
        groups = heads
    else:
        rows = case.seqlen_k if name in ("dk", "dv") else case.seqlen_q
        groups = case.batch_size * heads
    return groups, -(-rows // TILE_ROWS)


def _finite_float(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value > 0 else None


def stored_allowance(case: AttentionCase, metrics: list[dict[str, Any]]) -> dict[str, Allowance]:
    """The allowances of ``case``'s tensors from stored result metrics (any backend or variant of
    the same case: the allowance depends on the reference only).

    ``metrics[i][tensor]`` is a `oracle.compare.TensorVerdict.to_json`: ``allowed_global`` and,
    for failing verdicts, ``tile_allowed``. Tile tables of the wrong shape are ignored.

    Returns:
        tensor name -> `Allowance`, for the tensors found (possibly none: results recorded by an
        attnfuzz older than stored allowances).
    """
    found: dict[str, Allowance] = {}
    for entry in metrics:
        if not isinstance(entry, dict):
            continue
        for name in TENSOR_NAMES:
            figures = entry.get(name)
            if not isinstance(figures, dict):
                continue
            whole = _finite(figures.get("allowed_global"))
            if whole is None:
                continue
            tiles = _tile_table(case, name, figures.get("tile_allowed"))
            known = found.get(name)
            if known is None or (known.tiles is None and tiles is not None):
                found[name] = Allowance(whole, tiles)
    return found


def _tile_table(case: AttentionCase, name: str, table: Any) -> list[list[float]] | None:
    groups, tiles = tile_grid(case, name)
    if not isinstance(table, list) or len(table) != groups:
        return None
    rows = []
    for row in table:
        if not isinstance(row, list) or len(row) != tiles:
            return None
        values = [_finite(x) for x in row]
        if any(x is None for x in values):
            return None
        rows.append(values)
    return rows


def computed_allowance(case: AttentionCase) -> dict[str, Allowance]:
    """The allowances of ``case`` computed with the float64 oracle on the CPU (whole tensor and
    every tile), for results stored without them. Not for web requests: one oracle reference of the
    case (milliseconds for minimised cases; seconds and GBs for ~1e9 score entries)."""
    from oracle.compare import compare_outputs
    from oracle.inputs import make_inputs
    from oracle.reference import reference

    ref = reference(case, make_inputs(case, device="cpu"), backward=case.backward, engine="torch")
    verdict = compare_outputs(case, ref, out=ref.out, lse=ref.lse, dq=ref.dq, dk=ref.dk, dv=ref.dv)
    return {
        name: Allowance(float(tv.allowed_global), [[float(x) for x in row] for row in tv.allowed_tiles.tolist()])
        for name, tv in verdict.tensors.items()
    }


def allowed_errors(case: AttentionCase) -> dict[str, float]:
    """The allowed whole-tensor L2 error per tensor (`computed_allowance`)."""
    return {name: a.whole for name, a in computed_allowance(case).items()}


def needed_tensors(case: AttentionCase) -> tuple[str, ...]:
    """The tensors a repro judges: out, lse and, for backward cases, dq, dk, dv."""
    return TENSOR_NAMES if case.backward else TENSOR_NAMES[:2]


def required_tensors(case: AttentionCase) -> tuple[str, ...]:
    """The tensors a repro needs an allowance for: out and, for backward cases, dq, dk, dv (lse
    only when stored: many APIs return none, and the file skips what it has no allowance for)."""
    return tuple(name for name in needed_tensors(case) if name != "lse")


# --------------------------------------------------------------------------- export checks
def stored_statuses(session: Any, case_id: str, backend: str, variant: str) -> list[tuple[str, str]]:
    """``(status, detail)`` of the stored results of ``case_id`` on ``backend``/``variant``,
    newest first."""
    from sqlalchemy import select

    from service.db.models import Result

    rows = session.execute(
        select(Result.status, Result.detail)
        .where(Result.case_id == case_id, Result.backend == backend, Result.variant == variant)
        .order_by(Result.created_at.desc(), Result.id.desc())
    ).all()
    return [(r.status, r.detail or "") for r in rows]


def misleading_reason(statuses: list[tuple[str, str]], backend: str, variant: str) -> str | None:
    """Why a repro of this backend variant would mislead (None when a failure is stored): its
    results are all ``unsupported`` or passing, or there is none."""
    if any(status not in ("pass", "unsupported") for status, _ in statuses):
        return None
    if not statuses:
        return f"{backend}/{variant} has no stored result on this case, so nothing shows it fails"
    if all(status == "unsupported" for status, _ in statuses):
        detail = next((d for _, d in statuses if d), "")
        return f"{backend}/{variant} was recorded as unsupported on this case ({detail[:200] or 'no reason stored'}): the file would call it anyway"
    return f"{backend}/{variant} passed on this case on every stored build: the file would pass (a regression test, not a repro)"


def load_export(
    session: Any,
    case_id: str,
    *,
    backend: str | None = None,
    variant: str | None = None,
    backend_spec: str | None = None,
    force: bool = False,
    compute_missing: bool = False,
) -> tuple[Repro, Any]:
    """The repro of a stored case from stored figures: `repository.repro_target` picks the backend
    variant, `stored_allowance` the allowances, `resolve_backend` the adapter.

    Args:
        session: a SQLAlchemy session on the store.
        case_id, backend, variant: as `service.db.repository.repro_target`.
        backend_spec: ``"module:attr"`` of a plugin (its backend name is read from it).
        force: export a variant whose results are only ``unsupported`` or passing.
        compute_missing: compute allowances the store lacks with the oracle (the CLI; never in a
            web request).

    Returns:
        ``(Repro, ReproTarget)``.

    Raises:
        NotFoundError: no such case.
        ExportError: ``force`` (misleading export without ``force``), ``allowance`` (no stored
            allowance and ``compute_missing`` off), or anything `render_repro` raises.
    """
    from service.db import repository
    adapter = None
    if backend_spec is not None:
        from fuzzer.backends.base import BackendError
        from fuzzer.registry import load_spec

        try:
            loaded = load_spec(backend_spec)
        except BackendError as exc:
            raise ExportError("backend", str(exc)) from None
        failing = {name for name, _ in _failing_backends(session, case_id)}
        wanted = [b for b in loaded if b.name == backend] if backend else [b for b in loaded if b.name in failing]
        if not wanted and len(loaded) == 1 and not backend:
            wanted = loaded
        if len(wanted) != 1:
            raise ExportError(
                "backend", f"{backend_spec} defines {', '.join(b.name for b in loaded)}: none (or several) of them "
                f"{'is ' + repr(backend) if backend else 'failed on this case'}"
            )
        adapter = wanted[0]
        backend = adapter.name
    target = repository.repro_target(session, case_id, backend=backend, variant=variant)
    return export_target(session, target, adapter=adapter, force=force, compute_missing=compute_missing), target


def export_target(
    session: Any, target: Any, *, adapter: Backend | None = None, force: bool = False, compute_missing: bool = False
) -> Repro:
    """The repro of a `service.db.repository.ReproTarget` (a case, backend, variant and recorded
    signature) from stored figures; arguments and errors as `load_export`."""
    case_id = target.case.id
    case = validated_case(target.case.config)
    check_names(target.backend, target.variant, target.signature)
    adapter = adapter or resolve_backend(target.backend)
    repro_call(adapter, case, target.variant)  # the backend's and the variant's errors before the store's
    if not force:
        reason = misleading_reason(stored_statuses(session, case_id, target.backend, target.variant), target.backend, target.variant)
        if reason is not None:
            raise ExportError("force", reason + "; pass --force (API: force=true) to export it anyway")
    allowance = stored_allowance(case, _case_metrics(session, case_id))
    missing = [name for name in required_tensors(case) if name not in allowance]
    if missing or any(a.tiles is None for a in allowance.values()):
        if compute_missing:
            allowance = computed_allowance(case)
        elif missing:
            raise ExportError(
                "allowance",
                f"the stored results of case {case_id} carry no allowed error for {', '.join(missing)} "
                "(recorded by an older attnfuzz); `attnfuzz export` computes it with the oracle",
            )
    recorded = _recorded_figures(session, case_id, target.backend, target.variant)
    return render_repro(case, adapter, target.variant, target.signature, allowance=allowance, recorded=recorded)


def _failing_backends(session: Any, case_id: str) -> list[tuple[str, str]]:
    from sqlalchemy import select

    from service.db.models import Result

    return list(session.execute(
        select(Result.backend, Result.variant).where(Result.case_id == case_id, Result.signature.is_not(None))
    ).all())


def _case_metrics(session: Any, case_id: str) -> list[dict[str, Any]]:
    from sqlalchemy import select

    from service.db.models import Result

    query = select(Result.metrics).where(Result.case_id == case_id).order_by(Result.created_at.desc(), Result.id.desc())
    return [m for m in session.scalars(query) if m]  # newest first: the current error model's figures


def _recorded_figures(session: Any, case_id: str, backend: str, variant: str) -> dict[str, Any]:
    """The newest stored metrics of the backend variant on the case ({} if none)."""
    from sqlalchemy import select

    from service.db.models import Result

    metrics = session.scalar(
        select(Result.metrics)
        .where(Result.case_id == case_id, Result.backend == backend, Result.variant == variant)
        .order_by(Result.created_at.desc(), Result.id.desc())
        .limit(1)
    )
    return metrics if isinstance(metrics, dict) else {}


# ---------------------------------------------------------------------------------- the file
_INPUT_FUNCTIONS = ("_mix32", "_horner", "_sqrt", "_hash_keys", "hash_normal_torch")

_HEADER = '''$docstring

from __future__ import annotations

import math
import os
import warnings

import pytest

torch = pytest.importorskip("torch")

# ---------------------------------------------------------------------------------- the case
CASE_ID = $case_id
BACKEND = $backend
VARIANT = $variant
SIGNATURE = $signature
BATCH_SIZE = $batch_size
SEQLEN_Q = $seqlen_q
SEQLEN_K = $seqlen_k
SEQLENS_Q = $seqlens_q
SEQLENS_K = $seqlens_k
NUM_HEADS = $num_heads
NUM_HEADS_KV = $num_heads_kv
HEAD_DIM = $head_dim
HEAD_DIM_V = $head_dim_v
DTYPE = $dtype
QKV_FORMAT = $qkv_format
CAUSAL = $causal
CAUSAL_ALIGNMENT = $causal_alignment
WINDOW_SIZE_LEFT = $window_size_left
WINDOW_SIZE_RIGHT = $window_size_right
SOFTMAX_SCALE = $softmax_scale
SOFTCAP = $softcap
BACKWARD = $backward
INPUT_DISTRIBUTION = $input_distribution
SEED = $seed
DEVICE = $device

# attnfuzz's allowed L2 error per tensor, as stored when the fuzzer judged this case (see the
# module docstring): "whole" for the whole tensor, "tiles"[group][tile] for every tile of
# TILE_ROWS consecutive rows of one (batch, head) group (None: not stored, tiles not checked).
ALLOWED = $allowed
TILE_ROWS = $tile_rows
MASKED_ROW_LSE = $masked_row_lse

# ------------------------------------------------------------- inputs (attnfuzz oracle/inputs.py)
_M32 = $m32
_COS_COEFFS = $cos_coeffs
_ATANH_COEFFS = $atanh_coeffs
STREAM_Q, STREAM_K, STREAM_V, STREAM_DOUT = $streams_qkvd
STREAM_Q_OUTLIERS, STREAM_K_OUTLIERS, STREAM_K_BASE = $streams_extra
LARGE_LOGITS_STD = $large_logits_std
MAX_Q_GAIN = $max_q_gain
OUTLIER_Z = $outlier_z
OUTLIER_GAIN = $outlier_gain
NEAR_CONSTANT_NOISE = $near_constant_noise

'''

_RUNTIME = '''

def make_inputs(device):
    """q, k, v, dout in the canonical layout (bit-identical to attnfuzz), cu_seqlens for thd."""
    dtype = getattr(torch, DTYPE)
    if QKV_FORMAT == "thd":
        rows_q, rows_k = (sum(SEQLENS_Q),), (sum(SEQLENS_K),)
    else:
        rows_q, rows_k = (BATCH_SIZE, SEQLEN_Q), (BATCH_SIZE, SEQLEN_K)
    shape_q = (*rows_q, NUM_HEADS, HEAD_DIM)
    shape_k = (*rows_k, NUM_HEADS_KV, HEAD_DIM)
    shape_v = (*rows_k, NUM_HEADS_KV, HEAD_DIM_V)
    shape_out = (*rows_q, NUM_HEADS, HEAD_DIM_V)

    def normal(stream, shape):
        return hash_normal_torch(SEED, stream, math.prod(shape), device).view(shape)

    q, k = normal(STREAM_Q, shape_q), normal(STREAM_K, shape_k)
    if INPUT_DISTRIBUTION == "large_logits":
        q = q * min(LARGE_LOGITS_STD / (SOFTMAX_SCALE * math.sqrt(HEAD_DIM)), MAX_Q_GAIN)
    elif INPUT_DISTRIBUTION == "outliers":
        q = torch.where(normal(STREAM_Q_OUTLIERS, shape_q).abs() > OUTLIER_Z, q * OUTLIER_GAIN, q)
        k = torch.where(normal(STREAM_K_OUTLIERS, shape_k).abs() > OUTLIER_Z, k * OUTLIER_GAIN, k)
    elif INPUT_DISTRIBUTION == "near_constant":
        base = normal(STREAM_K_BASE, (NUM_HEADS_KV, HEAD_DIM)).to(torch.bfloat16).to(torch.float64)
        k = base * (1.0 + NEAR_CONSTANT_NOISE * k.clamp(-1.0, 1.0))
    v, dout = normal(STREAM_V, shape_v), normal(STREAM_DOUT, shape_out)
    cu_seqlens_q = cu_seqlens_k = None
    if QKV_FORMAT == "thd":
        cu_seqlens_q = torch.tensor([0, *torch.tensor(SEQLENS_Q).cumsum(0).tolist()], dtype=torch.int32, device=device)
        cu_seqlens_k = torch.tensor([0, *torch.tensor(SEQLENS_K).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return q.to(dtype), k.to(dtype), v.to(dtype), dout.to(dtype), cu_seqlens_q, cu_seqlens_k


# ---------------------------------------------------------------- mask (attnfuzz oracle/masks.py)
def key_bounds(seqlen_q, seqlen_k):
    """Row i of one sequence sees keys lo[i] <= j < hi[i]; the diagonal is at i + offset with
    offset 0 (top_left) or seqlen_k - seqlen_q (bottom_right); causal caps the right bound there."""
    rows = torch.arange(seqlen_q, dtype=torch.int64)
    diagonal = rows + (0 if CAUSAL_ALIGNMENT == "top_left" else seqlen_k - seqlen_q)
    if CAUSAL:
        right = diagonal
    elif WINDOW_SIZE_RIGHT is not None:
        right = diagonal + WINDOW_SIZE_RIGHT
    else:
        right = torch.full_like(rows, seqlen_k - 1)
    left = diagonal - WINDOW_SIZE_LEFT if WINDOW_SIZE_LEFT is not None else torch.zeros_like(rows)
    return left.clamp(0, seqlen_k), (right + 1).clamp(0, seqlen_k)


def visible_mask(seqlen_q, seqlen_k):
    """[seqlen_q, seqlen_k] bool: True where the query row may attend the key."""
    lo, hi = key_bounds(seqlen_q, seqlen_k)
    cols = torch.arange(seqlen_k, dtype=torch.int64)
    return (cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])


# ------------------------------------------------------------------ float64 reference (dense)
def _attend(q, k, v, dout):
    """One sequence: q [sq, h, d], k [sk, hkv, d], v [sk, hkv, dv], dout [sq, h, dv], float64.
    Returns out [sq, h, dv], lse [h, sq] (-inf on rows without a visible key), dq, dk, dv."""
    group = NUM_HEADS // NUM_HEADS_KV
    k_heads, v_heads = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k_heads) * SOFTMAX_SCALE
    tanh = None
    if SOFTCAP is not None:
        tanh = torch.tanh(scores / SOFTCAP)
        scores = SOFTCAP * tanh
    visible = visible_mask(q.shape[0], k.shape[0]).to(q.device)
    scores = scores.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    out = torch.einsum("hqk,khd->qhd", probs, v_heads)
    if dout is None:
        return out, lse, None, None, None
    # FlashAttention-2 (arXiv:2307.08691) Algorithm 2: D = rowsum(dO * O), dS = P * (dP - D).
    delta = (dout * out).sum(-1).transpose(0, 1)
    dscores = probs * (torch.einsum("qhd,khd->hqk", dout, v_heads) - delta[..., None])
    if tanh is not None:
        dscores = dscores * (1.0 - tanh * tanh)
    dq = torch.einsum("hqk,khd->qhd", dscores, k_heads) * SOFTMAX_SCALE
    dk = torch.einsum("hqk,qhd->khd", dscores, q) * SOFTMAX_SCALE
    dv = torch.einsum("hqk,qhd->khd", probs, dout)
    dk = dk.reshape(k.shape[0], NUM_HEADS_KV, group, -1).sum(2)
    dv = dv.reshape(k.shape[0], NUM_HEADS_KV, group, -1).sum(2)
    return out, lse, dq, dk, dv


def reference(q, k, v, dout):
    """Float64 out, lse, dq, dk, dv in the canonical layout (lse [b, h, sq], thd [h, total_q])."""
    q, k, v, dout = (t.to(torch.float64) for t in (q, k, v, dout))
    if not BACKWARD:
        dout = None
    if QKV_FORMAT == "thd":
        starts_q = [sum(SEQLENS_Q[:i]) for i in range(BATCH_SIZE)]
        starts_k = [sum(SEQLENS_K[:i]) for i in range(BATCH_SIZE)]
        pieces = [
            _attend(
                q[sq:sq + nq], k[sk:sk + nk], v[sk:sk + nk], None if dout is None else dout[sq:sq + nq]
            )
            for sq, nq, sk, nk in zip(starts_q, SEQLENS_Q, starts_k, SEQLENS_K)
        ]
        stack = {"out": 0, "lse": 1, "dq": 0, "dk": 0, "dv": 0}
    else:
        pieces = [_attend(q[b], k[b], v[b], None if dout is None else dout[b]) for b in range(BATCH_SIZE)]
        stack = None
    result = {}
    for i, name in enumerate(("out", "lse", "dq", "dk", "dv")):
        parts = [p[i] for p in pieces]
        if parts[0] is None:
            result[name] = None
        elif stack is not None:
            result[name] = torch.cat(parts, dim=stack[name])
        else:
            result[name] = torch.stack(parts)
    return result


# --------------------------------------------------------------------------- library helpers
def require_cuda(arch_majors, what, min_major=None):
    """Skip unless a CUDA GPU of a suitable architecture is present."""
    if not torch.cuda.is_available():
        pytest.skip(what + " needs a CUDA GPU (torch.cuda.is_available() is False)")
    major = torch.cuda.get_device_capability()[0]
    if arch_majors is not None and major not in arch_majors:
        pytest.skip(f"{what} targets compute capability major {arch_majors}, this GPU is sm{major}x")
    if min_major is not None and major < min_major:
        pytest.skip(f"{what} needs compute capability >= {min_major}.0, this GPU is sm{major}x")


class _Case:
    """The case under attnfuzz's field names, for the adapter code copied into this file."""

    qkv_format = QKV_FORMAT
    batch_size = BATCH_SIZE
    num_heads = NUM_HEADS
    seqlen_q = SEQLEN_Q
    seqlen_k = SEQLEN_K
    is_varlen = QKV_FORMAT == "thd"
    seqlens_q_list = list(SEQLENS_Q)
    seqlens_k_list = list(SEQLENS_K)
    total_q = sum(SEQLENS_Q)
    total_k = sum(SEQLENS_K)

    @staticmethod
    def describe():
        return "case " + CASE_ID


CASE = _Case()

'''

_JUDGE = '''

# ------------------------------------------------------------------------------------ judging
# attnfuzz oracle/compare.py, most severe first.
KINDS = ("shape", "nan", "posinf", "neginf", "all_zero", "finite_on_masked", "mismatch", "tile_mismatch")
ROW_DIMS = (
    {"out": 0, "lse": 1, "dq": 0, "dk": 0, "dv": 0}
    if QKV_FORMAT == "thd"
    else {"out": 1, "lse": 2, "dq": 1, "dk": 1, "dv": 1}
)


def group_names(name):
    """Names of the dims that separate groups of rows in tensor ``name`` (canonical layout)."""
    heads = "kv_head" if name in ("dk", "dv") else "head"
    if QKV_FORMAT == "thd":
        return (heads,)
    return ("batch", heads)


def to_grid(x, row_dim):
    """x as [groups, rows, features]: rows along row_dim, features the last dim (lse: none),
    groups every other dim in order (attnfuzz's tiling)."""
    ndim = x.dim()
    has_features = row_dim != ndim - 1
    group_dims = [i for i in range(ndim) if i != row_dim and not (has_features and i == ndim - 1)]
    perm = group_dims + [row_dim] + ([ndim - 1] if has_features else [])
    groups = [x.shape[i] for i in group_dims]
    features = x.shape[-1] if has_features else 1
    return x.permute(perm).reshape(math.prod(groups), x.shape[row_dim], features), groups


def describe_group(name, groups, g):
    parts = []
    for dim_name, size in reversed(list(zip(group_names(name), groups))):
        parts.append(f"{dim_name} {g % size}")
        g //= size
    return ", ".join(reversed(parts))


def judge(name, actual, expected):
    """attnfuzz's verdict on one tensor: (signatures, figures as text).

    Checks as oracle/compare.py: shape; NaN; +-inf where the reference is finite; a finite lse on
    a row that sees no key (the reference's -inf; +-inf accepted there); all zero (outside the
    tolerance); the whole tensor's L2 error against ALLOWED[name]["whole"] (mismatch); else every
    tile's against ALLOWED[name]["tiles"] (tile_mismatch).
    """
    if tuple(actual.shape) != tuple(expected.shape):
        return [name + ":shape"], f"{name}: shape {tuple(actual.shape)}, the reference's {tuple(expected.shape)}"
    allowed = ALLOWED[name]
    actual = actual.detach().to("cpu", torch.float64)
    expected = expected.detach().to("cpu", torch.float64)
    if name == "lse" and MASKED_ROW_LSE is not None:
        actual = actual.masked_fill(torch.isneginf(expected) & (actual == MASKED_ROW_LSE), -math.inf)
    act, groups = to_grid(actual, ROW_DIMS[name])
    ref, _ = to_grid(expected, ROW_DIMS[name])
    masked = ~torch.isfinite(ref)  # lse of rows that see no key; nothing else
    finite = ~masked
    # where the reference rounded to the kernel's dtype overflows, that infinity is the correctly
    # rounded result (IEEE 754-2019 4.3.1), not +-inf where the reference is finite
    rounded = torch.where(finite, ref, 0.0).to(getattr(torch, "float32" if name == "lse" else DTYPE)).double()
    wrong_inf = finite & ~(torch.isinf(rounded) & (act == rounded))
    counts = {
        "nan": int(torch.isnan(act).sum()),
        "posinf": int(((act == math.inf) & wrong_inf).sum()),
        "neginf": int(((act == -math.inf) & wrong_inf).sum()),
        "finite_on_masked": int((masked & torch.isfinite(act)).sum()),
    }
    valid = finite & torch.isfinite(act)
    diff = torch.where(valid, act - torch.where(finite, ref, 0.0), 0.0)
    err2_rows = diff.square().sum(-1)  # [groups, rows]
    err_whole = float(err2_rows.sum().sqrt())
    ratio_whole = err_whole / allowed["whole"]
    text = f"{name}: L2 error {err_whole:.4g}, allowed {allowed['whole']:.4g} (ratio {ratio_whole:.3g})"
    worst_tile_ratio = 0.0
    if allowed["tiles"] is None:
        text += "; tiles not checked (no stored tile allowances)"
    else:
        num_groups, num_rows = err2_rows.shape
        pad = (-num_rows) % TILE_ROWS
        err_tiles = torch.nn.functional.pad(err2_rows, (0, pad)).view(num_groups, -1, TILE_ROWS).sum(-1).sqrt()
        allowed_tiles = torch.tensor(allowed["tiles"], dtype=torch.float64)
        ratio_tiles = torch.where(err_tiles > 0, err_tiles / allowed_tiles, 0.0)
        worst = int(ratio_tiles.argmax())
        g, t = divmod(worst, ratio_tiles.shape[1])
        worst_tile_ratio = float(ratio_tiles[g, t])
        last_row = min((t + 1) * TILE_ROWS, num_rows) - 1
        text += (
            f"; worst tile {describe_group(name, groups, g)}, rows {t * TILE_ROWS}..{last_row}: error "
            f"{float(err_tiles[g, t]):.4g}, allowed {float(allowed_tiles[g, t]):.4g} (ratio {worst_tile_ratio:.3g}); "
            f"{int((ratio_tiles > 1).sum())} of {ratio_tiles.numel()} tiles over"
        )
    text += "".join(f"; {kind} x{count}" for kind, count in counts.items() if count)
    kinds = {kind for kind, count in counts.items() if count}
    if bool(finite.any()) and not bool((act[finite] != 0).any()) and max(ratio_whole, worst_tile_ratio) > 1:
        kinds.add("all_zero")
    if ratio_whole > 1:
        kinds.add("mismatch")
    elif worst_tile_ratio > 1:
        kinds.add("tile_mismatch")
    return [name + ":" + kind for kind in KINDS if kind in kinds], text


def test_attnfuzz_repro():
    check_environment()
    q, k, v, dout, cu_seqlens_q, cu_seqlens_k = make_inputs(DEVICE)
    expected = reference(q, k, v, dout)
    leaves = [t.detach().clone().requires_grad_(BACKWARD) for t in (q, k, v)]
    with torch.set_grad_enabled(BACKWARD):
        out, lse = call_backend(*leaves, cu_seqlens_q, cu_seqlens_k)
    grads = (None, None, None)
    if BACKWARD:
        out.backward(dout)
        grads = tuple(t.grad for t in leaves)
    found, lines = [], []
    for name, actual in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads)):
        if actual is None or expected[name] is None or name not in ALLOWED:
            continue
        signatures, text = judge(name, actual, expected[name])
        found.extend(signatures)
        lines.append(text)
    figures = "\\n  ".join(lines)
    if SIGNATURE is None:
        assert not found, f"attnfuzz {BACKEND}/{VARIANT}: {', '.join(found)} (case {CASE_ID})\\n  {figures}"
        return
    assert SIGNATURE not in found, (
        f"attnfuzz {BACKEND}/{VARIANT}: {', '.join(found)} (recorded signature {SIGNATURE}, case {CASE_ID}: "
        f"still there)\\n  {figures}"
    )
    if found:
        warnings.warn(f"attnfuzz {BACKEND}/{VARIANT}: {SIGNATURE} is gone but {', '.join(found)} remain\\n  {figures}")
'''


@dataclass(frozen=True)
class Repro:
    """A generated repro: a file name and the source text."""

    filename: str
    source: str


def validated_case(config: Any) -> AttentionCase:
    """The stored case JSON validated again.

    Raises:
        ExportError: ``field`` ``case.<name>`` for the offending field.
    """
    try:
        return AttentionCase.from_json(config)
    except CaseValidationError as exc:
        name = getattr(exc, "field", None) or "config"
        raise ExportError(f"case.{name}", f"the stored case does not validate: {exc}") from None


def repro_filename(backend: str, variant: str, case_id: str) -> str:
    """``test_attnfuzz_<backend>_<variant>_<case_id>.py`` (``-``, ``.`` and ``+`` become ``_``)."""
    clean = re.sub(r"[^A-Za-z0-9_]", "_", f"{backend}_{variant}")
    return f"test_attnfuzz_{clean}_{case_id}.py"


def check_names(backend: Any, variant: Any, signature: Any) -> None:
    """Backend and variant names and the signature must have the stored forms.

    Raises:
        ExportError: ``backend``, ``variant`` or ``signature``, whichever is malformed first.
    """
    if not isinstance(backend, str) or not NAME_PATTERN.match(backend):
        raise ExportError("backend", f"{str(backend)[:80]!r} is not a backend name")
    if not isinstance(variant, str) or not NAME_PATTERN.match(variant):
        raise ExportError("variant", f"{str(variant)[:80]!r} is not a variant name")
    if signature is not None and (not isinstance(signature, str) or not SIGNATURE_PATTERN.match(signature)):
        raise ExportError("signature", f"{str(signature)[:80]!r} is not a signature like 'out:all_zero'")


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


def render_repro(
    case: AttentionCase,
    backend: Backend | str,
    variant: str,
    signature: str | None,
    *,
    allowance: dict[str, Allowance] | None = None,
    allowed: dict[str, float] | None = None,
    recorded: dict[str, Any] | None = None,
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

    from oracle import compare, inputs

    packages = ", ".join(("torch", "pytest", *call.packages))
    untiled = [n for n in judged if allowance[n].tiles is None]
    tile_note = (
        f"Tile allowances were not stored for {', '.join(untiled)}: those are judged whole only."
        if untiled else "Every tensor is judged whole and per tile, as attnfuzz judged it."
    )
    if "lse" not in judged:
        tile_note += " No lse allowance was stored (the recorded call returned none): lse is not judged."
    recorded_text = _recorded_text(recorded)
    doc = textwrap.dedent(
        f"""\
        attnfuzz repro: {name} / {variant} / {signature or "(no recorded failure)"}, case {case.case_id}.

        {case.describe()}

        Standalone: needs only {packages}; skips with the reason when the package, a CUDA GPU or
        the GPU architecture is missing. Run it with plain pytest.

        What it does: regenerates the inputs bit for bit (attnfuzz's counter-based hash_normal,
        copied below), calls {name} exactly as the variant {variant!s} did (call_backend), computes
        a dense float64 reference inline (reference) and judges every tensor (out, lse, dq, dk, dv)
        as the attnfuzz judge did (judge): no NaN, no +-inf where the reference is finite, lse
        infinite exactly on rows that see no key (natural log), not all zero, the L2 error of the
        whole tensor within ALLOWED[tensor]["whole"] (mismatch) and of every tile of TILE_ROWS rows
        of one (batch, head) within ALLOWED[tensor]["tiles"] (tile_mismatch).

        It FAILS exactly when the kernel still shows the recorded signature SIGNATURE (without one:
        any signature), naming every signature found and the figures (error, allowed, worst tile).

        Tolerance: ALLOWED holds the allowed errors stored when attnfuzz judged this case, from its
        error model (oracle/compare.py): factor * max(||round_dtype(R) - R||_2, u * ||sigma||_2) +
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
        "docstring": _Slot(docstring_literal(doc.rstrip() + "\n")),
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
        # +-inf on rows without a visible key is accepted anyway; only a finite sentinel needs naming
        "masked_row_lse": call.masked_row_lse if _finite_float(call.masked_row_lse) else None,
        "m32": inputs._M32,
        "cos_coeffs": list(inputs._COS_COEFFS),
        "atanh_coeffs": list(inputs._ATANH_COEFFS),
        "streams_qkvd": (inputs.STREAM_Q, inputs.STREAM_K, inputs.STREAM_V, inputs.STREAM_DOUT),
        "streams_extra": (inputs.STREAM_Q_OUTLIERS, inputs.STREAM_K_OUTLIERS, inputs.STREAM_K_BASE),
        "large_logits_std": inputs.LARGE_LOGITS_STD,
        "max_q_gain": inputs.MAX_Q_GAIN,
        "outlier_z": inputs.OUTLIER_Z,
        "outlier_gain": inputs.OUTLIER_GAIN,
        "near_constant_noise": inputs.NEAR_CONSTANT_NOISE,
    }
    if not isinstance(call.values, dict):
        raise ExportError("backend", f"{name}.repro: values must be a dict")
    overlap = set(values) & set(call.values)
    if overlap:
        raise ExportError("backend", f"repro slots {sorted(overlap)} clash with the file's own")
    values.update(call.values)
    copied = "\n\n".join(inspect.getsource(getattr(inputs, fn)) for fn in _INPUT_FUNCTIONS)
    if not isinstance(call.source, str):
        raise ExportError("backend", f"{name}.repro: source must be a string")
    template = (
        _HEADER
        + copied.replace("$", "$$")
        + _RUNTIME
        + "\n# ------------------------------------------------------------------- the backend call\n"
        + textwrap.dedent(call.source)
        + _JUDGE
    )
    return Repro(filename=repro_filename(name, variant, case.case_id), source=fill_template(template, values))


__all__ = [
    "Allowance",
    "CallSnippet",
    "ExportError",
    "Repro",
    "ReproCall",
    "allowed_errors",
    "check_only_literals",
    "computed_allowance",
    "docstring_literal",
    "exportable_backends",
    "export_target",
    "fill_template",
    "has_repro",
    "literal",
    "load_export",
    "misleading_reason",
    "render_repro",
    "repro_call",
    "repro_filename",
    "resolve_backend",
    "stored_allowance",
    "tile_grid",
    "validated_case",
]
