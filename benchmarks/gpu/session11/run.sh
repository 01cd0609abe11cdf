#!/usr/bin/env bash
# Eleventh session, one H200: issue 14 after per-lane compile budgets and the GPU-time attribution.
# The tenth session's steps (session10/run.sh: recv N, install, bench, start NAME S [PROFILE_S],
# wait NAME [S], finish NAME [check]) with the results in /tmp/s11 (s11.tgz in $OUT), plus:
#   run.sh tests          the CUDA tests of the comparison, the inputs and the evaluator (after the install)
# Calls back to back: the machine goes back 30 s after a call ends. What ran this session:
#   recv 1 .. recv 8 (with install after 8), tests, bench, start prof 150 110, wait prof, finish prof,
#   start main 600, wait main, finish main check; then on a second machine
#   benchmarks/judge_batch_bench.py --stage-max-bytes 8388608 (see docs/gpu-campaigns.md).
set -uo pipefail
export SESSION_OUT=${SESSION_OUT:-/tmp/s11}  # a later session sets its own (session12/run.sh)
case "${1:-}" in
tests)
    . benchmarks/gpu/staging.sh
    mkdir -p "$SESSION_OUT"
    stage_wait_install "$SESSION_OUT"
    PYTHONPATH=$PWD:/tmp/gpu-site timeout 200 python3 -m pytest -q -o addopts="" -p no:cacheprovider \
        tests/oracle/test_compare.py tests/oracle/test_inputs_many.py tests/fuzzer/test_evaluate.py 2>&1 | tail -6 | tee "$SESSION_OUT/cuda_tests.txt"
    ;;
*) exec bash "$(dirname "$0")/../session10/run.sh" "$@" ;;
esac
