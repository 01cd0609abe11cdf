#!/usr/bin/env bash
# Fifth session, first H200 machine: what TE-on-cuDNN refuses and why (NVTE_DEBUG), FA2 and TE-on-FA2
# for real, the issue-15 hand checks, and a short all-backend run of the code as it was (992da02).
#   diag.sh start   (after gpu_stage install): backends, hand checks, a 150 s fuzz in the background
#   diag.sh finish  waits for the fuzz, writes report, database and the TE debug summary to $OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD:/tmp/gpu-site PYTHONUNBUFFERED=1
O=${OUT:-/tmp/attnfuzz-out}; mkdir -p "$O"
CUDNN_LIB=$(python3 -c "import glob,os,torch; h=glob.glob(os.path.join(os.path.dirname(torch.__file__),'..','nvidia','cudnn','lib')); print(os.path.realpath(h[0]) if h else '')")
case "${1:-}" in
start)
    { echo "torch cudnn dir: $CUDNN_LIB"; ls -la /usr/lib/x86_64-linux-gnu/libcudnn.so* "$CUDNN_LIB" 2>&1; nvidia-smi; } > "$O/env.txt" 2>&1
    timeout 150 python3 -m service.cli.main backends > "$O/backends_default.txt" 2>&1; echo "rc $?" >> "$O/backends_default.txt"
    LD_LIBRARY_PATH=$CUDNN_LIB timeout 150 python3 -m service.cli.main backends > "$O/backends_ld.txt" 2>&1
    rm -f /tmp/diag.db*
    LD_LIBRARY_PATH=$CUDNN_LIB NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2 setsid nohup python3 -m service.cli.main fuzz --device cuda \
        --db sqlite:////tmp/diag.db --time-budget "${2:-150}" --no-shrink --quiet --corpus '' \
        > /tmp/diag_fuzz.log 2>&1 < /dev/null &
    LD_LIBRARY_PATH=$CUDNN_LIB timeout 240 python3 benchmarks/gpu/session5/hand_check.py "$O/hand_check.json" > "$O/hand_check.log" 2>&1
    tail -5 "$O/hand_check.log"; tail -3 /tmp/diag_fuzz.log
    ;;
finish)
    true
    cp /tmp/diag_fuzz.log "$O/"
    LD_LIBRARY_PATH=$CUDNN_LIB python3 -m service.cli.main report --db sqlite:////tmp/diag.db --json > "$O/diag_report.json" 2>&1
    LD_LIBRARY_PATH=$CUDNN_LIB python3 -m service.cli.main report --db sqlite:////tmp/diag.db > "$O/diag_report.txt" 2>&1
    python3 - "$O" <<'PY'
import collections, glob, os, re, sqlite3, sys, json
out = sys.argv[1]
c = sqlite3.connect("/tmp/diag.db")
rows = c.execute("select backend, status, count(*) from results group by backend, status").fetchall()
reasons = collections.Counter()
for b, d in c.execute("select backend, detail from results where status='unsupported'"):
    for part in (d or "").split("; "):
        reasons[(b, re.sub(r"\d+", "N", part)[:160])] += 1
dis = collections.Counter()
for f in glob.glob("/tmp/attnfuzz-children-*/*"):
    for line in open(f, errors="replace"):
        if "Disabling" in line or "No dot product attention backend" in line or "Selected backend" in line:
            dis[(os.path.basename(f), re.sub(r"\d+", "N", line.strip())[-220:])] += 1
json.dump({"status": rows, "top_unsupported": [[*k, n] for k, n in reasons.most_common(60)],
           "te_debug": [[*k, n] for k, n in dis.most_common(80)]}, open(os.path.join(out, "diag_summary.json"), "w"), indent=1)
print(rows)
PY
    gzip -c /tmp/diag.db > "$O/diag.db.gz"
    tar czf "$O/children.tgz" /tmp/attnfuzz-children-* 2>/dev/null
    ls -la "$O"; tail -30 "$O/diag_report.txt"
    ;;
esac
