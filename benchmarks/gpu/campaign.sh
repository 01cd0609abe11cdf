#!/usr/bin/env bash
# The H200 campaign: fa4, TE's sub-backends and PyTorch's CUDA SDPA kernels, forward and backward,
# from an empty database. `campaign.sh start SECONDS` launches the worker in the background (it
# survives the device call) and `campaign.sh finish` waits for it and writes the summary to $OUT.
set -uo pipefail
export PYTHONPATH=$PWD:/tmp/gpu-site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/attnfuzz-out}; mkdir -p "$OUT"
DB=sqlite:////tmp/attnfuzz-campaign.db
LOG=/tmp/attnfuzz-campaign.log
case "${1:-}" in
start)
    rm -f /tmp/attnfuzz-campaign.db*
    python3 -m service.cli.main backends > /tmp/attnfuzz-backends.txt 2>&1
    setsid nohup python3 -m service.cli.main fuzz --db "$DB" --time-budget "${2:-620}" --quiet \
        --max-seqlen 2048 --max-work 268435456 --shrink-deadline "${SHRINK_DEADLINE:-90}" \
        --backend fa4 --backend te-fa4 --backend te-fused --backend te-unfused \
        --backend torch-sdpa-math --backend torch-sdpa-flash --backend torch-sdpa-efficient \
        --backend torch-sdpa-cudnn > "$LOG" 2>&1 < /dev/null &
    echo "started pid $!"
    ;;
wait)
    for _ in $(seq 1 "${2:-540}"); do pgrep -f "service.cli.main fuzz" > /dev/null || break; sleep 1; done
    tail -3 "$LOG"
    ;;
finish)
    for _ in $(seq 1 500); do pgrep -f "service.cli.main fuzz" > /dev/null || break; sleep 1; done
    cp /tmp/attnfuzz-backends.txt "$LOG" "$OUT/"
    python3 -m service.cli.main report --db "$DB" --json > "$OUT/campaign_report.json" 2>&1
    python3 -m service.cli.main report --db "$DB" > "$OUT/campaign_report.txt" 2>&1
    gzip -c /tmp/attnfuzz-campaign.db > "$OUT/campaign.db.gz"
    tail -40 "$OUT/campaign_report.txt"
    ;;
*) echo "usage: campaign.sh start SECONDS | wait SECONDS | finish" >&2; exit 2 ;;
esac
