#!/usr/bin/env bash
# Fifteenth session, one H200: issue 14's own work with background judging (`fuzz --judge auto`: the
# fuzz cases' outputs judged on the evaluator's judge thread). The fourteenth session's steps
# (session14/run.sh: recv N, install, start NAME S [PROFILE_S], wait NAME [S], finish NAME [check])
# with the results in /tmp/s15 (s15.tgz in $OUT), plus:
#   run.sh profile NAME S [DELAY_S]
#                          py-spy (.venv/bin/py-spy, carried with recv 8) samples the running worker
#                          NAME for S seconds after DELAY_S (default 60), idle samples and threads
#                          included (--idle --threads: the worker's waits for the GPU and the judge
#                          thread apart), raw, into $SESSION_OUT/NAME/pyspy_idle.txt
#   run.sh cuda-tests      the CUDA tests of the evaluator (the judge thread's stream among them) in the
#                          background, into $SESSION_OUT/cuda_tests.txt (torch only: beside the install)
set -uo pipefail
export SESSION_OUT=/tmp/s15
case "${1:-}" in
profile)
    N=$2; mkdir -p "$SESSION_OUT/$N"
    setsid nohup bash -c "sleep ${4:-60}; /tmp/py-spy record --nonblocking --idle --threads -r 100 -d $3 -f raw \
        -o $SESSION_OUT/$N/pyspy_idle.txt --pid $(cat /tmp/$N.pid) > $SESSION_OUT/$N/pyspy.log 2>&1" < /dev/null > /dev/null 2>&1 &
    echo "profile started"
    ;;
cuda-tests)
    mkdir -p "$SESSION_OUT"
    setsid nohup bash -c "PYTHONPATH=$PWD timeout 300 python3 -m pytest -q -o addopts='' -p no:cacheprovider \
        tests/fuzzer/test_evaluate.py > $SESSION_OUT/cuda_tests.txt 2>&1" < /dev/null > /dev/null 2>&1 &
    echo "cuda tests started"
    ;;
start)
    mkdir -p /tmp/gpu && ln -sfn /tmp/gpu-site /tmp/gpu/site-packages
    GPU_SITE=/tmp/gpu/site-packages exec bash "$(dirname "$0")/../session13/run.sh" "$@"
    ;;
*) exec bash "$(dirname "$0")/../session13/run.sh" "$@" ;;
esac
