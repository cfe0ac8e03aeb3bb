#!/usr/bin/env bash
# Makes the Python environment the side-by-side benchmark's peers run in (torch, deepspeed, numpy).
#
# A benchmark reference only: nothing in zinf's build or tests uses it.
#   make_venv.sh VENV [TORCH_FROM]
# VENV: the folder to make (left alone when it already imports torch, deepspeed and numpy).
# TORCH_FROM: an existing venv whose torch to borrow instead of downloading ~5 GB of PyPI's CUDA
# wheels; VENV then gets a .pth line naming that venv's site-packages and installs only the rest.
set -euo pipefail
venv=$1
torch_from=${2:-}

have() { [[ -x $venv/bin/python ]] && "$venv/bin/python" -c "import $1" 2>/dev/null; }

if have torch && have deepspeed && have numpy; then exit 0; fi
if [[ ! -x $venv/bin/python ]]; then
  echo "make_venv: creating $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip wheel setuptools
fi
if [[ -n $torch_from ]]; then
  site=$("$torch_from/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  own=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$site" > "$own/zinf_bench_borrowed_torch.pth"
  echo "make_venv: borrowing torch from $site" >&2
fi
if ! have torch; then
  echo "make_venv: pip install torch (PyPI's wheel pulls CUDA libraries, ~5 GB)" >&2
  "$venv/bin/pip" install -q torch
fi
have numpy || "$venv/bin/pip" install -q numpy
if ! have deepspeed; then
  # DeepSpeed's setup imports torch, so it builds against the torch installed above; its ops are
  # compiled just in time (ninja, g++) on first use with DS_ACCELERATOR=cpu.
  echo "make_venv: pip install deepspeed" >&2
  DS_ACCELERATOR=cpu DS_BUILD_OPS=0 "$venv/bin/pip" install -q --no-build-isolation deepspeed
fi
