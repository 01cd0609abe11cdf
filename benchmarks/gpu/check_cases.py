"""Re-run stored cases by hand on one backend variant each and show where they differ from the
float64 oracle (in-process, no executor): per tensor the signatures, error ratio, worst index,
whether that row sees any key, and the kernel's and the reference's values there; for errors the
exception text.

Usage: python benchmarks/gpu/check_cases.py CASES.json [--json OUT]
CASES.json: a list of {"backend": ..., "variant": ..., "case": <AttentionCase JSON>}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from fuzzer import registry  # noqa: E402
from oracle.compare import compare_outputs  # noqa: E402
from oracle.config import AttentionCase  # noqa: E402
from oracle.inputs import make_inputs  # noqa: E402
from oracle.masks import visible_rows  # noqa: E402
from oracle.reference import reference  # noqa: E402


def check(entry: dict) -> dict:
    case = AttentionCase.from_json(entry["case"])
    (backend, _), = registry.select([entry["backend"]])
    device = backend.device
    inputs = make_inputs(case, device=device)
    ref = reference(case, inputs, backward=case.backward)
    row = {"backend": backend.name, "variant": entry["variant"], "case_id": case.case_id, "case": case.describe()}
    try:
        output = backend.run(case, inputs, entry["variant"])
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:
        row["exception"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()[-3000:]
        return row
    verdict = compare_outputs(case, ref, out=output.out, lse=output.lse, dq=output.dq, dk=output.dk, dv=output.dv)
    row["signatures"] = list(verdict.signatures)
    rows_visible = visible_rows(case, device=device)
    tensors = {}
    for name, tv in verdict.tensors.items():
        info = {"error_ratio": tv.error_ratio, "rel_l2": tv.rel_l2, "max_abs": tv.max_abs, "worst_index": tv.worst_index}
        actual = getattr(output, name)
        expected = getattr(ref, name)
        if tv.worst_index is not None and actual is not None:
            idx = tuple(tv.worst_index)
            info["actual_at_worst"] = float(actual[idx].double())
            info["reference_at_worst"] = float(expected[idx])
            if name in ("out", "dq") and case.is_varlen:  # rows are dim 0: [total_q, heads, dim]
                info["worst_row_sees_a_key"] = bool(rows_visible[idx[1], idx[0]])
            if name in ("dq", "out"):
                diff = (actual.double() - expected).abs()
                per_row = diff.flatten(1).amax(1) if case.is_varlen else diff.amax(dim=(0, 2, 3))
                bad = (per_row > 10 * per_row.median().clamp_min(1e-30)).nonzero().flatten().tolist()
                info["rows_far_off"] = bad[:50]
                info["rows_far_off_count"] = len(bad)
        tensors[name] = info
    row["tensors"] = tensors
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = [check(entry) for entry in json.load(open(args.cases))]
    text = json.dumps(rows, indent=1, default=str)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(text)
    print(text)


if __name__ == "__main__":
    main()
