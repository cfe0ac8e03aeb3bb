#!/usr/bin/env bash
# Disk, like memory, through `zinf train`: --save-keep keeps the newest step checkpoints; a save
# that fails (a file-size limit stands in for a full disk: fallocate and write then fail with
# EFBIG as they would with ENOSPC) leaves no <tag>.tmp and `latest` resumable; a run that fails
# leaves no swap files behind.
set -euo pipefail
zinf=$1
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/disk_cli.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export ZINF_LOG_LEVEL=warning
fail() { echo "FAIL: $*"; exit 1; }
config() {  # $1: offload device of both tiers (cpu or nvme)
  local op='{"device": "none"}'
  if [ "$1" = nvme ]; then op='{"device": "nvme", "nvme_path": "'$tmp/nvme'"}'; fi
  cat <<JSON
{"train_batch_size": 4, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
 "zero_optimization": {"stage": 3, "sub_group_size": 50000, "offload_param": $op,
   "offload_optimizer": {"device": "$1", "nvme_path": "$tmp/nvme"}}}
JSON
}
config cpu > "$tmp/cpu.json"
config nvme > "$tmp/nvme.json"
mkdir -p "$tmp/nvme"

# --save-keep 2 over five saves: the newest two stay, `latest` names the last.
"$zinf" train --config "$tmp/cpu.json" --model tiny --steps 5 --save "$tmp/ck" --save-interval 1 --save-keep 2 \
  > "$tmp/out1" 2>&1 || { cat "$tmp/out1"; fail "the --save-keep run failed"; }
left=$(cd "$tmp/ck" && ls -d global_step* | sort | tr '\n' ' ')
[ "$left" = "global_step4 global_step5 " ] || fail "--save-keep 2 left: $left"
[ "$(cat "$tmp/ck/latest")" = global_step5 ] || fail "latest: $(cat "$tmp/ck/latest")"
echo "--save-keep 2: $left"

# A save that cannot be written: the run fails, no temporary is left, `latest` still resumes.
size=$(stat -c %s "$tmp/ck/global_step5/rank0.state")
limit_kib=$(( size / 2048 ))  # half the rank file
if ( trap '' XFSZ; ulimit -f "$limit_kib"; exec "$zinf" train --config "$tmp/cpu.json" --resume "$tmp/ck" --steps 6 \
       --save "$tmp/ck" ) > "$tmp/out2" 2>&1; then
  cat "$tmp/out2"; fail "a save past the file-size limit did not fail"
fi
grep -q "zinf train: " "$tmp/out2" || { cat "$tmp/out2"; fail "no error message"; }
if ls -a "$tmp/ck" | grep -q -e '\.tmp' -e '\.old$'; then ls -a "$tmp/ck"; fail "a failed save left a temporary"; fi
[ "$(cat "$tmp/ck/latest")" = global_step5 ] || fail "latest changed to $(cat "$tmp/ck/latest")"
echo "failed save: $(grep -m1 'zinf train: ' "$tmp/out2")"
"$zinf" train --config "$tmp/cpu.json" --resume "$tmp/ck" --steps 6 --save "$tmp/ck" --save-keep 2 > "$tmp/out3" 2>&1 \
  || { cat "$tmp/out3"; fail "resume after the failed save failed"; }
[ "$(cat "$tmp/ck/latest")" = global_step6 ] || fail "latest after the resume: $(cat "$tmp/ck/latest")"

# A run whose swap files cannot be made (the limit again) fails and leaves none behind.
if ( trap '' XFSZ; ulimit -f 64; exec "$zinf" train --config "$tmp/nvme.json" --model tiny --steps 2 ) \
     > "$tmp/out4" 2>&1; then
  cat "$tmp/out4"; fail "a run past the file-size limit did not fail"
fi
echo "failed run: $(grep -m1 'zinf train: ' "$tmp/out4")"
if find "$tmp/nvme" -name '*.swp' | grep -q .; then find "$tmp/nvme" -ls; fail "a failed run left swap files"; fi
# And a run that succeeds does not keep them either (they are scratch).
"$zinf" train --config "$tmp/nvme.json" --model tiny --steps 2 > "$tmp/out5" 2>&1 || { cat "$tmp/out5"; fail "nvme run"; }
if find "$tmp/nvme" -name '*.swp' | grep -q .; then find "$tmp/nvme" -ls; fail "a finished run left swap files"; fi
echo "swap files removed after a failed and a finished run"
