"""Which stored case, backend and variant a repro is made of, read from the store
(`load_export`, `export_target`), and refusing, without ``force``, an export that would mislead:
a variant whose stored results are only ``unsupported`` or passing (`misleading_reason`), and a
failure that is the limit of the backend's design (`design_limit_export`: with ``force`` the file
checks the oracle's signature and says so). Reads stored figures only; the oracle runs only when the
caller asks (``compute_missing``, the CLI).
"""

from __future__ import annotations

from typing import Any

from fuzzer.backends.base import Backend
from fuzzer.severity import LIMIT_KINDS, signature_kind
from service.export.allowance import computed_allowance, required_tensors, stored_allowance
from service.export.backend import repro_call, resolve_backend
from service.export.repro import Repro, render_repro
from service.export.safety import ExportError, check_names, validated_case


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


def unforced_exports(config: dict[str, Any], results: Any) -> set[tuple[str, str]]:
    """The ``(backend, variant)`` pairs of a case (its stored ``config``) and its stored
    ``results`` (objects with ``backend``, ``variant``, ``status``, ``signature``, ``metrics``,
    ``created_at`` and ``id``) whose repro exports from stored figures without ``force``: the
    results carry the case's allowances (else none: `export_target` needs them), a failure is
    stored (`misleading_reason` is None) and the newest signature is no limit of the backend's
    design (`design_limit_export`). The case page links only these: for the others
    ``/api/cases/{id}/repro.py`` answers 422, which a browser would save as the file."""
    newest_first = sorted(results, key=lambda r: (r.created_at, r.id), reverse=True)
    try:
        case = validated_case(config)
    except ExportError:
        return set()
    allowance = stored_allowance(case, [r.metrics for r in newest_first if r.metrics])
    if any(name not in allowance for name in required_tensors(case)):
        return set()
    grouped: dict[tuple[str, str], list[Any]] = {}
    for r in newest_first:
        grouped.setdefault((r.backend, r.variant), []).append(r)
    exports = set()
    for (backend, variant), rows in grouped.items():
        signature = next((r.signature for r in rows if r.signature is not None), None)
        if misleading_reason([(r.status, "") for r in rows], backend, variant) is None and (
            signature is None or signature_kind(signature) not in LIMIT_KINDS
        ):
            exports.add((backend, variant))
    return exports


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
        ExportError: ``variant`` (a variant that is no distinct call for the case, with or
            without ``force``), ``force`` (misleading export without ``force``), ``allowance`` (no stored
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
    inapplicable = _inapplicable(adapter, case, target.variant)
    if inapplicable:  # refused even with force: the file would call another attention than the case's
        applicable = ", ".join(v for v in adapter.applicable_variants(case) if v != target.variant) or "none"
        raise ExportError(
            "variant",
            f"{target.backend}/{target.variant} is no distinct call for this case ({'; '.join(inapplicable)}), "
            f"so the fuzzer records no result for it and a file would test another mask or call; "
            f"variants that apply here: {applicable}",
        )
    if not force:
        reason = misleading_reason(stored_statuses(session, case_id, target.backend, target.variant), target.backend, target.variant)
        if reason is not None:
            raise ExportError("force", reason + "; pass --force (API: force=true) to export it anyway")
    recorded = _recorded_figures(session, case_id, target.backend, target.variant)
    signature, design_note = target.signature, None
    if signature is not None and signature_kind(signature) in LIMIT_KINDS:
        signature, design_note = design_limit_export(target.backend, target.variant, signature, recorded, force=force)
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
    return render_repro(case, adapter, target.variant, signature, allowance=allowance, recorded=recorded,
                        design_note=design_note)


def design_limit_export(backend: str, variant: str, signature: str, recorded: dict[str, Any], *, force: bool) -> tuple[str, str]:
    """What a repro of a design-limit failure (``<tensor>:limit``, ``<tensor>:unjudgeable``) checks
    and says: ``(the oracle's signature of that tensor, the verdict for the docstring)``. The file
    judges as the oracle does, without the design's emulation, so it tests the oracle's signature
    the limit stands for (``dk:posinf``) and states first that attnfuzz judged it the design's
    limit, with the mechanism.

    Raises:
        ExportError: ``force`` is off (a file that fails on a correct kernel of the design would
            read as a defect report), or no oracle signature of the tensor is stored.
    """
    tensor, _, kind = signature.partition(":")
    figures = recorded.get(tensor) if isinstance(recorded.get(tensor), dict) else {}
    raw = next((s for s in figures.get("signatures") or [] if isinstance(s, str) and s.startswith(f"{tensor}:")), None)
    block = recorded.get("design") if isinstance(recorded.get("design"), dict) else {}
    design, why = str(block.get("design") or "?"), str(block.get("why") or "no mechanism stored")
    what = "beyond any first-order bound of" if kind == "unjudgeable" else "the limit of"
    if not force:
        raise ExportError(
            "force",
            f"{backend}/{variant} fails this case as {what} its design ('{design}': {why}): a correct float32 "
            "emulation of that design fails it the same way, so the file would report no kernel defect; pass "
            f"--force (API: force=true) to export it anyway (the file then checks the oracle's signature "
            f"{raw or tensor} and says it is the design's limit)",
        )
    if raw is None:
        raise ExportError("signature", f"{signature}: the stored result holds no oracle signature of {tensor} to check")
    source = f" (source: {block['source']})" if block.get("source") else ""
    note = (f"attnfuzz's verdict: {what} the backend's design '{design}', not a kernel defect: a correct float32 "
            f"emulation of that design fails this case the same way ({why}){source}. This file checks the "
            f"oracle's signature {raw} (recorded by attnfuzz as {signature}): it fails while the kernel, like a "
            "correct kernel of its design, still shows it.")
    return raw, note


def _inapplicable(adapter: Backend, case: Any, variant: str) -> list[str]:
    """`fuzzer.backends.base.Backend.inapplicable_reasons` of the variant (an adapter whose check
    raises counts as applicable: the export then goes on as before)."""
    try:
        return list(adapter.inapplicable_reasons(case, variant))
    except Exception:  # noqa: BLE001 - a plugin's check must not stop an export
        return []


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
