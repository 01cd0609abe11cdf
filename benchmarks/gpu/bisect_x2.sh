#!/usr/bin/env bash
# The flash-attn-4 bisection and the corpus replay on every build, on GPU 1 (the part of
# session_x2.sh's job C that a fix re-ran). Builds prepared by session_x2.sh in /tmp/attnfuzz-builds.
set -uo pipefail
export PYTHONPATH=$PWD:/tmp/gpu-site PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-1}
W=/tmp/attnfuzz-x2; BUILDS=/tmp/attnfuzz-builds; DB=sqlite:///$W/builds2.db
echo "== bisect $(date +%T)"
python3 -m service.cli.main bisect corpus/fa4/te_style-a3de6cbca071279e.json --package flash-attn-4 \
    --good 4.0.0b11 --bad 4.0.0b36 --builds-dir $BUILDS --db $DB --device cuda --case-timeout 420 \
    --no-reuse --json > $W/bisect2.json 2> $W/bisect2.err
echo "bisect exit $?"; head -c 4000 $W/bisect2.json; echo
echo "== matrix $(date +%T)"
python3 -m service.cli.main builds replay --package flash-attn-4 --builds-dir $BUILDS --backend fa4 \
    --corpus corpus --no-db-cases --db $DB --device cuda --case-timeout 420 --jobs 8 \
    --json > $W/matrix2.json 2> $W/matrix2.err
echo "matrix exit $?"; tail -n 5 $W/matrix2.err
python3 -m service.cli.main regressions --package flash-attn-4 --db $DB --json > $W/regressions2.json 2>&1
python3 -m service.cli.main regressions --package flash-attn-4 --db $DB > $W/regressions2.txt 2>&1
cat $W/regressions2.txt | head -60
echo "== done $(date +%T)"
