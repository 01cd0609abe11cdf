# Staging steps shared by the session scripts (benchmarks/gpu/session*/run.sh), sourced from
# the project root on the GPU host. The parts come from `python3 ../shared/gpu/gpu_stage.py fetch
# --dest .gpu-wheels` on the working machine, one device call per part carrying .gpu-wheels/pN.
#   stage_recv N          receive part N
#   stage_install [N]     start `gpu_stage.py install` in the background (/tmp/install.log,
#                         its exit code in /tmp/install.done), with the gpu_stage.py of part N (8)
#   stage_wait_install D  wait (at most 400 s) for the install; its log tail to D/install_tail.txt
stage_recv() {
    python3 ".gpu-wheels/p$1/gpu_stage.py" receive ".gpu-wheels/p$1" | tail -2
}
stage_install() {
    cp ".gpu-wheels/p${1:-8}/gpu_stage.py" /tmp/gpu_stage.py
    rm -f /tmp/install.done
    setsid nohup bash -c "python3 /tmp/gpu_stage.py install > /tmp/install.log 2>&1; echo \$? > /tmp/install.done" \
        < /dev/null > /dev/null 2>&1 &
    sleep 2; tail -3 /tmp/install.log
}
stage_wait_install() {
    for _ in $(seq 1 400); do [ -f /tmp/install.done ] && break; sleep 1; done
    echo "install rc $(cat /tmp/install.done 2>/dev/null || echo 'not done')"; tail -3 /tmp/install.log
    cp /tmp/install.log "$1/install_tail.txt"
}
