#!/usr/bin/env bash
# The GPU check: what the CPU tests cannot show, on a machine with NVIDIA GPUs, in one go (10 minutes at most).
# 2-rank DDP and FSDP2 on NCCL with a DataLoader hang and a stopped rank, an NCCL watchdog timeout with the flight
# recorder's dump, a real CUDA out-of-memory error with its memory snapshot, and NVML's utilisation in
# `blackbox status`. Prints one table, expected against got; exits 0 only when every row ran and matched.
#
#   scripts/gpu_check.sh                        # from the repository root
#   GPU_PYTHON=/opt/conda/bin/python scripts/gpu_check.sh
#
# blackbox runs from this checkout's .venv (make setup) or BLACKBOX_PYTHON; the jobs run with GPU_PYTHON (default:
# python3 on PATH), which needs a CUDA build of torch. What it cannot run is said, row by row, and fails the check.
set -u
cd "$(dirname "$0")/.."
BB_PY="${BLACKBOX_PYTHON:-.venv/bin/python}"
GPU_PY="${GPU_PYTHON:-python3}"

fail() { echo "gpu_check: $*" >&2; exit 2; }

[ -x "$BB_PY" ] || command -v "$BB_PY" >/dev/null || fail "no blackbox interpreter at \`$BB_PY\`: run \`make setup\` or set BLACKBOX_PYTHON"
"$BB_PY" -c "import blackbox" 2>/dev/null || fail "\`$BB_PY\` cannot import blackbox: run \`make setup\`"
command -v nvidia-smi >/dev/null || fail "nvidia-smi is not on PATH: this machine has no NVIDIA driver (no GPU check without a GPU)"
nvidia-smi -L >/dev/null 2>&1 || fail "nvidia-smi cannot list the GPUs: $(nvidia-smi -L 2>&1 | head -1)"
command -v "$GPU_PY" >/dev/null || fail "no job interpreter \`$GPU_PY\`: set GPU_PYTHON to a python with a CUDA build of torch"
CUDA=$("$GPU_PY" -c 'import torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.device_count(), torch.distributed.is_nccl_available())' 2>&1) \
  || fail "\`$GPU_PY\` cannot import torch: $CUDA"
read -r TORCH_V HAS_CUDA NGPU HAS_NCCL <<<"$CUDA"
[ "$HAS_CUDA" = "True" ] || fail "torch $TORCH_V in \`$GPU_PY\` sees no CUDA device (a CPU build?): set GPU_PYTHON to a python with a CUDA build"
[ "$HAS_NCCL" = "True" ] || fail "torch $TORCH_V in \`$GPU_PY\` has no NCCL: the 2-rank rows need it"
echo "gpu_check: torch $TORCH_V, $NGPU GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); blackbox from $BB_PY"
exec timeout --signal=TERM --kill-after=20 590 "$BB_PY" scripts/gpu_check.py "$GPU_PY" "$NGPU"
