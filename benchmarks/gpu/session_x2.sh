#!/usr/bin/env bash
# One session on a 2 x H200 host (device kind nvidia-h200-x2) that runs, side by side:
#   A  the single-GPU campaign (issue 3): fa4, te-fa4/te-fused/te-unfused, torch-sdpa-*, on GPU 0
#   B  the CP campaign (issue 5): te-fa4 and te-fused, cp_size 2 drawn by the worker, GPUs 0+1
#   C  on GPU 1: a TE/FA4 smoke on the corpus cases, the flash-attn-4 bisection b11..b36 (issue 4),
#      a replay of the corpus on every build, then the fixed CP matrix (fuzzer.cp.campaign).
# Staging first (see docs/gpu-campaigns.md): .gpu-wheels/p1..p7 through gpu_stage.py receive,
# .gpu-wheels-old/p1..p3 (nvidia-cutlass-dsl 4.6.0.dev0 + quack-kernels 0.5.3 for builds before
# 4.0.0b27, and pure-Python packaging/prometheus-client/httpx) copied to /tmp/old-stage.
#
#   session_x2.sh setup          install the stack, unpack the old wheelhouse and the extras
#   session_x2.sh start SECONDS  launch A, B, C in the background (they survive the device call)
#   session_x2.sh wait SECONDS   wait until all three are done or SECONDS pass; print progress
#   session_x2.sh finish         reports, databases (gzip) and logs into $OUT
set -uo pipefail
export PYTHONPATH=$PWD:/tmp/gpu-site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/attnfuzz-out}; mkdir -p "$OUT"
W=/tmp/attnfuzz-x2; mkdir -p $W
BUILDS=/tmp/attnfuzz-builds
SEED_CASE=corpus/fa4/te_style-a3de6cbca071279e.json

case "${1:-}" in
setup)
    mkdir -p /tmp/wheelhouse-old
    cat /tmp/old-stage/part-* | tar -x -C /tmp/wheelhouse-old || exit 1
    for w in /tmp/old-stage/pyextra/*.whl; do
        python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/gpu-site')" "$w" || exit 1
    done
    ls /tmp/wheelhouse-old /tmp/fa4
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
    python3 -m service.cli.main backends 2>&1 | tee $W/backends.txt | tail -30
    ;;
start)
    T=${2:-610}
    rm -f $W/*.db*
    # A: single-GPU campaign on GPU 0
    CUDA_VISIBLE_DEVICES=0 ATTNFUZZ_SPOOL_DIR=$W/spoolA setsid nohup python3 -m service.cli.main fuzz \
        --db sqlite:///$W/single.db --device cuda --time-budget "$T" --quiet \
        --max-seqlen 2048 --max-work 268435456 --shrink-deadline 90 --case-timeout 300 \
        --backend fa4 --backend te-fa4 --backend te-fused --backend te-unfused \
        --backend torch-sdpa-math --backend torch-sdpa-flash --backend torch-sdpa-efficient \
        --backend torch-sdpa-cudnn --backend torch-flex > $W/single.log 2>&1 < /dev/null &
    echo "A pid $!"
    # B: CP campaign, ranks on GPUs 0 and 1
    ATTNFUZZ_SPOOL_DIR=$W/spoolB setsid nohup python3 -m service.cli.main fuzz \
        --db sqlite:///$W/cp.db --device cuda --time-budget "$T" --quiet --corpus '' \
        --max-seqlen 2048 --max-work 268435456 --shrink-deadline 90 --case-timeout 300 \
        --backend te-fa4 --backend te-fused > $W/cp.log 2>&1 < /dev/null &
    echo "B pid $!"
    # C: smoke, bisection, matrix, fixed CP matrix
    setsid nohup bash benchmarks/gpu/session_x2.sh jobC > $W/c.log 2>&1 < /dev/null &
    echo "C pid $!"
    ;;
jobC)
    export CUDA_VISIBLE_DEVICES=1
    python3 - <<'EOF' > $W/smoke_cases.json
import json, pathlib
out = []
for p in sorted(pathlib.Path("corpus").glob("*/*.json")):
    e = json.loads(p.read_text())
    out.append({"backend": e["backend"], "variant": e["variant"], "case": e["case"]})
print(json.dumps(out))
EOF
    echo "== smoke $(date +%T)"
    timeout 400 python3 benchmarks/gpu/check_cases.py $W/smoke_cases.json --json $W/smoke.json > $W/smoke.txt 2>&1
    echo "smoke exit $?"; tail -40 $W/smoke.txt
    echo "== prepare $(date +%T)"
    python3 -m service.cli.main builds prepare --package flash-attn-4 --builds-dir $BUILDS \
        $(for d in /tmp/fa4/*/; do printf -- '--build-dir %s ' "$d"; done) \
        --wheelhouse /tmp/wheelhouse-old --allow-missing 2>&1 | tail -40
    echo "== bisect $(date +%T)"
    python3 -m service.cli.main bisect $SEED_CASE --package flash-attn-4 --good 4.0.0b11 --bad 4.0.0b36 \
        --builds-dir $BUILDS --db sqlite:///$W/builds.db --device cuda --case-timeout 420 --no-reuse \
        --json > $W/bisect.json 2> $W/bisect.err
    echo "bisect exit $?"; tail -5 $W/bisect.err; head -c 3000 $W/bisect.json
    echo "== matrix $(date +%T)"
    python3 -m service.cli.main builds replay --package flash-attn-4 --builds-dir $BUILDS --backend fa4 \
        --corpus corpus --no-db-cases --db sqlite:///$W/builds.db --device cuda --case-timeout 420 \
        --jobs 6 --json > $W/matrix.json 2> $W/matrix.err
    echo "matrix exit $?"; tail -5 $W/matrix.err
    python3 -m service.cli.main regressions --package flash-attn-4 --db sqlite:///$W/builds.db --json > $W/regressions.json 2>&1
    python3 -m service.cli.main regressions --package flash-attn-4 --db sqlite:///$W/builds.db > $W/regressions.txt 2>&1
    echo "== cp matrix $(date +%T)"
    unset CUDA_VISIBLE_DEVICES
    timeout 900 python3 -m fuzzer.cp.campaign --cp-size 2 --backend te-fa4 --backend te-fused \
        --timeout 300 --out $W/cp_campaign.jsonl > $W/cp_campaign.txt 2>&1
    echo "cp matrix exit $?"; tail -30 $W/cp_campaign.txt
    echo "== C done $(date +%T)"
    ;;
wait)
    for _ in $(seq 1 "${2:-540}"); do
        pgrep -f "service.cli.main fuzz|session_x2.sh jobC" > /dev/null || break; sleep 1
    done
    date +%T; pgrep -af "service.cli.main|session_x2|cp_campaign|check_cases" | cut -c1-150 | head
    tail -3 $W/single.log $W/cp.log; tail -25 $W/c.log
    nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv
    ;;
finish)
    for db in single cp; do
        python3 -m service.cli.main report --db sqlite:///$W/$db.db --json > $OUT/${db}_report.json 2>&1
        python3 -m service.cli.main report --db sqlite:///$W/$db.db > $OUT/${db}_report.txt 2>&1
    done
    tar -czf $OUT/dbs.tar.gz -C $W $(cd $W && ls *.db 2>/dev/null)
    tar -czf $OUT/logs.tar.gz -C $W --exclude='*.db' --exclude='spool*' .
    tail -30 $OUT/single_report.txt; tail -30 $OUT/cp_report.txt
    ;;
*) echo "usage: session_x2.sh setup | start SECONDS | wait SECONDS | finish" >&2; exit 2 ;;
esac
