#!/usr/bin/env bash
# Twelfth session, one H200: issue 14 with the one-transfer batch judge (measured, then reverted).
# The eleventh session's steps (session11/run.sh: recv N, install, tests, bench, start NAME S [PROFILE_S],
# wait NAME [S], finish NAME [check]) with the results in /tmp/s12 (s12.tgz in $OUT).
# What ran: recv 1 .. recv 8 (with py-spy from .gpu-wheels/p8 copied to /tmp/py-spy, install, and the CUDA
# tests and judge_batch_bench.py in the background while the install ran), start main 600 150,
# wait main 585, wait main 150, finish main check (CHECK_S=170 CHECK_BUDGET=140).
export SESSION_OUT=/tmp/s12
exec bash "$(dirname "$0")/../session11/run.sh" "$@"
