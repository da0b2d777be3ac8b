#!/usr/bin/env bash
# The GPU check's luggage (run here, where there is a network): this package's wheel and py-spy's manylinux wheel
# for CPython 3.12 on x86_64, in .whl/ (git-ignored), for scripts/gpu_check.sh on a machine that can install nothing.
# Fails when the two together reach 64 MiB (what one device run may carry).
#
#   scripts/gpu_wheels.sh            # from anywhere; PYTHON=python3.12 to build with another interpreter
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
LIMIT_MIB=64

rm -rf .whl && mkdir -p .whl
"$PY" -m pip wheel --quiet --no-deps --wheel-dir .whl . >/dev/null
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --dest .whl py-spy >/dev/null
ls .whl/torch_blackbox-*.whl >/dev/null 2>&1 || { echo "gpu_wheels: no torch_blackbox wheel was built" >&2; exit 1; }
SPY=$(ls .whl/py_spy-*.whl 2>/dev/null | head -1)
[ -n "$SPY" ] || { echo "gpu_wheels: no py-spy wheel was downloaded" >&2; exit 1; }
case "$SPY" in
  *-py2.py3-none-*manylinux*x86_64*.whl|*-py3-none-*manylinux*x86_64*.whl) ;;
  *) echo "gpu_wheels: $SPY is not a py3-none manylinux x86_64 wheel" >&2; exit 1 ;;
esac
BYTES=$(du -cb .whl/*.whl | tail -1 | cut -f1)
for w in .whl/*.whl; do echo "gpu_wheels: $w $(( $(stat -c %s "$w") / 1024 )) KiB"; done
echo "gpu_wheels: .whl/ holds $(( BYTES / 1024 )) KiB in all (limit ${LIMIT_MIB} MiB)"
[ "$BYTES" -lt $(( LIMIT_MIB * 1024 * 1024 )) ] || { echo "gpu_wheels: over ${LIMIT_MIB} MiB" >&2; exit 1; }
