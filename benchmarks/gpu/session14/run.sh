#!/usr/bin/env bash
# Fourteenth session, one H200: issue 14's own work. The eleventh session's steps (session11/run.sh:
# recv N, install, tests, wait NAME [S], finish NAME [check]) with the results in /tmp/s14 (s14.tgz
# in $OUT), plus:
#   run.sh bench           benchmarks/compare_host_bench.py on the GPU (host against device judging)
#                          into $SESSION_OUT/compare_host_bench.txt (torch only: runs beside the install)
#   run.sh start NAME S [PROFILE_S]
#                          as session10's, but the staged packages are imported through a path with
#                          "site-packages" in it (/tmp/gpu/site-packages -> /tmp/gpu-site), as a pip
#                          install puts them: Hypothesis reads the constants of every module it takes
#                          for the user's own code (hypothesis.internal.constants_ast), and took TE's,
#                          FA4's and CUTLASS's staged sources for that (about 4% of the worker's samples
#                          in the twelfth session's profile, parsing them)
#   run.sh finish NAME [check]  as session10's, after waiting (FINISH_WAIT_S, 120) for the worker to exit
# Carry .venv/bin/py-spy with recv 8 for a profiled run. What ran: docs/gpu-campaigns.md "Fourteenth session".
set -uo pipefail
export SESSION_OUT=/tmp/s14
O=$SESSION_OUT; mkdir -p "$O"
S=/tmp/snap
export PYTHONUNBUFFERED=1
case "${1:-}" in
bench)
    setsid nohup bash -c "PYTHONPATH=$PWD timeout 170 python3 benchmarks/compare_host_bench.py --device cuda --cases 120 \
        > $O/compare_host_bench.txt 2>&1" < /dev/null > /dev/null 2>&1 &
    echo "bench started"
    ;;
start)
    N=$2
    . benchmarks/gpu/staging.sh
    stage_wait_install "$O"
    mkdir -p /tmp/gpu && ln -sfn /tmp/gpu-site /tmp/gpu/site-packages
    if [ ! -d "$S" ]; then cp -r "$PWD" "$S" && rm -rf "$S/.gpu-wheels" "$S/.venv"; fi
    cd "$S"; export PYTHONPATH=$S:/tmp/gpu/site-packages
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
    sleep 15; tail -3 "/tmp/$N.log"; tail -4 "$O/backends.txt"
    kill -0 "$(cat /tmp/$N.pid)" && echo "worker alive"
    ;;
finish)
    pid=$(cat "/tmp/$2.pid" 2>/dev/null)
    for _ in $(seq 1 "${FINISH_WAIT_S:-120}"); do [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "worker still running: collecting anyway"
    exec bash "$(dirname "$0")/../session11/run.sh" "$@"
    ;;
*) exec bash "$(dirname "$0")/../session11/run.sh" "$@" ;;
esac
