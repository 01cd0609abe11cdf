#!/usr/bin/env bash
# Sixteenth session, one H200: issue 14 with the own work split into measured parts (fuzz --json
# time_s.own_parts), compile failures kept unshrunk and counted as compile time, and a 20% shrink
# margin. The steps of session13/run.sh (recv N, install, start NAME S, wait NAME [S],
# finish NAME [check]) and session15/run.sh (profile NAME S [DELAY_S]), results in /tmp/s16
# (s16.tgz in $OUT), plus:
#   run.sh flex-ab         benchmarks/gpu/flex_dynamic_ab.py in the background (torch only: beside the
#                          staging), into $SESSION_OUT/flex_ab.txt
set -uo pipefail
export SESSION_OUT=/tmp/s16
case "${1:-}" in
flex-ab)
    mkdir -p "$SESSION_OUT"
    setsid nohup bash -c "timeout 500 python3 benchmarks/gpu/flex_dynamic_ab.py > $SESSION_OUT/flex_ab.txt 2>&1" \
        < /dev/null > /dev/null 2>&1 &
    echo "flex A/B started"
    ;;
profile)
    N=$2; mkdir -p "$SESSION_OUT/$N"
    setsid nohup bash -c "sleep ${4:-60}; /tmp/py-spy record --nonblocking --idle --threads -r 100 -d $3 -f raw \
        -o $SESSION_OUT/$N/pyspy_idle.txt --pid $(cat /tmp/$N.pid) > $SESSION_OUT/$N/pyspy.log 2>&1" < /dev/null > /dev/null 2>&1 &
    echo "profile started"
    ;;
start)
    mkdir -p /tmp/gpu && ln -sfn /tmp/gpu-site /tmp/gpu/site-packages
    GPU_SITE=/tmp/gpu/site-packages exec bash "$(dirname "$0")/../session13/run.sh" "$@"
    ;;
*) exec bash "$(dirname "$0")/../session13/run.sh" "$@" ;;
esac
