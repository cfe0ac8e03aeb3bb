#!/usr/bin/env bash
# Two zinf builds on one training config, interleaved: the A/B behind an engine change's claim.
#
#   bench/ab_train.sh BASE_ZINF NEW_ZINF CONFIG [PAIRS] [STEPS] -- TRAIN_ARGS...
#
# Runs `zinf train --config CONFIG --steps STEPS TRAIN_ARGS` with each binary in turn, PAIRS times
# (default 4, 8 steps), the order alternating, and prints per pair and as the median over pairs
# each run's median (steps 2 on) of step_s, forward_s + backward_s, grad_store_s, optimizer_s and
# its peak RSS, then the median of the per-pair ratios new / base. Use a quiet machine; the base
# binary is typically a worktree's build of the commit before the change (docs/measuring.md).
set -euo pipefail
[[ $# -ge 3 ]] || { sed -n 2,9p "$0"; exit 2; }
base=$1 new=$2 cfg=$3
shift 3
pairs=4 steps=8
[[ $# -gt 0 && $1 != -- ]] && { pairs=$1; shift; }
[[ $# -gt 0 && $1 != -- ]] && { steps=$1; shift; }
[[ ${1:-} == -- ]] && shift
[[ $pairs =~ ^[1-9][0-9]*$ && $steps =~ ^[1-9][0-9]*$ ]] ||
  { echo "ab_train: PAIRS ($pairs) and STEPS ($steps) must be positive whole numbers" >&2; exit 2; }
for f in "$base" "$new"; do [[ -x $f ]] || { echo "ab_train: $f is not an executable zinf" >&2; exit 2; }; done
[[ -r $cfg ]] || { echo "ab_train: cannot read the config $cfg" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/ab_train.XXXXXX")
trap 'rm -rf "$work"' EXIT
for ((p = 1; p <= pairs; p++)); do
  order=(base new)
  (( p % 2 == 0 )) && order=(new base)
  for v in "${order[@]}"; do
    z=$base
    [[ $v == new ]] && z=$new
    "$z" train --config "$cfg" --steps "$steps" --json-log "$work/$v.$p.jsonl" "$@" > "$work/$v.$p.out" 2>&1 ||
      { echo "ab_train: the $v run failed:" >&2; tail -5 "$work/$v.$p.out" >&2; exit 1; }
  done
done
python3 - "$work" "$pairs" <<'PY'
import json, statistics as st, sys
work, pairs = sys.argv[1], int(sys.argv[2])
keys = ("step_s", "passes_s", "grad_store_s", "optimizer_s", "peak_rss_bytes")
def run(v, p):
    rows = [json.loads(line) for line in open(f"{work}/{v}.{p}.jsonl")]
    rows = rows[1:] or rows  # the first step warms up
    for r in rows:
        r["passes_s"] = r["forward_s"] + r["backward_s"]
    return {k: (max if k == "peak_rss_bytes" else st.median)([r[k] for r in rows]) for k in keys}
runs = {v: [run(v, p) for p in range(1, pairs + 1)] for v in ("base", "new")}
fmt = lambda r: " ".join(f"{k} {r[k] / 2**20:.0f} MiB" if k == "peak_rss_bytes" else f"{k} {r[k]:.4f}" for k in keys)
for p in range(pairs):
    print(f"pair {p + 1}: base {fmt(runs['base'][p])}\n        new  {fmt(runs['new'][p])}")
for v in ("base", "new"):
    print(f"median {v}: " + fmt({k: st.median([r[k] for r in runs[v]]) for k in keys}))
for k in keys[:4]:
    ratios = [n[k] / b[k] for b, n in zip(runs["base"], runs["new"]) if b[k] > 0]
    if ratios:
        print(f"new / base {k}: {st.median(ratios):.3f} (median of {len(ratios)} pairs; range {min(ratios):.3f}-{max(ratios):.3f})")
PY
