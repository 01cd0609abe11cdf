#!/usr/bin/env bash
# Nineteenth session, one H200: issue 14's acceptance command again on this session's code (the
# comparison's passes, derandomize=False, inference_mode since the sixteenth session's run). The
# steps of session16/run.sh (recv N, install, start NAME S, wait NAME [S], finish NAME [check]),
# results in /tmp/s19 (s19.tgz in $OUT).
# The fetched parts (56 MB) and the tree passed the 64 MiB a call carries: they were joined and split
# again into 52 MiB parts .gpu-wheels2/qN (split -b 52M -d -a 3 --numeric-suffixes=1: part001..part008,
# the names install sorts), received with "recv2 N" and installed with "install2 N" (the last part's N).
# What ran: recv2 1..7, recv2 8 + install2 8, start main 600, wait main, finish main check.
set -uo pipefail
export SESSION_OUT=/tmp/s19
case "${1:-}" in
recv2)
    python3 ".gpu-wheels2/q$2/gpu_stage.py" receive ".gpu-wheels2/q$2" | tail -1
    ;;
install2)
    cp ".gpu-wheels2/q$2/gpu_stage.py" /tmp/gpu_stage.py
    rm -f /tmp/install.done
    setsid nohup bash -c "python3 /tmp/gpu_stage.py install > /tmp/install.log 2>&1; echo \$? > /tmp/install.done" \
        < /dev/null > /dev/null 2>&1 &
    sleep 2; tail -3 /tmp/install.log
    ;;
start)
    mkdir -p /tmp/gpu && ln -sfn /tmp/gpu-site /tmp/gpu/site-packages
    GPU_SITE=/tmp/gpu/site-packages exec bash "$(dirname "$0")/../session13/run.sh" "$@"
    ;;
*) exec bash "$(dirname "$0")/../session13/run.sh" "$@" ;;
esac
