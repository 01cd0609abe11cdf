#!/usr/bin/env bash
# Thirteenth session, one H200: issue 14 after the spare children, the crash templates fix and the
# judge's bit-identical outputs. The eleventh session's steps (session11/run.sh: recv N, install,
# tests, start NAME S [PROFILE_S], wait NAME [S], finish NAME [check]) with the results in /tmp/s13
# (s13.tgz in $OUT), plus:
#   run.sh early-tests     the CUDA tests of the comparison and the inputs in the background (torch only:
#                          they run beside the install), into $SESSION_OUT/cuda_tests_early.txt
export SESSION_OUT=/tmp/s13
case "${1:-}" in
early-tests)
    mkdir -p "$SESSION_OUT"
    setsid nohup bash -c "PYTHONPATH=$PWD timeout 300 python3 -m pytest -q -o addopts='' -p no:cacheprovider \
        tests/oracle/test_compare.py tests/oracle/test_inputs_many.py > $SESSION_OUT/cuda_tests_early.txt 2>&1" \
        < /dev/null > /dev/null 2>&1 &
    echo "early tests started"
    ;;
*) exec bash "$(dirname "$0")/../session11/run.sh" "$@" ;;
esac
