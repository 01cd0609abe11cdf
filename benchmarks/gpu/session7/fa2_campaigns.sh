#!/usr/bin/env bash
# Seventh session, after run.sh finish (same H200, same install, /tmp/snap): the two campaigns of
# issue 15, exactly as they ran (each was one device call).
#   fa2_campaigns.sh control   fa2 + te-fa2 + te-fa4, 150 s: the seed's control (te-fa4 all-zero
#                              cases, what te-fa2 and raw fa2 give on them) and hand checks
#   fa2_campaigns.sh scale     fa2 + te-fa2 only, 180 s: at least 100 cases each
# Outputs go to $OUT (at most 8 files come back); summarise.py / check_groups.py as in run.sh.
set -uo pipefail
cd /tmp/snap; export PYTHONPATH=/tmp/snap:/tmp/gpu-site PYTHONUNBUFFERED=1
cudnn_env() {
    local lib; lib=$(python3 -c "from fuzzer.environment import resolve_cudnn_choice as r; print(r().directory or '')")
    echo "LD_LIBRARY_PATH=$lib CUDNN_PATH=$lib CUDNN_HOME=$lib FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$HOME/.cache/attnfuzz/fa4-jit"
}
case "${1:-}" in
control)
    date +%s.%N > /tmp/fa2.t0
    timeout 230 python3 -m service.cli.main fuzz --device cuda --time-budget 150 --corpus '' --db sqlite:////tmp/fa2.db \
        --backend fa2 --backend te-fa2 --backend te-fa4 --json > "$OUT/fa2_campaign.json" 2> /tmp/fa2.log
    timeout 60 python3 -m service.cli.main report --db sqlite:////tmp/fa2.db > "$OUT/fa2_report.txt" 2>&1
    python3 benchmarks/gpu/session7/summarise.py /tmp/fa2.db /tmp/fa2.t0 > "$OUT/fa2_summary.json"
    env $(cudnn_env) timeout 80 python3 benchmarks/gpu/session7/check_groups.py /tmp/fa2.db "$OUT/fa2_checks.json" \
        --budget-s 60 > "$OUT/fa2_checks.log" 2>&1
    gzip -c /tmp/fa2.db > "$OUT/fa2.db.gz"
    ;;
scale)
    date +%s.%N > /tmp/fa2b.t0
    timeout 240 python3 -m service.cli.main fuzz --device cuda --time-budget 180 --corpus '' --db sqlite:////tmp/fa2b.db \
        --backend fa2 --backend te-fa2 --json > "$OUT/fa2b_campaign.json" 2> /tmp/fa2b.log
    timeout 60 python3 -m service.cli.main report --db sqlite:////tmp/fa2b.db > "$OUT/fa2b_report.txt" 2>&1
    python3 benchmarks/gpu/session7/summarise.py /tmp/fa2b.db /tmp/fa2b.t0 > "$OUT/fa2b_summary.json"
    gzip -c /tmp/fa2b.db > "$OUT/fa2b.db.gz"
    # the hand checks ran in a further call:
    env $(cudnn_env) timeout 100 python3 benchmarks/gpu/session7/check_groups.py /tmp/fa2b.db "$OUT/fa2b_checks.json" \
        --budget-s 80 > "$OUT/fa2b_checks.log" 2>&1
    ;;
*) echo "usage: fa2_campaigns.sh control | scale" >&2; exit 2 ;;
esac
