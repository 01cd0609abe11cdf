#!/usr/bin/env bash
# Fourteenth session, one H200: issue 14's own work. The eleventh session's steps (session11/run.sh:
# recv N, install, tests, start NAME S [PROFILE_S], wait NAME [S], finish NAME [check]) with the
# results in /tmp/s14 (s14.tgz in $OUT); finish waits for the worker to exit first (as session13's).
# Carry .venv/bin/py-spy with each recv for the profiled run (start NAME S PROFILE_S).
# What ran: see docs/gpu-campaigns.md "Fourteenth session".
export SESSION_OUT=/tmp/s14
case "${1:-}" in
finish)
    pid=$(cat "/tmp/$2.pid" 2>/dev/null)
    for _ in $(seq 1 "${FINISH_WAIT_S:-120}"); do [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "worker still running: collecting anyway"
    exec bash "$(dirname "$0")/../session11/run.sh" "$@"
    ;;
*) exec bash "$(dirname "$0")/../session11/run.sh" "$@" ;;
esac
