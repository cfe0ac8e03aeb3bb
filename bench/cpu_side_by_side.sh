#!/usr/bin/env bash
# Side-by-side CPU training benchmark: zinf vs PyTorch and DeepSpeed ZeRO-3 on the same GPT shape.
#
#   bench/cpu_side_by_side.sh [driver options: --rounds R --warmup W --steps N --only ... --workdir D]
# Environment:
#   ZINF_BIN          the zinf binary (default: build/tools/zinf/zinf of this checkout)
#   ZINF_BENCH_VENV   the Python environment for the peers (default: ~/.cache/zinf-bench-venv);
#                     made with python3 -m venv + pip install torch deepspeed numpy when missing
#   ZINF_BENCH_TORCH_FROM  an existing venv whose torch to borrow when making the environment
#                     (saves PyPI's ~5 GB CUDA wheels), e.g. /work/venv-llama
#   THREADS           threads for every framework (default: nproc)
# A benchmark reference, never a build or test dependency. See docs/benchmarks.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
zinf=${ZINF_BIN:-$root/build/tools/zinf/zinf}
venv=${ZINF_BENCH_VENV:-$HOME/.cache/zinf-bench-venv}
threads=${THREADS:-$(nproc)}

if [[ ! -x $zinf ]]; then
  echo "cpu_side_by_side: no zinf binary at $zinf (meson setup build --buildtype=release && meson compile -C build)" >&2
  exit 1
fi
"$here/cpu_side_by_side/make_venv.sh" "$venv" "${ZINF_BENCH_TORCH_FROM:-}"

export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
export ZINF_NUM_THREADS=$threads DS_ACCELERATOR=cpu
export PYTHONWARNINGS=ignore
exec "$venv/bin/python" "$here/cpu_side_by_side/driver.py" --zinf "$zinf" --threads "$threads" "$@"
