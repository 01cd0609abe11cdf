#!/usr/bin/env bash
# Twelfth session, one H200: issue 14 after the one-transfer batch judge and the --workers option.
# The tenth session's steps (session10/run.sh: recv N, install, bench, start NAME S [PROFILE_S],
# wait NAME [S], finish NAME [check]) with the results in /tmp/s12 (s12.tgz in $OUT), plus:
#   run.sh tests          the CUDA tests of the comparison, the inputs and the evaluator (after the install)
# Calls back to back: the machine goes back 30 s after a call ends.
set -uo pipefail
export SESSION_OUT=/tmp/s12
case "${1:-}" in
tests)
    . benchmarks/gpu/staging.sh
    mkdir -p "$SESSION_OUT"
    stage_wait_install "$SESSION_OUT"
    PYTHONPATH=$PWD:/tmp/gpu-site timeout 240 python3 -m pytest -q -o addopts="" -p no:cacheprovider \
        tests/oracle/test_compare.py tests/oracle/test_inputs_many.py tests/fuzzer/test_evaluate.py 2>&1 | tail -6 | tee "$SESSION_OUT/cuda_tests.txt"
    ;;
*) exec bash "$(dirname "$0")/../session10/run.sh" "$@" ;;
esac
