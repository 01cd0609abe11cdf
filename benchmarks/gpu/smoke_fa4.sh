#!/usr/bin/env bash
# Shake-out on one H200 with flash-attn-4 only (staged by gpu_stage.py without TE): lists the
# backends, runs the oracle benchmark, the GPU tests and a short fuzz run. Results go to $OUT.
# Run from the project root after `gpu_stage.py install`.
set -uo pipefail
export PYTHONPATH=$PWD:/tmp/gpu-site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/attnfuzz-out}; mkdir -p "$OUT"
DB=sqlite:////tmp/attnfuzz-smoke.db
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -m service.cli backends > "$OUT/backends.txt" 2>&1
timeout 150 python3 benchmarks/oracle_bench.py --device cuda --engines torch,triton --json "$OUT/oracle_bench.json" > "$OUT/oracle_bench.txt" 2>&1
timeout 150 python3 -m pytest tests -m gpu -q -p no:cacheprovider > "$OUT/gpu_tests.txt" 2>&1
timeout 200 python3 -m service.cli fuzz --db "$DB" --time-budget 150 --quiet --max-seqlen 2048 --max-work 268435456 \
    --backend fa4 --backend torch-sdpa-math --backend torch-sdpa-flash --backend torch-sdpa-efficient \
    --backend torch-sdpa-cudnn > "$OUT/fuzz.txt" 2>&1
python3 -m service.cli report --db "$DB" --json > "$OUT/report.json" 2>&1
tail -5 "$OUT"/*.txt
