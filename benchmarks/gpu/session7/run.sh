#!/usr/bin/env bash
# Seventh session, one H200: issue 14's acceptance campaign (default command, empty database, no
# corpus, every available single-GPU backend), issue 15's FA2 figures and the cuDNN 9.19 vs 9.27
# replay. One machine, calls back to back (it goes back 30 s after a call ends):
#   run.sh recv N        receive part N of `gpu_stage.py fetch --dest .gpu-wheels` (carry .gpu-wheels/pN)
#   run.sh install       start `gpu_stage.py install` in the background (/tmp/install.log)
#   run.sh cudnn N       receive chunk N of the nvidia-cudnn-cu13 9.27.0.42 wheel (carry .gpu-cudnn/cN;
#                        the wheel was split with `split -b 54M`: gpu_stage's --extra would unpack
#                        it into the shared site, where it would shadow torch's own cuDNN)
#   run.sh start [S]     wait for the install, join the cuDNN wheel (sha256 checked), copy the tree
#                        to /tmp/snap (a device call replaces the working copy), `attnfuzz
#                        backends`, start the campaign in the background for S seconds (600)
#   run.sh wait [S]      wait until the worker exits (at most S seconds), print the log tail
#   run.sh finish        report, summary, bucket hand checks, the cuDNN replays, files to $OUT
# No environment variable is set by hand for the campaign: the default command must start on the
# image as it is.
set -uo pipefail
O=/tmp/s7; mkdir -p "$O"   # collected here; finish packs it into $OUT (at most 8 files come back)
S=/tmp/snap
DB=sqlite:////tmp/campaign.db
CUDNN_WHL=nvidia_cudnn_cu13-9.27.0.42-py3-none-manylinux_2_27_x86_64.whl
CUDNN_SHA=9677e76f21862eb5da7ee5ed69d544738b2d8b5c3ce7e5ec125c5592e6cdbdc8
export PYTHONUNBUFFERED=1
. benchmarks/gpu/staging.sh  # stage_recv, stage_install, stage_wait_install (run from the project root)
af() { python3 -m service.cli.main "$@"; }
case "${1:-}" in
recv)
    stage_recv "$2"
    ;;
install)
    stage_install "${2:-8}"
    ;;
cudnn)
    mkdir -p /tmp/cudnn-parts && cp .gpu-cudnn/c"$2"/part.* /tmp/cudnn-parts/ && ls /tmp/cudnn-parts | wc -l
    tail -2 /tmp/install.log 2>/dev/null
    ;;
start)
    stage_wait_install "$O"
    mkdir -p /tmp/cudnn-wh && cat /tmp/cudnn-parts/part.* > "/tmp/cudnn-wh/$CUDNN_WHL"
    echo "$CUDNN_SHA  /tmp/cudnn-wh/$CUDNN_WHL" | sha256sum -c - | tee "$O/cudnn_sha.txt"
    rm -rf "$S" && cp -r "$PWD" "$S" && rm -rf "$S/.gpu-wheels" "$S/.gpu-cudnn" && cd "$S"
    export PYTHONPATH=$S:/tmp/gpu-site
    rm -f /tmp/campaign.db* /tmp/campaign.pid; rm -rf /tmp/attnfuzz-children-* ~/.cache/attnfuzz/fa4-jit
    { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"; git -C "$S" log --oneline -1 2>/dev/null; } > "$O/env.txt" 2>&1
    timeout 200 python3 -m service.cli.main backends > "$O/backends.txt" 2>&1; echo "rc $?" >> "$O/backends.txt"
    date +%s.%N > /tmp/campaign.t0
    setsid nohup python3 -m service.cli.main fuzz --device cuda --time-budget "${2:-600}" --corpus '' \
        --db "$DB" --json > /tmp/campaign.json 2> /tmp/campaign.log < /dev/null &
    echo $! > /tmp/campaign.pid
    sleep 30; tail -3 /tmp/campaign.log; cat "$O/backends.txt" | tail -25
    python3 -c "import sqlite3; print('results', sqlite3.connect('/tmp/campaign.db').execute('select count(*) from results').fetchone())"
    kill -0 "$(cat /tmp/campaign.pid)" && echo "worker alive"
    ;;
wait)
    pid=$(cat /tmp/campaign.pid)
    for _ in $(seq 1 "${2:-540}"); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && echo "still running" || echo "worker exited"
    tail -c 1500 /tmp/campaign.log; head -c 3000 /tmp/campaign.json
    ;;
finish)
    cd "$S"; export PYTHONPATH=$S:/tmp/gpu-site
    cp /tmp/campaign.json /tmp/campaign.t0 "$O/"; tail -c 200000 /tmp/campaign.log > "$O/campaign.log"
    timeout 120 python3 -m service.cli.main report --db "$DB" --json > "$O/campaign_report.json" 2> "$O/report.err"
    timeout 120 python3 -m service.cli.main report --db "$DB" > "$O/campaign_report.txt" 2>> "$O/report.err"
    timeout 60 python3 benchmarks/gpu/session7/summarise.py /tmp/campaign.db /tmp/campaign.t0 > "$O/summary.json" 2> "$O/summary.err"
    # the cuDNN line: the shared stack (torch's 9.19) and the 9.27 wheel, corpus + every bucket of
    # the two cuDNN backends, then the line's regressions and fixes
    cp /tmp/campaign.db /tmp/cudnn.db
    CDB=sqlite:////tmp/cudnn.db
    timeout 200 python3 -m service.cli.main replay --db "$CDB" --backend torch-sdpa-cudnn --backend te-fused --json \
        > "$O/replay_919.json" 2> "$O/replay_919.err"; echo "replay 9.19 rc $?"
    timeout 60 python3 -m service.cli.main builds prepare --package nvidia-cudnn-cu13 --wheelhouse /tmp/cudnn-wh \
        --version 9.27.0.42 --allow-missing > "$O/prepare_927.txt" 2>&1; echo "prepare rc $?"
    timeout 240 python3 -m service.cli.main builds replay --package nvidia-cudnn-cu13 --wheelhouse /tmp/cudnn-wh \
        --version 9.27.0.42 --allow-missing --db "$CDB" --backend torch-sdpa-cudnn --backend te-fused --json \
        > "$O/replay_927.json" 2> "$O/replay_927.err"; echo "replay 9.27 rc $?"
    timeout 60 python3 -m service.cli.main regressions --db "$CDB" --package cudnn > "$O/regressions_cudnn.txt" 2>&1
    timeout 60 python3 -m service.cli.main regressions --db "$CDB" --package cudnn --json > "$O/regressions_cudnn.json" 2>&1
    tail -c 2500 "$O/regressions_cudnn.txt"
    CUDNN_LIB=$(python3 -c "from fuzzer.environment import resolve_cudnn_choice as r; print(r().directory or '')")
    LD_LIBRARY_PATH=$CUDNN_LIB CUDNN_PATH=$CUDNN_LIB CUDNN_HOME=$CUDNN_LIB FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 \
    FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$HOME/.cache/attnfuzz/fa4-jit \
    timeout "${CHECK_S:-150}" python3 benchmarks/gpu/session7/check_groups.py /tmp/campaign.db "$O/bucket_checks.json" --budget-s "${CHECK_BUDGET:-130}" \
        > "$O/bucket_checks.log" 2>&1
    tail -c 2500 "$O/bucket_checks.log"
    R=${OUT:-/tmp/attnfuzz-out}; mkdir -p "$R"
    gzip -c /tmp/campaign.db > "$R/campaign.db.gz"; gzip -c /tmp/cudnn.db > "$R/cudnn.db.gz"
    tar czf "$R/children_logs.tgz" /tmp/attnfuzz-children-* 2>/dev/null
    tar czf "$R/s7.tgz" -C /tmp s7
    ls -la "$O" "$R"
    ;;
*) echo "usage: run.sh recv N | install | cudnn N | start [S] | wait [S] | finish" >&2; exit 2 ;;
esac
