#!/usr/bin/env bash
# Fourteenth session, one H200: issue 14's own work. The thirteenth session's steps (session13/run.sh:
# recv N, install, start NAME S [PROFILE_S], wait NAME [S], finish NAME [check], which waits for the
# worker to exit) with the results in /tmp/s14 (s14.tgz in $OUT), plus:
#   run.sh bench           benchmarks/compare_host_bench.py on the GPU (host against device judging)
#                          into $SESSION_OUT/compare_host_bench.txt (torch only: runs beside the install)
#   run.sh start NAME S [PROFILE_S]
#                          as session10's, but the staged packages are imported through a path with
#                          "site-packages" in it (/tmp/gpu/site-packages -> /tmp/gpu-site), as a pip
#                          install puts them: Hypothesis reads the constants of every module it takes
#                          for the user's own code (hypothesis.internal.constants_ast), and took TE's,
#                          FA4's and CUTLASS's staged sources for that (about 4% of the worker's samples
#                          in the twelfth session's profile, parsing them)
# Carry .venv/bin/py-spy with recv 8 for a profiled run. What ran: recv 1..8, install, start prof 270 210,
# wait prof 300 (its files were lost: the machine went back before finish); on a new machine recv 1..8,
# install, bench, start main 600, wait main 560, finish main check (FINISH_WAIT_S=110 CHECK_S=90
# CHECK_BUDGET=70). docs/gpu-campaigns.md "Fourteenth session".
set -uo pipefail
export SESSION_OUT=/tmp/s14
case "${1:-}" in
bench)
    mkdir -p "$SESSION_OUT"
    setsid nohup bash -c "PYTHONPATH=$PWD timeout 170 python3 benchmarks/compare_host_bench.py --device cuda --cases 120 \
        > $SESSION_OUT/compare_host_bench.txt 2>&1" < /dev/null > /dev/null 2>&1 &
    echo "bench started"
    ;;
start)
    mkdir -p /tmp/gpu && ln -sfn /tmp/gpu-site /tmp/gpu/site-packages
    GPU_SITE=/tmp/gpu/site-packages exec bash "$(dirname "$0")/../session13/run.sh" "$@"
    ;;
*) exec bash "$(dirname "$0")/../session13/run.sh" "$@" ;;
esac
