#!/usr/bin/env bash
# Runs the Python side-by-side benchmarks: zinf.aio.Handle vs DeepNVMe (and aio_bench) at two
# points, the worker-placement check, and zinf.save_file/load_file vs safetensors and torch.save.
#
#   bench/python/run.sh [--dir FOLDER]
# Environment:
#   ZINF_BENCH_PY_VENV  the peers' Python environment (default ~/.cache/zinf-py-bench-venv):
#                       made with python3 -m venv + pip install torch deepspeed safetensors numpy
#                       when missing (PyPI; a benchmark environment only, never a build or test
#                       dependency). ZINF_BENCH_TORCH_FROM: a venv whose torch/deepspeed to borrow.
#   ZINF_BUILD          the build folder holding python/zinf and tools/aio_bench (default build)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${ZINF_BENCH_PY_VENV:-$HOME/.cache/zinf-py-bench-venv}
build=${ZINF_BUILD:-$root/build}
dir_args=()
if [[ ${1:-} == --dir ]]; then dir_args=(--dir "$2"); fi

have() { [[ -x $venv/bin/python ]] && "$venv/bin/python" -c "import $1" 2>/dev/null; }
if ! have torch || ! have deepspeed || ! have safetensors; then
  [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
  if [[ -n ${ZINF_BENCH_TORCH_FROM:-} ]]; then
    site=$("$ZINF_BENCH_TORCH_FROM/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    own=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$site" > "$own/zinf_bench_borrowed.pth"
  fi
  have torch || "$venv/bin/pip" install -q torch numpy
  have deepspeed || DS_ACCELERATOR=cpu DS_BUILD_OPS=0 "$venv/bin/pip" install -q --no-build-isolation deepspeed
  have safetensors || "$venv/bin/pip" install -q safetensors
fi
# The build tree's package: its extension is built for the same CPython minor version.
export PYTHONPATH=$build/python DS_ACCELERATOR=cpu ZINF_LOG_LEVEL=warning
"$venv/bin/python" "$here/aio_side_by_side.py" "${dir_args[@]}" --aio-bench "$build/tools/aio_bench/aio_bench"
# ds_config.json's "aio" defaults (one worker, qd 8), where the worker's core matters most.
"$venv/bin/python" "$here/aio_side_by_side.py" "${dir_args[@]}" --aio-bench "$build/tools/aio_bench/aio_bench" \
  --queue-depth 8 --parallelism 1
"$venv/bin/python" "$here/aio_placement.py" "${dir_args[@]}"
"$venv/bin/python" "$here/tensor_file_side_by_side.py" "${dir_args[@]}"
