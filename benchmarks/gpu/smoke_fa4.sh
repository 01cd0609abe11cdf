#!/usr/bin/env bash
# Short H200 run with flash-attn-4 only (staged by gpu_stage.py without TE): lists the backends,
# times the oracle at the benchmark size, and fuzzes fa4 and PyTorch's CUDA SDPA kernels from an
# empty database. Results go to $OUT. Run from the project root after `gpu_stage.py install`.
set -uo pipefail
export PYTHONPATH=$PWD:/tmp/gpu-site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/attnfuzz-out}; mkdir -p "$OUT"
DB=sqlite:////tmp/attnfuzz-smoke.db
BUDGET=${1:-200}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -m service.cli.main backends > "$OUT/backends.txt" 2>&1
timeout 100 python3 benchmarks/oracle_bench.py --device cuda --sizes b4,s4096,h16,d128,causal \
    --engines torch,triton --json "$OUT/oracle_bench.json" > "$OUT/oracle_bench.txt" 2>&1
start=$(date +%s)
fuzz() {
    timeout $((BUDGET + 60)) python3 -m service.cli.main fuzz --db "$DB" --quiet --max-seqlen 2048 \
        --max-work 268435456 --shrink-deadline 60 --backend fa4 --backend torch-sdpa-math \
        --backend torch-sdpa-flash --backend torch-sdpa-efficient --backend torch-sdpa-cudnn "$@"
}
fuzz --time-budget "$BUDGET" > "$OUT/fuzz.txt" 2>&1
code=$?
if [ $code -ne 0 ] && [ $(( $(date +%s) - start )) -lt 60 ]; then  # process isolation failed early
    echo "process isolation failed ($code); retrying in-process" >> "$OUT/fuzz.txt"
    fuzz --time-budget $((BUDGET - 60)) --isolation none >> "$OUT/fuzz.txt" 2>&1
fi
python3 -m service.cli.main report --db "$DB" --json > "$OUT/report.json" 2>&1
python3 -m service.cli.main report --db "$DB" > "$OUT/report.txt" 2>&1
tail -n 30 "$OUT/report.txt"; tail -n 8 "$OUT/oracle_bench.txt" "$OUT/backends.txt"
