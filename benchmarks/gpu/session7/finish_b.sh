#!/usr/bin/env bash
# Seventh session: the second half of run.sh finish as it ran (one device call after the campaign was
# collected): the cuDNN 9.19 vs 9.27 replays on a copy of the campaign database, the regressions along
# cudnn, and one hand check per root-cause group. Writes straight into $OUT.
cd /tmp/snap; export PYTHONPATH=/tmp/snap:/tmp/gpu-site PYTHONUNBUFFERED=1; O=$OUT; L=$O/finish.log
cp /tmp/campaign.db /tmp/cudnn.db; CDB=sqlite:////tmp/cudnn.db
af() { python3 -m service.cli.main "$@"; }
t=$(date +%s); timeout 150 python3 -m service.cli.main replay --db $CDB --backend torch-sdpa-cudnn --backend te-fused --json > $O/replay_919.json 2>> $L; echo "replay 9.19 rc $? $(( $(date +%s)-t )) s" | tee -a $L
t=$(date +%s); timeout 60 python3 -m service.cli.main builds prepare --package nvidia-cudnn-cu13 --wheelhouse /tmp/cudnn-wh --version 9.27.0.42 --allow-missing >> $L 2>&1; echo "prepare rc $? $(( $(date +%s)-t )) s" | tee -a $L
t=$(date +%s); timeout 170 python3 -m service.cli.main builds replay --package nvidia-cudnn-cu13 --wheelhouse /tmp/cudnn-wh --version 9.27.0.42 --allow-missing --db $CDB --backend torch-sdpa-cudnn --backend te-fused --json > $O/replay_927.json 2>> $L; echo "replay 9.27 rc $? $(( $(date +%s)-t )) s" | tee -a $L
timeout 40 python3 -m service.cli.main regressions --db $CDB --package cudnn > $O/regressions_cudnn.txt 2>&1; echo "regressions rc $?" | tee -a $L
timeout 40 python3 -m service.cli.main regressions --db $CDB --package cudnn --json >> $O/regressions_cudnn.txt 2>&1
gzip -c /tmp/cudnn.db > $O/cudnn.db.gz
tail -c 1500 $O/regressions_cudnn.txt
CUDNN_LIB=$(python3 -c "from fuzzer.environment import resolve_cudnn_choice as r; print(r().directory or '')")
LD_LIBRARY_PATH=$CUDNN_LIB CUDNN_PATH=$CUDNN_LIB CUDNN_HOME=$CUDNN_LIB FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$HOME/.cache/attnfuzz/fa4-jit timeout 110 python3 benchmarks/gpu/session7/check_groups.py /tmp/campaign.db $O/bucket_checks.json --budget-s 90 > $O/bucket_checks.log 2>&1
tail -c 3000 $O/bucket_checks.log; tail -c 1500 $L
