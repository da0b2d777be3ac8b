#!/usr/bin/env bash
# The GPU check, run where one NVIDIA GPU is lent (nothing installed, no network, 10 minutes a command): installs the
# wheels scripts/gpu_wheels.sh put in .whl/ (this package and py-spy) into a temporary folder, finds what the machine
# has (CUDA, NCCL, NVML, py-spy attach, torch's flight-recorder dump), runs scripts/gpu_check.py's rows with the
# machine's python3 and torch for blackbox and the jobs alike, and prints one table of expected against got, in under
# 8 minutes. Bundles, raw flight-recorder dumps, doctor's JSON and the table go to $OUT when it is set.
#
#   scripts/gpu_wheels.sh                       # here, before: .whl/
#   scripts/gpu_check.sh [ROW...]               # there, from anywhere
#   GPU_PYTHON=/path/python3 GPU_CHECK_WHEELS=.whl GPU_CHECK_ROW_S=55 GPU_CHECK_TOTAL_S=450 scripts/gpu_check.sh
#
# A row the machine cannot run says why (e.g. "no CUDA") and fails the check; the table is printed all the same.
set -u
cd "$(dirname "$0")/.."
if [ -n "${GPU_PYTHON:-}" ]; then PY="$GPU_PYTHON"
elif [ -x /opt/torch/.venv/bin/python3 ]; then PY=/opt/torch/.venv/bin/python3
else PY=python3; fi

say() { echo "gpu_check: $*"; }
fail() { echo "gpu_check: $*" >&2; exit 2; }

command -v "$PY" >/dev/null || fail "no interpreter \`$PY\`: set GPU_PYTHON to a python with torch"
WHL="${GPU_CHECK_WHEELS:-.whl}"
ls "$WHL"/torch_blackbox-*.whl >/dev/null 2>&1 || fail "no $WHL/torch_blackbox-*.whl: run scripts/gpu_wheels.sh first"
SITE=$(mktemp -d "${TMPDIR:-/tmp}/bb-gpu-site-XXXXXX")
trap 'rm -rf "$SITE"' EXIT
if ! "$PY" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --target "$SITE" "$WHL"/*.whl \
    >"$SITE.log" 2>&1; then
  # no pip in that interpreter: a wheel is a zip; its scripts go to bin/ as pip's --target puts them
  say "pip install failed ($(tail -1 "$SITE.log")); unpacking the wheels instead"
  for w in "$WHL"/*.whl; do "$PY" -m zipfile -e "$w" "$SITE" || fail "cannot unpack $w"; done
  mkdir -p "$SITE/bin"
  for d in "$SITE"/*.data/scripts; do [ -d "$d" ] && cp "$d"/* "$SITE/bin/"; done
  chmod +x "$SITE"/bin/* 2>/dev/null
fi
rm -f "$SITE.log"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH"
"$PY" -c 'import blackbox' || fail "\`$PY\` cannot import blackbox from the wheel in $SITE"

# What the machine has: each by an exit code, never by reading output a warning may join.
"$PY" -c 'import torch' >/dev/null 2>&1 || fail "\`$PY\` cannot import torch"
TORCH_V=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null | tail -1)
"$PY" -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 3)' >/dev/null 2>&1 && CUDA=1 || CUDA=0
if [ "$CUDA" = 1 ]; then
  NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null | tail -1)
  "$PY" -c 'import torch.distributed as d,sys; sys.exit(0 if d.is_nccl_available() else 3)' >/dev/null 2>&1 \
    && NCCL=yes || NCCL=no
else NGPU=0; NCCL="n/a"; fi
"$PY" -c 'import pynvml; pynvml.nvmlInit()' >/dev/null 2>&1 && NVML=yes || NVML=no
"$PY" -c 'import sys,torch; c=torch._C._distributed_c10d; sys.exit(0 if hasattr(c, "_dump_fr_trace") or hasattr(c, "_dump_nccl_trace") else 3)' \
  >/dev/null 2>&1 && FR=yes || FR=no
SPY=no
if command -v py-spy >/dev/null; then
  "$PY" -c 'import time; time.sleep(30)' & CHILD=$!
  sleep 1
  timeout 20 py-spy dump --pid "$CHILD" >/dev/null 2>&1 && SPY=yes || SPY="no (attach refused)"
  kill "$CHILD" 2>/dev/null; wait "$CHILD" 2>/dev/null
fi
SMI=no; command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && SMI=yes
say "$PY: torch $TORCH_V; CUDA $( [ "$CUDA" = 1 ] && echo "yes, $NGPU GPU(s)" || echo "no CUDA"); NCCL $NCCL;" \
  "NVML $NVML; nvidia-smi $SMI; py-spy attach $SPY; flight-recorder dump API $FR"
[ "$CUDA" = 1 ] || say "no CUDA: the GPU rows are not run (each says so in the table)"
export GPU_CHECK_CUDA="$CUDA"
# The rows share GPU_CHECK_TOTAL_S (450 s); the outer limit leaves room to stop the last one and print the table.
timeout --signal=TERM --kill-after=15 470 "$PY" scripts/gpu_check.py "$@"
