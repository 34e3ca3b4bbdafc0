#!/usr/bin/env bash
# rl's GPU paths (--devices cuda: one GPU per rank, NCCL) side by side with the CPU (gloo)
# on the same machine: wall time and final evaluation of short PPO and TD3 runs, and what
# asking for more GPU ranks than there are GPUs says. Run by hand on a machine with an
# NVIDIA GPU and PyTorch with CUDA:  bash bench/bench_gpu.sh OUT_DIR
set -uo pipefail
out=${1:-/tmp/fiberrl-gpu}
mkdir -p "$out"
py=${PYTHON:-python3}
"$py" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.device_count(), 'GPU(s)')"
run() {  # name, then fiberrl train arguments
    local name=$1; shift
    local started=$EPOCHREALTIME
    "$py" -m fiberrl.cli train "$@" --out "$out/$name" --no-progress > "$out/$name.log" 2>&1
    local rc=$?
    local wall=$(awk -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN {print b - a}')
    local last=$(grep -v '^\s*$' "$out/$name.log" | tail -1)
    printf '%-14s rc=%-3s wall=%6.1fs  %s\n' "$name" "$rc" "$wall" "$last"
}
run ppo-cpu   ppo --env CartPole-v1 --ranks 1 --devices cpu  --total-steps 60000 --seed 1
run ppo-cuda  ppo --env CartPole-v1 --ranks 1 --devices cuda --total-steps 60000 --seed 1
run td3-cpu   td3 --env Pendulum-v1 --ranks 1 --devices cpu  --total-steps 8000 --seed 1
run td3-cuda  td3 --env Pendulum-v1 --ranks 1 --devices cuda --total-steps 8000 --seed 1
run ppo-cuda2 ppo --env CartPole-v1 --ranks 2 --devices cuda --total-steps 20000 --seed 1
# what each rank really ran on: its device, its process group's backend, an all-reduce
# on that device, and the GPU memory it allocated (a CUDA run that fell back to the CPU
# would show it here)
cat > "$out/probe.py" <<'PY'
import torch, torch.distributed as dist
from rl.distributed import launch

def probe(ctx):
    x = torch.ones(1 << 20, device=ctx.device) * (ctx.rank + 1)
    dist.all_reduce(x)
    return {"rank": ctx.rank, "device": str(x.device), "backend": dist.get_backend(),
            "sum": float(x[0]), "gpu_bytes": torch.cuda.max_memory_allocated()
            if x.is_cuda else 0}

if __name__ == "__main__":
    print("probe", launch(probe, 1, devices="cuda"))
PY
"$py" "$out/probe.py" 2>&1 | tail -1
