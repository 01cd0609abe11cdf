#!/usr/bin/env bash
# Tenth session, one H200: issue 14's campaign after batched judging. One machine, calls back to
# back (it goes back 30 s after a call ends):
#   run.sh recv N          receive part N of `gpu_stage.py fetch --dest .gpu-wheels` (carry .gpu-wheels/pN)
#   run.sh install         start `gpu_stage.py install` in the background (/tmp/install.log)
#   run.sh bench           benchmarks/judge_batch_bench.py on the GPU (batch against one by one; the
#                          two engines' verdicts compared) into $O/judge_bench.txt (needs torch only)
#   run.sh start NAME S [PROFILE_S]
#                          wait for the install, copy the tree to /tmp/snap (once), clear the FA4
#                          compile cache and torch's inductor cache (every campaign starts cold),
#                          start `attnfuzz fuzz --device cuda --time-budget S --corpus ''` on an
#                          empty database /tmp/NAME.db in the background; with PROFILE_S, py-spy
#                          (.venv/bin/py-spy, carried) samples the worker for that many seconds from
#                          its 30th second, without stopping it (--nonblocking), into $O/NAME/pyspy.txt
#   run.sh wait NAME [S]   wait until that worker exits (at most S seconds), print the log tail
#   run.sh finish NAME [check]
#                          report, summary (and with check the hand checks of one bucket per
#                          root-cause group, benchmarks/gpu/session7/check_groups.py), files to $OUT
# No environment variable is set by hand for the campaign itself: the default command must
# start on the image as it is.
set -uo pipefail
O=${SESSION_OUT:-/tmp/s10}; mkdir -p "$O"  # SESSION_OUT: a later session's results folder (session11/run.sh)
S=/tmp/snap
export PYTHONUNBUFFERED=1
. benchmarks/gpu/staging.sh  # stage_recv, stage_install, stage_wait_install (run from the project root)
case "${1:-}" in
recv)
    stage_recv "$2"
    [ -x .venv/bin/py-spy ] && cp .venv/bin/py-spy /tmp/py-spy
    ;;
install)
    stage_install "${2:-8}"
    [ -x .venv/bin/py-spy ] && cp .venv/bin/py-spy /tmp/py-spy
    ;;
bench)
    PYTHONPATH=$PWD timeout 300 python3 benchmarks/judge_batch_bench.py --device cuda --results 20 --repeats 5 \
        --json "$O/judge_bench.json" 2>&1 | tee "$O/judge_bench.txt"
    ;;
start)
    N=$2
    stage_wait_install "$O"
    if [ ! -d "$S" ]; then cp -r "$PWD" "$S" && rm -rf "$S/.gpu-wheels" "$S/.venv"; fi
    cd "$S"; export PYTHONPATH=$S:${GPU_SITE:-/tmp/gpu-site}  # GPU_SITE: where a later session imports the staged packages from
    rm -f "/tmp/$N.db"* "/tmp/$N.pid"; rm -rf /tmp/attnfuzz-children-* ~/.cache/attnfuzz/fa4-jit /tmp/torchinductor_* ~/.cache/torch/inductor
    { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"; } > "$O/env.txt" 2>&1
    [ -f "$O/backends.txt" ] || { timeout 200 python3 -m service.cli.main backends > "$O/backends.txt" 2>&1; echo "rc $?" >> "$O/backends.txt"; }
    date +%s.%N > "/tmp/$N.t0"
    setsid nohup python3 -m service.cli.main fuzz --device cuda --time-budget "${3:-600}" --corpus '' \
        --db "sqlite:////tmp/$N.db" --json > "/tmp/$N.json" 2> "/tmp/$N.log" < /dev/null &
    echo $! > "/tmp/$N.pid"
    if [ -n "${4:-}" ] && [ -x /tmp/py-spy ]; then
        mkdir -p "$O/$N"
        setsid nohup bash -c "sleep 30; /tmp/py-spy record --nonblocking -r 100 -d $4 -f raw -o $O/$N/pyspy.txt --pid $(cat /tmp/$N.pid) > $O/$N/pyspy.log 2>&1" \
            < /dev/null > /dev/null 2>&1 &
    fi
    sleep 15; tail -3 "/tmp/$N.log"; tail -16 "$O/backends.txt"
    kill -0 "$(cat /tmp/$N.pid)" && echo "worker alive"
    ;;
wait)
    N=$2
    pid=$(cat "/tmp/$N.pid")
    for _ in $(seq 1 "${3:-540}"); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && echo "still running" || echo "worker exited"
    tail -c 1500 "/tmp/$N.log"; python3 -c "
import json,sys
d=json.load(open('/tmp/$N.json'))
print({k: d.get(k) for k in ('cases','wall_s','cases_per_s','evaluations_by_status','time_s','busy','late','late_dropped','compile_gated')})
print({n: r.get('cases_run') for n, r in d.get('coverage', {}).items()})
" 2>&1 | tail -c 3000
    ;;
finish)
    N=$2
    cd "$S"; export PYTHONPATH=$S:/tmp/gpu-site
    mkdir -p "$O/$N"
    cp "/tmp/$N.json" "/tmp/$N.t0" "$O/$N/"; tail -c 200000 "/tmp/$N.log" > "$O/$N/campaign.log"
    timeout 120 python3 -m service.cli.main report --db "sqlite:////tmp/$N.db" > "$O/$N/campaign_report.txt" 2> "$O/$N/report.err"
    timeout 60 python3 benchmarks/gpu/session7/summarise.py "/tmp/$N.db" "/tmp/$N.t0" > "$O/$N/summary.json" 2> "$O/$N/summary.err"
    if [ "${3:-}" = check ]; then
        CUDNN_LIB=$(python3 -c "from fuzzer.environment import resolve_cudnn_choice as r; print(r().directory or '')")
        LD_LIBRARY_PATH=$CUDNN_LIB CUDNN_PATH=$CUDNN_LIB CUDNN_HOME=$CUDNN_LIB FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 \
        FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$HOME/.cache/attnfuzz/fa4-jit \
        timeout "${CHECK_S:-200}" python3 benchmarks/gpu/session7/check_groups.py "/tmp/$N.db" "$O/$N/bucket_checks.json" --budget-s "${CHECK_BUDGET:-170}" \
            > "$O/$N/bucket_checks.log" 2>&1
        tail -c 2500 "$O/$N/bucket_checks.log"
    fi
    R=${OUT:-/tmp/attnfuzz-out}; mkdir -p "$R"
    gzip -c "/tmp/$N.db" > "$R/$N.db.gz"
    tar czf "$R/$(basename "$O").tgz" -C "$(dirname "$O")" "$(basename "$O")"
    ls -la "$R"
    ;;
*) echo "usage: run.sh recv N | install | bench | start NAME S [PROFILE_S] | wait NAME [S] | finish NAME [check]" >&2; exit 2 ;;
esac
