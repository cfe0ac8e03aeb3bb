#!/usr/bin/env bash
# Every command of the README and the user guide runs as written, on small stand-ins: the
# ```sh blocks of README.md and docs/user-guide.md are read (so an example added or changed there
# is run here), and each zinf command runs in order in one folder, with these substitutions that
# keep it small: ~/hf/Llama-3.2-1B is a tiny Llama 3.2 folder (tests/model/data/hf_families/
# llama32_tiny), ~/models/gpt2 and hf_folder the tiny GPT-2 folder (tests/zero3/data/gpt2_tiny/fp32),
# ds_config.json an in-memory ZeRO-3 config with "auto" batch and lr, corpus files small (text of bytes below 61, the tiny
# models' vocabulary), --model gpt2 is tiny, --steps 1000/2000 are 2/4, --seq and --batch[es] fit
# the tiny models. Commands that need what a test machine lacks (a drive to tune, several ranks,
# the build system, a GPU, a placeholder "...") are listed as skipped with the reason; any other command
# that fails, or one this test does not know how to run, fails the test.
set -euo pipefail
zinf=$(realpath "$1") root=$(realpath "$2")
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/doc_commands.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export ZINF_LOG_LEVEL=warning
cd "$tmp"
python3 - <<'PY'
import os, random, struct
r = random.Random(11)
text = "".join(chr(33 + r.randrange(28)) for _ in range(6000))  # bytes 33..60
open("corpus.txt", "w").write(text)
os.makedirs("corpus", exist_ok=True)
open("corpus/a.txt", "w").write(text[:3000])
open("corpus/b.txt", "w").write(text[3000:])
open("train.bin", "wb").write(struct.pack("<3000H", *[r.randrange(61) for _ in range(3000)]))
open("tokens.u32", "wb").write(struct.pack("<3000I", *[r.randrange(61) for _ in range(3000)]))
header = struct.pack("<256i", 20240520, 1, 3000, *([0] * 253))  # an llm.c token file
open("corpus.bin", "wb").write(header + struct.pack("<3000H", *[r.randrange(61) for _ in range(3000)]))
PY
# As Hugging Face's configs are: the batch and learning rate "auto" (the options or the Trainer's
# defaults fill them).
cat > ds_config.json <<'JSON'
{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
 "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
 "zero_optimization": {"stage": 3, "sub_group_size": 100000}}
JSON
python3 - "$root" > commands.txt <<'PY'
import re, sys
root = sys.argv[1]
for doc in ("README.md", "docs/user-guide.md"):
    text = open(f"{root}/{doc}").read()
    for block in re.findall(r"```(?:sh|bash)\n(.*?)```", text, re.S):
        block = re.sub(r"\\\n\s*", " ", block)
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()  # comments
            if line:
                print(f"{doc}\t{line}")
PY
ran=0 skipped=0
while IFS=$'\t' read -r doc cmd; do
  skip=""
  case "$cmd" in
    scripts/setup* | scripts/test* | meson\ * | pkg-config\ *) skip="the build system (run by CI itself)" ;;
    *aio_bench*) skip="tunes a real drive (tests/tools/aio_bench_test.sh runs aio_bench)" ;;
    mpirun\ * | bench/*) skip="several ranks (tests/zero3 multirank tests run mpirun)" ;;
    *"..."*) skip="a placeholder (...)" ;;
    *"--device cuda"*) skip="a GPU and a 7B model (scripts/gpu-check's b_llama7b_resident runs it on one)" ;;
    python3\ -m\ venv* | *pip\ install*) skip="installs the Python package (meson test's python suite tests it; pip needs the network)" ;;
  esac
  if [[ -n $skip ]]; then
    echo "doc_commands: skipped ($skip): $doc: $cmd"
    skipped=$((skipped + 1))
    continue
  fi
  run=$(python3 - "$cmd" "$zinf" "$root" <<'PY'
import re, sys
cmd, zinf, root = sys.argv[1:4]
if not re.match(r"^(build/tools/zinf/zinf|zinf) ", cmd + " "):
    sys.exit(f"doc_commands: does not know how to run: {cmd}")
cmd = re.sub(r"^(build/tools/zinf/zinf|zinf)\b", zinf, cmd)
subs = [
    (r"~/hf/Llama-3\.2-1B", f"{root}/tests/model/data/hf_families/llama32_tiny"),
    (r"~/models/gpt2|\bhf_folder\b", f"{root}/tests/zero3/data/gpt2_tiny/fp32"),
    (r"--model gpt2\b", "--model tiny"), (r"--steps 1000\b", "--steps 2"), (r"--steps 2000\b", "--steps 4"),
    (r"--save-interval 100\b", "--save-interval 1"), (r"--seq (1024|256)\b", "--seq 16"),
    (r"--batch 8\b", "--batch 2"), (r"--batches 20\b", "--batches 1"), (r"\[(--json)\]", r"\1"),
]
for a, b in subs:
    cmd = re.sub(a, b, cmd)
if re.search(r" train\b", cmd) and "--steps" not in cmd:
    cmd += " --steps 2"
print(cmd)
PY
)
  if ! bash -c "$run" > out.txt 2>&1 < /dev/null; then
    echo "doc_commands: FAILED: $doc: $cmd"; echo "  ran: $run"; cat out.txt; exit 1
  fi
  echo "doc_commands: ran: $doc: $cmd"
  ran=$((ran + 1))
done < commands.txt
[[ $ran -ge 15 ]] || { echo "doc_commands: only $ran commands ran"; exit 1; }
echo "doc_commands: $ran commands of README.md and docs/user-guide.md ran, $skipped skipped"
