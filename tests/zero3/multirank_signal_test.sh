#!/usr/bin/env bash
# SIGTERM to ONE rank of `mpirun -np 2 zinf train --save` stops every rank after the same step:
# the ranks all-reduce the stop flag at each step boundary (agreed_stop_signal, cmd_train.cpp),
# save one checkpoint together and all exit 143. Done twice, the signal going to rank 1 and then
# to rank 0, then to rank 1 again under mpirun's defaults, each time checking:
#  - each rank's own exit status is 143: each rank runs under sh, which records it, and mpirun is
#    told not to end the other ranks when the first exits non-zero (orte_abort_on_non_zero_status
#    0), so the statuses are the ranks' own (mpirun itself then exits 0). Under mpirun's defaults
#    (the third run) mpirun's own status must be 143: what a user's job script sees;
#  - only the signalled rank acknowledged a signal; rank 0 reports "stopped by SIGTERM after
#    step S of 1000: saved <dir>/global_stepS"; `latest` names global_stepS, whose engine.json
#    records world size 2 and S steps, next to both ranks' state files; nothing temporary is left
#    in the checkpoint folder or in TMPDIR;
#  - the run's steps 1..S, and a 2-rank resume from that checkpoint to step S+4, have the losses
#    of one uninterrupted 2-rank run to step S+4, bit for bit (no scheduler: --steps does not
#    change the math).
# The signal is sent once rank 0 has logged 2 steps of a 1000-step run (minutes), so it lands
# mid-run; no timing is asserted. --comm-timeout 60 turns ranks that disagree (one saving while
# the other trains) into an error instead of a hang; the outer timeout only keeps a broken build
# from hanging the suite. Usage: multirank_signal_test.sh ZINF
set -euo pipefail
zinf=$1
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/multirank_signal.XXXXXX")
mpirun_pid="" run=""
cleanup() {
  if [ -n "$mpirun_pid" ]; then  # a failed check while the job runs: end it and its ranks
    for f in "$run"/pid.*; do [ -s "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true; done
    kill -9 "$mpirun_pid" 2>/dev/null || true
    wait "$mpirun_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
export ZINF_LOG_LEVEL=warning
export TMPDIR=$tmp/scratch
mkdir "$TMPDIR" "$tmp/nvme"
fail() { echo "FAIL: $*"; exit 1; }
mpirun=(timeout -s KILL 300 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2)
own_status=(--mca orte_abort_on_non_zero_status 0)
cat > "$tmp/ds.json" <<JSON
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
 "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}},
 "zero_optimization": {"stage": 3, "sub_group_size": 50000, "reduce_bucket_size": 20000,
   "offload_param": {"device": "nvme", "nvme_path": "$tmp/nvme"},
   "offload_optimizer": {"device": "nvme", "nvme_path": "$tmp/nvme"}}}
JSON
train=("$zinf" train --config "$tmp/ds.json" --model tiny --seed 3 --comm-timeout 60)

# Each rank under sh: its zinf's pid in pid.<rank>, its exit status in rc.<rank>, stderr in err.<rank>.
rank_wrapper='
  dir=$1; shift
  r=${OMPI_COMM_WORLD_RANK:?}
  "$@" 2> "$dir/err.$r" &
  pid=$!
  echo "$pid" > "$dir/pid.$r"
  rc=0
  wait "$pid" || rc=$?
  echo "$rc" > "$dir/rc.$r"
  exit "$rc"'

# same_losses A B FIRST LAST: steps FIRST..LAST of json logs A and B exist and agree bit for bit.
same_losses() {
  python3 - "$@" <<'PY'
import json, sys
a, b, first, last = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def steps(path):
    return {j["step"]: (j["loss"], j["grad_norm"]) for j in map(json.loads, open(path))}
sa, sb = steps(a), steps(b)
want = list(range(first, last + 1))
assert sorted(s for s in sa if first <= s <= last) == want, f"{a}: steps {sorted(sa)}"
bad = [(s, sa[s], sb.get(s)) for s in want if sa[s] != sb.get(s)]
assert not bad, f"{a} differs from {b}: {bad}"
PY
}

declare -A stopped
for case in 1 0 1-default; do
  target=${case%%-*}
  defaults=$([ "$case" = "$target" ] && echo 0 || echo 1)
  run=$tmp/to$case
  mkdir "$run"
  opts=("${own_status[@]}")
  [ "$defaults" -eq 0 ] || opts=()
  "${mpirun[@]}" "${opts[@]}" sh -c "$rank_wrapper" sh "$run" "${train[@]}" --steps 1000 --save "$run/ck" \
    --json-log "$run/sig.jsonl" > "$run/out" 2>&1 &
  mpirun_pid=$!
  until [ -s "$run/pid.$target" ] && [ -f "$run/sig.jsonl" ] && [ "$(wc -l < "$run/sig.jsonl")" -ge 2 ]; do
    kill -0 "$mpirun_pid" 2>/dev/null || { cat "$run/out" "$run"/err.*; fail "the job ended before the signal"; }
    sleep 0.05
  done
  kill -TERM "$(cat "$run/pid.$target")"
  status=0
  wait "$mpirun_pid" || status=$?
  mpirun_pid=""
  show() { tr '\r' '\n' < "$run/out" | grep -v '^step ' | tail -20; tail -n 5 "$run"/err.*; }
  for r in 0 1; do
    if [ "$defaults" -eq 0 ] && [ "$(cat "$run/rc.$r" 2>/dev/null)" != 143 ]; then
      show
      fail "SIGTERM to rank $target: rank $r exited $(cat "$run/rc.$r" 2>/dev/null || echo '(no status)'), not 143"
    fi
    acked=$(grep -c "stopping at the end of this step" "$run/err.$r" || true)
    [ "$acked" -eq $([ "$r" -eq "$target" ] && echo 1 || echo 0) ] || { show; fail "rank $r acknowledged $acked signals"; }
  done
  want=$([ "$defaults" -eq 1 ] && echo 143 || echo 0)
  [ "$status" -eq "$want" ] || { show; fail "SIGTERM to rank $target: mpirun exited $status, not $want"; }
  line=$(tr '\r' '\n' < "$run/out" | grep "stopped by SIGTERM after step") || { show; fail "no 'stopped by' line"; }
  step=$(sed -E 's/.*after step ([0-9]+) of 1000: saved .*/\1/' <<< "$line")
  [[ "$step" =~ ^[0-9]+$ ]] || fail "unexpected line: $line"
  [ "$line" = "stopped by SIGTERM after step $step of 1000: saved $run/ck/global_step$step" ] || fail "line: $line"
  [ "$(cat "$run/ck/latest")" = "global_step$step" ] || fail "latest is $(cat "$run/ck/latest"), stopped after $step"
  python3 - "$run/ck/global_step$step" "$step" <<'PY' || fail "the checkpoint is not the one both ranks stopped at"
import json, os, sys
folder, step = sys.argv[1], int(sys.argv[2])
j = json.load(open(f"{folder}/engine.json"))
assert j["world_size"] == 2 and j["counters"]["steps"] == step, (j["world_size"], j["counters"])
for r in range(2):
    assert os.path.getsize(f"{folder}/rank{r}.state") == j["ranks"][r]["bytes"], r
PY
  if ls -a "$run/ck" | grep -q -e '\.tmp' -e '\.old$'; then fail "temporaries left: $(ls -a "$run/ck")"; fi
  [ -z "$(ls -A "$TMPDIR")" ] || fail "temporary files left in TMPDIR: $(ls -A "$TMPDIR")"
  "${mpirun[@]}" "${train[@]}" --steps $((step + 4)) --resume "$run/ck" --json-log "$run/resumed.jsonl" \
    > "$run/resumed.out" 2>&1 || { cat "$run/resumed.out"; fail "resume from global_step$step"; }
  grep -q "resumed from $run/ck at step $step" "$run/resumed.out" || { cat "$run/resumed.out"; fail "no 'resumed from'"; }
  stopped[$case]=$step
  if [ "$defaults" -eq 0 ]; then
    what="each rank exited 143"
  else
    what="mpirun (defaults) exited 143"
  fi
  echo "SIGTERM to rank $target: both ranks stopped after step $step; $what; one checkpoint," \
    "global_step$step, with both rank files; it resumes"
done

last=0
for s in "${stopped[@]}"; do last=$(( s + 4 > last ? s + 4 : last )); done
"${mpirun[@]}" "${train[@]}" --steps "$last" --json-log "$tmp/ref.jsonl" > "$tmp/ref.out" 2>&1 \
  || { cat "$tmp/ref.out"; fail "the uninterrupted run"; }
for case in 1 0 1-default; do
  s=${stopped[$case]}
  same_losses "$tmp/to$case/sig.jsonl" "$tmp/ref.jsonl" 1 "$s" || fail "SIGTERM to rank ${case}: steps 1-$s"
  same_losses "$tmp/to$case/resumed.jsonl" "$tmp/ref.jsonl" $((s + 1)) $((s + 4)) \
    || fail "SIGTERM to rank ${case}: the resumed steps"
  echo "SIGTERM to rank ${case%%-*}: steps 1-$s and the resumed steps $((s + 1))-$((s + 4)) equal an" \
    "uninterrupted 2-rank run bit for bit"
done
