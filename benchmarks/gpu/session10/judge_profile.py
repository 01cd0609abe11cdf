"""Tenth session: where the batch judge's time goes on the GPU (torch.profiler over
`oracle.compare.compare_outputs_batch` of 20 outputs of two cases of benchmarks/judge_batch_bench.py),
and make_inputs on CUDA, per-stream calls against `oracle.inputs.hash_normal_many` (one pass)."""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from judge_batch_bench import CASES, outputs_for  # noqa: E402

from oracle.compare import PreparedReference, compare_outputs_batch  # noqa: E402
from oracle.inputs import make_inputs  # noqa: E402
from oracle.reference import reference  # noqa: E402

gen = torch.Generator().manual_seed(0)
for label in ("sq65 sk130 h2 d16 bf16 bwd", "sq512 sk512 h4 d64 fp16 causal bwd"):
    case = CASES[label]
    inputs = make_inputs(case, device="cuda")
    ref = reference(case, inputs, backward=True)
    t0 = time.perf_counter()
    prepared = PreparedReference(case, ref, inputs=inputs)
    torch.cuda.synchronize()
    print(label, "PreparedReference ms", round((time.perf_counter() - t0) * 1000, 2))
    outputs = [{k: v.cpu() for k, v in o.items()} for o in outputs_for(case, ref, 20, gen)]
    compare_outputs_batch(case, prepared, outputs)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        compare_outputs_batch(case, prepared, outputs)
    ka = prof.key_averages()
    print(label, "ops", sum(k.count for k in ka if k.key.startswith("aten::")))
    print(ka.table(sort_by="self_cpu_time_total", row_limit=14))
    for name in ("make_inputs",):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            make_inputs(case, device="cuda")
        torch.cuda.synchronize()
        print(label, "make_inputs cuda ms", round((time.perf_counter() - t0) / 5 * 1000, 2))
