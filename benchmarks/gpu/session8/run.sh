#!/usr/bin/env bash
# Eighth session, one H200: issue 14's campaign. One machine, calls back to back (it goes back
# 30 s after a call ends):
#   run.sh recv N        receive part N of `gpu_stage.py fetch --dest .gpu-wheels` (carry .gpu-wheels/pN)
#   run.sh install       start `gpu_stage.py install` in the background (/tmp/install.log)
#   run.sh start S [profile]
#                        wait for the install, copy the tree to /tmp/snap, `attnfuzz backends`,
#                        start the default campaign in the background for S seconds; with
#                        "profile" the worker runs under cProfile and every child profiles its
#                        serving loop (ATTNFUZZ_PROFILE_DIR), which slows attnfuzz's own code
#   run.sh wait [S]      wait until the worker exits (at most S seconds), print the log tail
#   run.sh finish [check] report, summary, profiles (and with check the hand checks of one bucket
#                        per root-cause group, benchmarks/gpu/session7/check_groups.py), files to $OUT
# No environment variable is set by hand for the campaign itself: the default command must
# start on the image as it is.
set -uo pipefail
O=/tmp/s8; mkdir -p "$O"
S=/tmp/snap
DB=sqlite:////tmp/campaign.db
export PYTHONUNBUFFERED=1
. benchmarks/gpu/staging.sh  # stage_recv, stage_install, stage_wait_install (run from the project root)
case "${1:-}" in
recv)
    stage_recv "$2"
    ;;
install)
    stage_install "${2:-8}"
    ;;
start)
    stage_wait_install "$O"
    rm -rf "$S" && cp -r "$PWD" "$S" && rm -rf "$S/.gpu-wheels" "$S/.gpu-cudnn" && cd "$S"
    export PYTHONPATH=$S:/tmp/gpu-site
    rm -f /tmp/campaign.db* /tmp/campaign.pid; rm -rf /tmp/attnfuzz-children-* ~/.cache/attnfuzz/fa4-jit /tmp/prof
    { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"; git -C "$S" log --oneline -1 2>/dev/null; } > "$O/env.txt" 2>&1
    timeout 200 python3 -m service.cli.main backends > "$O/backends.txt" 2>&1; echo "rc $?" >> "$O/backends.txt"
    date +%s.%N > /tmp/campaign.t0
    if [ "${3:-}" = profile ]; then
        mkdir -p /tmp/prof
        RUN=(env ATTNFUZZ_PROFILE_DIR=/tmp/prof python3 -m cProfile -o /tmp/prof/worker.prof -m service.cli.main)
    else
        RUN=(python3 -m service.cli.main)
    fi
    setsid nohup "${RUN[@]}" fuzz --device cuda --time-budget "${2:-600}" --corpus '' \
        --db "$DB" --json > /tmp/campaign.json 2> /tmp/campaign.log < /dev/null &
    echo $! > /tmp/campaign.pid
    sleep 20; tail -3 /tmp/campaign.log; tail -25 "$O/backends.txt"
    kill -0 "$(cat /tmp/campaign.pid)" && echo "worker alive"
    ;;
wait)
    pid=$(cat /tmp/campaign.pid)
    for _ in $(seq 1 "${2:-540}"); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && echo "still running" || echo "worker exited"
    tail -c 1500 /tmp/campaign.log; head -c 1500 /tmp/campaign.json
    ;;
finish)
    cd "$S"; export PYTHONPATH=$S:/tmp/gpu-site
    cp /tmp/campaign.json /tmp/campaign.t0 "$O/"; tail -c 200000 /tmp/campaign.log > "$O/campaign.log"
    timeout 120 python3 -m service.cli.main report --db "$DB" > "$O/campaign_report.txt" 2> "$O/report.err"
    timeout 60 python3 benchmarks/gpu/session7/summarise.py /tmp/campaign.db /tmp/campaign.t0 > "$O/summary.json" 2> "$O/summary.err"
    [ -d /tmp/prof ] && timeout 120 python3 benchmarks/gpu/session8/profile_summary.py /tmp/prof > "$O/profiles.txt" 2>&1
    # one bucket per root-cause group, most severe first, against the naive float64 computation
    if [ "${2:-}" = check ]; then
        CUDNN_LIB=$(python3 -c "from fuzzer.environment import resolve_cudnn_choice as r; print(r().directory or '')")
        LD_LIBRARY_PATH=$CUDNN_LIB CUDNN_PATH=$CUDNN_LIB CUDNN_HOME=$CUDNN_LIB FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 \
        FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$HOME/.cache/attnfuzz/fa4-jit \
        timeout "${CHECK_S:-110}" python3 benchmarks/gpu/session7/check_groups.py /tmp/campaign.db "$O/bucket_checks.json" --budget-s "${CHECK_BUDGET:-90}" \
            > "$O/bucket_checks.log" 2>&1
        tail -c 2000 "$O/bucket_checks.log"
    fi
    R=${OUT:-/tmp/attnfuzz-out}; mkdir -p "$R"
    gzip -c /tmp/campaign.db > "$R/campaign.db.gz"
    [ -d /tmp/prof ] && tar czf "$R/prof.tgz" -C /tmp prof
    tar czf "$R/s8.tgz" -C /tmp s8
    ls -la "$O" "$R"
    ;;
*) echo "usage: run.sh recv N | install | start S [profile] | wait [S] | finish" >&2; exit 2 ;;
esac
