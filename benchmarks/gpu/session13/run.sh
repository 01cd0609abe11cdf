#!/usr/bin/env bash
# Thirteenth session, one H200: issue 14 after the spare children, the crash templates fix and the
# judge's bit-identical outputs. The eleventh session's steps (session11/run.sh: recv N, install,
# tests, start NAME S [PROFILE_S], wait NAME [S], finish NAME [check]) with the results in /tmp/s13
# (s13.tgz in $OUT), plus:
#   run.sh early-tests     the CUDA tests of the comparison and the inputs in the background (torch only:
#                          they run beside the install), into $SESSION_OUT/cuda_tests_early.txt
#   run.sh finish NAME [check]  as session10's, after waiting (FINISH_WAIT_S, 120) for the worker to exit
# What ran: recv 1..8, install, early-tests, start main 600, wait main 560, wait main 200, finish main check
# (CHECK_S=200 CHECK_BUDGET=160); on a second machine recv 1..8, install, start short 280, wait short 300,
# finish short check (CHECK_S=150 CHECK_BUDGET=110).
export SESSION_OUT=${SESSION_OUT:-/tmp/s13}  # a later session sets its own (session14/run.sh)
case "${1:-}" in
early-tests)
    mkdir -p "$SESSION_OUT"
    setsid nohup bash -c "PYTHONPATH=$PWD timeout 300 python3 -m pytest -q -o addopts='' -p no:cacheprovider \
        tests/oracle/test_compare.py tests/oracle/test_inputs_many.py > $SESSION_OUT/cuda_tests_early.txt 2>&1" \
        < /dev/null > /dev/null 2>&1 &
    echo "early tests started"
    ;;
finish)
    # the worker runs past its budget (its last shrink, the lanes' drain): collect only once it has exited
    # (the short run of this session was collected while it was still finishing, and lost its fuzz --json)
    pid=$(cat "/tmp/$2.pid" 2>/dev/null)
    for _ in $(seq 1 "${FINISH_WAIT_S:-120}"); do [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "worker still running: collecting anyway"
    exec bash "$(dirname "$0")/../session11/run.sh" "$@"
    ;;
*) exec bash "$(dirname "$0")/../session11/run.sh" "$@" ;;
esac
