#!/usr/bin/env bash
# Fifth session, second H200 machine: issue 14's acceptance campaign with the default command
# (every available single-GPU backend, empty database, no corpus) and the checks of its buckets.
#   campaign.sh start [SECONDS]   copy the tree to /tmp/snap (device calls replace the working copy),
#                                 `attnfuzz backends`, start the worker in the background
#   campaign.sh wait [SECONDS]    wait until the worker exits (or SECONDS), print the log tail
#   campaign.sh finish            report (text, json), bucket hand checks, database and logs to $OUT
# No environment variable is set by hand: the default command must start on the image as it is.
set -uo pipefail
O=${OUT:-/tmp/attnfuzz-out}; mkdir -p "$O"
S=/tmp/snap
export PYTHONPATH=$S:/tmp/gpu-site PYTHONUNBUFFERED=1
DB=sqlite:////tmp/campaign.db
case "${1:-}" in
start)
    rm -rf "$S" && cp -r "$PWD" "$S" && rm -rf "$S/.gpu-wheels" && cd "$S"
    rm -f /tmp/campaign.db* /tmp/campaign.pid; rm -rf /tmp/attnfuzz-children-*
    timeout 200 python3 -m service.cli.main backends > /tmp/backends.txt 2>&1; echo "rc $?" >> /tmp/backends.txt
    cp /tmp/backends.txt "$O/"
    setsid nohup python3 -m service.cli.main fuzz --device cuda --time-budget "${2:-600}" --corpus '' \
        --shrink-deadline "${SHRINK_DEADLINE:-30}" --db "$DB" --quiet > /tmp/campaign.log 2>&1 < /dev/null &
    echo $! > /tmp/campaign.pid
    sleep 45; tail -5 /tmp/campaign.log; sqlite3 /tmp/campaign.db "select count(*) from results" 2>/dev/null \
        || python3 -c "import sqlite3; print(sqlite3.connect('/tmp/campaign.db').execute('select count(*) from results').fetchone())"
    kill -0 "$(cat /tmp/campaign.pid)" && echo "worker alive"
    ;;
wait)
    pid=$(cat /tmp/campaign.pid)
    for _ in $(seq 1 "${2:-540}"); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && echo "still running" || echo "worker exited"
    tail -c 3000 /tmp/campaign.log
    ;;
finish)
    cd "$S"
    cp /tmp/campaign.log "$O/"
    timeout 120 python3 -m service.cli.main report --db "$DB" --json > "$O/campaign_report.json" 2> "$O/report.err"
    timeout 120 python3 -m service.cli.main report --db "$DB" > "$O/campaign_report.txt" 2>> "$O/report.err"
    timeout "${CHECK_S:-150}" python3 benchmarks/gpu/session5/check_buckets.py /tmp/campaign.db "$O/bucket_checks.json" > "$O/bucket_checks.log" 2>&1
    gzip -c /tmp/campaign.db > "$O/campaign.db.gz"
    tar czf "$O/children.tgz" /tmp/attnfuzz-children-* 2>/dev/null
    ls -la "$O"; tail -c 4000 "$O/campaign_report.txt"
    ;;
*) echo "usage: campaign.sh start [S] | wait [S] | finish" >&2; exit 2 ;;
esac
