"""Side-by-side CPU training benchmark: zinf against PyTorch and DeepSpeed ZeRO-3, one run.

Trains zinf's GPT `small` shape (6 layers, 384 hidden, 6 heads, seq 256, byte vocab 256, tied
head, micro-batch 8) in every case below, on the same corpus, optimizer and clipping. zinf and
DeepSpeed read the very same ds_config files. Cases run as separate processes in rounds, each
round in the reverse order of the last (A B C, C B A, ...), so that drift on a shared machine
falls on all of them; every run drops its warm-up steps, and the timed steps of all rounds are
pooled into a median. The matmul roof is measured in every round too.
Run through ../cpu_side_by_side.sh, which makes the Python environment and sets the threads.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
B, T = 8, 256
N_LAYER, C = 6, 384

OPTIMIZER = {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}}


def ds_config(bf16, nvme_path=None, pipelined=True):
    """One ds_config, read by zinf and by DeepSpeed alike; NVMe as zinf's built-in config, with
    16 parameter staging buffers (DeepSpeed's swapper asserts with 5: one buffer per tensor).
    pipelined=False for DeepSpeed: its PipelinedOptimizerSwapper runs out of swap buffers here
    (0.19.8, sub_group_size 1e6, even with offload_optimizer.buffer_count 8)."""
    zero = {"stage": 3, "offload_param": {"device": "none"}, "offload_optimizer": {"device": "none"}}
    cfg = {"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 1,
           "gradient_clipping": 1.0, "steps_per_print": 1000000, "bf16": {"enabled": bf16},
           "optimizer": OPTIMIZER, "zero_optimization": zero}
    if nvme_path:
        zero.update({"sub_group_size": 1000000, "stage3_prefetch_bucket_size": 200000,
                     "stage3_param_persistence_threshold": 10000, "stage3_max_live_parameters": 2000000})
        zero["offload_param"] = {"device": "nvme", "nvme_path": nvme_path, "pin_memory": False,
                                 "buffer_count": 16, "buffer_size": 1000000, "max_in_cpu": 0}
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": nvme_path, "pin_memory": False,
                                     "pipeline_read": pipelined, "pipeline_write": pipelined}
        cfg["aio"] = {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1,
                      "single_submit": False, "overlap_events": True}
    return cfg


# name, framework, precision (of the config), where the state lives, config key. A zinf bf16 run
# takes bf16 inputs in its linear layers where `auto`'s table of CPU families says they are the
# faster products (docs/model.md, "Matrix products"); it logs "matmul: ..." (printed below the
# table). So a zinf case's MFU is taken against the roof of the products it ran
# (compute_precision), the others' against their config's; and all against the best.
# The last zinf case pins the kind `auto` did not choose (PINNED_CASE), to show what it gives.
CASES = [
    ("zinf fp32", "zinf", "fp32", "memory", "mem_fp32"),
    ("zinf bf16", "zinf", "bf16", "memory", "mem_bf16"),
    ("zinf bf16 NVMe", "zinf", "bf16", "nvme", "nvme_zinf"),
    ("zinf bf16, bf16 products", "zinf", "bf16", "memory", "mem_bf16"),
    ("PyTorch fp32", "torch-fp32", "fp32", "memory", "mem_fp32"),
    ("PyTorch bf16 autocast", "torch-bf16", "bf16", "memory", "mem_bf16"),
    ("DeepSpeed ZeRO-3 bf16", "deepspeed", "bf16", "memory", "mem_bf16"),
    ("DeepSpeed ZeRO-3 bf16 NVMe", "deepspeed", "bf16", "nvme", "nvme_ds"),
]
PINNED_CASE = 3


MATMUL_LINES = {}  # zinf case -> its "matmul: ..." start-up line
# zinf cases run with another binary than --zinf: the baseline build (--baseline-zinf).
BASELINE_CASE = "zinf bf16, baseline build"
CASE_BIN = {}
# Environment a case adds: the products `auto` declines, pinned (set by pin_other_products()).
CASE_ENV = {"zinf bf16, bf16 products": {"ZINF_MATMUL": "bf16"}}


def pin_other_products(auto_kind, bf16_missing=None):
    """Where `auto` takes bf16 products, the pinned case runs fp32 ones instead; where this CPU has
    no fast bf16 kernel (bf16_missing: matmul_bench's reason) there is no other kind to pin and the
    case is dropped, saying why."""
    if bf16_missing:
        del CASES[PINNED_CASE]
        print(f"products: no pinned case: bf16 products can't run on this CPU ({bf16_missing})", flush=True)
        return
    if auto_kind != "bf16":
        return
    CASES[PINNED_CASE] = ("zinf bf16, fp32 products",) + CASES[PINNED_CASE][1:]
    CASE_ENV.clear()
    CASE_ENV["zinf bf16, fp32 products"] = {"ZINF_MATMUL": "fp32"}


def run_case(case, a, work, configs, rnd):
    name, fw, _, _, key = case
    tag = f"{fw}-{key}{'-pinned' if name in CASE_ENV else ''}{'-baseline' if name in CASE_BIN else ''}-r{rnd}"
    err_path = os.path.join(work, tag + ".stderr")
    steps = a.warmup + a.steps
    if fw == "zinf":
        log = os.path.join(work, tag + ".jsonl")
        if os.path.exists(log):  # --json-log appends: a kept --workdir must not pool an earlier run's steps
            os.remove(log)
        cmd = [CASE_BIN.get(name, a.zinf), "train", "--model", "small", "--config", configs[key], "--steps", str(steps),
               "--seed", "1234", "--json-log", log]
    else:
        cmd = [sys.executable, os.path.join(HERE, "peer.py"), fw, "--warmup", str(a.warmup),
               "--steps", str(a.steps), "--config", configs[key], "--threads", str(a.threads)]
    if key.startswith("nvme"):  # a fresh swap folder per run
        path = json.load(open(configs[key]))["zero_optimization"]["offload_param"]["nvme_path"]
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
    with open(err_path, "w") as err:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=work,
                           env={**os.environ, **CASE_ENV.get(name, {})})
    if p.returncode != 0:
        lines = [l.strip() for l in open(err_path) if l.strip()]
        return None, f"exit {p.returncode}: {lines[-1] if lines else '?'} (see {err_path})"
    if fw == "zinf":
        for line in open(err_path):
            if "matmul:" in line:
                MATMUL_LINES.setdefault(name, line.strip())
                break
        rows = [json.loads(l) for l in open(log)]
        return [r["step_s"] for r in rows[a.warmup:]], None
    return json.loads(p.stdout.strip().splitlines()[-1])["step_s"], None


def compute_precision(name, prec):
    """The precision of the products a case ran: a zinf case's from its "matmul:" line."""
    line = MATMUL_LINES.get(name, "")
    if "OpenBLAS fp32" in line:
        return "fp32"
    if "oneDNN bf16" in line:
        return "bf16"
    return prec


def run_roof(a):
    cmd = [sys.executable, os.path.join(HERE, "roof.py"), "--threads", str(a.threads)]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    roof = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {}
    roof.update(zinf_matmul_roof(a))
    return roof


def zinf_matmul_roof(a):
    """zinf's own products at large shapes (bench/matmul_bench: N 2048, C 1024, the four GPT layer
    products forward and backward): the best fp32 (OpenBLAS) and bf16 (oneDNN) GFLOP/s. torch's
    bf16 mm is no roof where its CPU bf16 path is slower than oneDNN's (no AMX: 44 GFLOP/s
    against oneDNN's ~155 here). Empty when the build has no matmul_bench (no oneDNN)."""
    if not a.matmul_bench or not os.access(a.matmul_bench, os.X_OK):
        return {}
    p = subprocess.run([a.matmul_bench, "--rows=2048", "--embd=1024", "--rounds=1"], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
    best = {}
    for line in p.stdout.splitlines():
        f = line.split()
        if len(f) == 7 and f[1] in ("forward", "backward"):
            best["zinf_sgemm"] = max(best.get("zinf_sgemm", 0.0), float(f[4]))
            if f[5] != "n/a":  # n/a: no fast bf16 kernel on this CPU
                best["zinf_bf16"] = max(best.get("zinf_bf16", 0.0), float(f[5]))
    return best


def zinf_products(a, rounds=3):
    """The product table `auto` is checked against: bench/matmul_bench at GPT `small`'s own shapes
    (N 2048 = micro-batch 8 x 256, C 384), fp32 and bf16 interleaved. Returns {"rows": {(layer,
    pass): (fp32 GF/s, bf16 GF/s)}, "fp32_ms", "bf16_ms", "auto": kind, "row": auto's table row,
    "known", "bf16_missing": why bf16 can't run (only where it can't)}, or {} without a matmul_bench.
    Where bf16 products can't run, every bf16 figure is None."""
    if not a.matmul_bench or not os.access(a.matmul_bench, os.X_OK):
        return {}
    p = subprocess.run([a.matmul_bench, "--rows=2048", "--embd=384", f"--rounds={rounds}"],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = {"rows": {}}
    for line in p.stdout.splitlines():
        f = line.split()
        if len(f) == 7 and f[1] in ("forward", "backward"):
            out["rows"][(f[0], f[1])] = (float(f[4]), None if f[5] == "n/a" else float(f[5]))
        elif line.startswith("matmul_auto "):
            out["auto"] = f[1].split("=", 1)[1] if f[1].startswith("kind=") else "?"
            out["row"] = line.split('row="', 1)[1].split('"', 1)[0] if 'row="' in line else "?"
            out["known"] = "known=yes" in line
        elif line.startswith("matmul_layer "):
            kv = dict(x.split("=", 1) for x in f[1:])
            out["fp32_ms"] = float(kv["fp32_ms"])
            out["bf16_ms"] = None if kv["bf16_ms"] == "n/a" else float(kv["bf16_ms"])
        elif line.startswith("matmul_bf16 unavailable: "):
            out["bf16_missing"] = line.split(": ", 1)[1]
        elif line.startswith("matmul_bench: "):
            out["cpu"] = line.split("CPU ", 1)[1] if "CPU " in line else "?"
            out["isa"] = line.split("oneDNN ISA ", 1)[1].split(" ", 1)[0] if "oneDNN ISA " in line else "?"
    return out if out["rows"] else {}


def report_products(tables):
    """The product table measured in this run (medians over rounds) and what `auto` chose here."""
    tables = [t for t in tables if t]
    if not tables:
        print("products: no bench/matmul_bench (a build without oneDNN): auto takes fp32 products")
        return
    runs = f"the median over {len(tables)} runs" if len(tables) > 1 else "one run"
    print(f"products: bench/matmul_bench at N 2048, C 384 (GPT small's layers), 3 interleaved rounds each, {runs}; "
          f"CPU {tables[0].get('cpu', '?')}, oneDNN ISA {tables[0].get('isa', '?')}")
    print(f"  {'layer':10} {'pass':8} {'fp32 GF/s':>10} {'bf16 GF/s':>10} {'bf16/fp32':>9}")
    missing = tables[0].get("bf16_missing")
    for key in tables[0]["rows"]:
        f32 = statistics.median(t["rows"][key][0] for t in tables if key in t["rows"])
        if missing:
            print(f"  {key[0]:10} {key[1]:8} {f32:10.1f} {'n/a':>10} {'n/a':>9}")
            continue
        b16 = statistics.median(t["rows"][key][1] for t in tables if key in t["rows"])
        print(f"  {key[0]:10} {key[1]:8} {f32:10.1f} {b16:10.1f} {b16 / f32:9.2f}")
    f32_ms = statistics.median(t["fp32_ms"] for t in tables if "fp32_ms" in t)
    auto, row, known = tables[0].get("auto", "?"), tables[0].get("row", "?"), tables[0].get("known", False)
    if missing:
        print(f"  {'one layer':19} {f32_ms:8.2f} ms {'n/a':>10}")
        verdict = ("agrees: fp32 is the only kind with a fast kernel here" if auto == "fp32"
                   else "DISAGREES: auto chose bf16 products, which can't run here")
        print(f"  bf16 products unavailable: {missing}")
        print(f"  auto chose {auto} products (row \"{row}\"{'' if known else ', CPU not in the table'}): {verdict}")
        return
    b16_ms = statistics.median(t["bf16_ms"] for t in tables if "bf16_ms" in t)
    speedup = f32_ms / b16_ms
    print(f"  {'one layer':19} {f32_ms:8.2f} ms {b16_ms:7.2f} ms {speedup:9.2f}")
    faster = "bf16" if speedup > 1.1 else "fp32" if speedup < 1 / 1.1 else None
    if faster is None:
        verdict = "the two kinds are within 10% here: either is right"
    elif faster == auto:
        verdict = f"agrees: {faster} measured faster"
    else:
        verdict = (f"DISAGREES: {faster} measured {max(speedup, 1 / speedup):.2f}x faster; this CPU needs its "
                   f"row in the table (src/model/matmul.cpp, docs/model.md \"Matrix products\"); "
                   f"ZINF_MATMUL={faster} pins it meanwhile")
    print(f"  auto chose {auto} products (row \"{row}\"{'' if known else ', CPU not in the table'}): {verdict}")


def machine_line(a):
    model, flags = "?", set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name") and model == "?":
            model = line.split(":", 1)[1].strip()
        elif line.startswith("flags") and not flags:
            flags = set(line.split(":", 1)[1].split())
    isa = " ".join(f"{f}={'yes' if f in flags else 'no'}"
                   for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"))
    return (f"machine: {model} | {os.cpu_count()} cores | {isa} | threads {a.threads} (torch, "
            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, OPENBLAS_NUM_THREADS="
            f"{os.environ.get('OPENBLAS_NUM_THREADS')}, ZINF_NUM_THREADS={os.environ.get('ZINF_NUM_THREADS')})")


def flops_per_token(n_params):
    # 6 N for forward + backward of every parameter, plus attention's QK^T and AV products
    # (2 * 2 * T * C per token per layer forward, x3 with backward), counted over the full T x T
    # as PaLM's MFU does: 12 * L * C * T.
    return 6 * n_params + 12 * N_LAYER * C * T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zinf", required=True, help="the zinf binary")
    ap.add_argument("--matmul-bench", default="", help="zinf's bench/matmul_bench, for zinf's own matmul roofs "
                    "(default: next to the zinf binary's build folder)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps at the start of every run")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per run (x rounds in all)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--only", default="", help="comma-separated frameworks: zinf,torch-fp32,torch-bf16,deepspeed")
    ap.add_argument("--baseline-zinf", default="", help="another zinf binary (e.g. the main branch's build) run as "
                    "the case '" + BASELINE_CASE + "' beside 'zinf bf16', interleaved, with their ratio printed")
    ap.add_argument("--workdir", default="", help="keep configs, logs and swap here (default: a temporary folder, removed)")
    a = ap.parse_args()
    if not a.matmul_bench:
        a.matmul_bench = os.path.join(os.path.dirname(os.path.abspath(a.zinf)), "..", "..", "bench", "matmul_bench")
    print(machine_line(a), flush=True)

    work = a.workdir or tempfile.mkdtemp(prefix="zinf_side_by_side.")
    os.makedirs(work, exist_ok=True)
    configs = {}
    for key, cfg in (("mem_fp32", ds_config(False)), ("mem_bf16", ds_config(True)),
                     ("nvme_zinf", ds_config(True, os.path.join(work, "nvme_zinf"))),
                     ("nvme_ds", ds_config(True, os.path.join(work, "nvme_ds"), pipelined=False))):
        configs[key] = os.path.join(work, key + ".json")
        json.dump(cfg, open(configs[key], "w"), indent=1)

    products = [zinf_products(a)]
    pin_other_products(products[0].get("auto"), products[0].get("bf16_missing"))
    if a.baseline_zinf:
        CASE_BIN[BASELINE_CASE] = a.baseline_zinf
        at = next(i for i, c in enumerate(CASES) if c[0] == "zinf bf16") + 1
        CASES.insert(at, (BASELINE_CASE, "zinf", "bf16", "memory", "mem_bf16"))
    cases = [c for c in CASES if not a.only or c[1] in a.only.split(",")]
    unavailable = {}
    if any(c[1] == "deepspeed" for c in cases):
        p = subprocess.run([sys.executable, "-c", "import deepspeed"], capture_output=True, text=True)
        if p.returncode != 0:
            unavailable["deepspeed"] = "cannot import deepspeed: " + (p.stderr.strip().splitlines() or ["?"])[-1]
    samples = {c[0]: [] for c in cases}
    roofs = []
    t_start = time.time()
    for rnd in range(a.rounds):
        order = cases if rnd % 2 == 0 else cases[::-1]
        roofs.append(run_roof(a))
        if rnd > 0:
            products.append(zinf_products(a))
        print(f"round {rnd + 1}/{a.rounds}: roof {json.dumps(roofs[-1])}", flush=True)
        for case in order:
            if case[1] in unavailable or samples[case[0]] is None:
                continue
            t0 = time.time()
            steps, why = run_case(case, a, work, configs, rnd)
            if steps is None:
                print(f"  {case[0]}: FAILED {why}", flush=True)
                samples[case[0]] = None
                if case[1] == "deepspeed":
                    unavailable.setdefault(case[0], why)
                else:
                    unavailable[case[0]] = why
                continue
            samples[case[0]] += steps
            print(f"  {case[0]}: median {statistics.median(steps):.3f} s/step over {len(steps)} "
                  f"({time.time() - t0:.0f} s with start-up and warm-up)", flush=True)
    report(a, cases, samples, roofs, unavailable, time.time() - t_start)
    print()
    report_products(products)
    if not a.workdir:
        shutil.rmtree(work, ignore_errors=True)


def median_roof(roofs, key):
    v = [r[key] for r in roofs if r.get(key)]
    return statistics.median(v) if v else None


def report(a, cases, samples, roofs, unavailable, elapsed):
    n_params = 10844160  # zinf and the PyTorch model agree on it (both print it)
    fpt = flops_per_token(n_params)
    roof = {"fp32": max(filter(None, [median_roof(roofs, "torch_fp32"), median_roof(roofs, "openblas_sgemm"),
                                      median_roof(roofs, "zinf_sgemm")]), default=None),
            "bf16": max(filter(None, [median_roof(roofs, "torch_bf16"), median_roof(roofs, "zinf_bf16")]), default=None)}
    tps = {}
    print()
    print(f"{'case':28} {'precision':9} {'state':7} {'tok/s':>8} {'s/step':>7} {'min-max s/step':>15} {'n':>3} {'MFU':>6}")
    for name, fw, prec, where, _ in cases:
        s = samples.get(name)
        if not s:
            why = unavailable.get(name) or unavailable.get(fw) or "no samples"
            print(f"{name:28} {prec:9} {where:7} unavailable: {why}")
            continue
        med = statistics.median(s)
        tps[name] = B * T / med
        compute = compute_precision(name, prec)
        mfu = tps[name] * fpt / (roof[compute] * 1e9) if roof[compute] else float("nan")
        print(f"{name:28} {prec:9} {where:7} {tps[name]:8.0f} {med:7.3f} {min(s):7.3f}-{max(s):<7.3f} {len(s):3} {mfu:6.3f}")
    print()
    rf = lambda k: f"{roof[k]:.0f}" if roof[k] else "n/a"  # noqa: E731

    def rv(key):  # one source's median; roof.py's small probe (key_n) where the large products were too slow
        v = median_roof(roofs, key)
        probe = next((r[key + "_n"] for r in roofs if r.get(key + "_n")), None)
        return "n/a" if v is None else f"{v:.0f}" if probe is None else f"{v:.1f} at {probe}^3"

    print(f"roof (median of {len(roofs)}; 2048^3 products, and zinf's matmul_bench at N 2048, C 1024): "
          f"fp32 {rf('fp32')} GFLOP/s (max of torch mm {rv('torch_fp32')}, system "
          f"OpenBLAS sgemm {rv('openblas_sgemm')}, zinf sgemm "
          f"{rv('zinf_sgemm')}), bf16 {rf('bf16')} GFLOP/s (max of torch mm "
          f"{rv('torch_bf16')}, zinf oneDNN {rv('zinf_bf16')})")
    print(f"model flops per token: 6 * {n_params} + 12 * {N_LAYER} * {C} * {T} = {fpt / 1e6:.1f} MFLOP; "
          f"MFU = tok/s * that / the roof of the precision of the case's products")
    for name, line in MATMUL_LINES.items():
        print(f"{name}: {line}")

    def ratio(label, num, den, goal):
        if num in tps and den in tps:
            r = tps[num] / tps[den]
            print(f"{label:44} {r:5.2f}x   goal >= {goal:.1f}x: {'met' if r >= goal else 'NOT met'}")
        else:
            print(f"{label:44}   n/a   ({num if num not in tps else den} unavailable)")

    ratio("zinf fp32 / PyTorch fp32 (memory)", "zinf fp32", "PyTorch fp32", 1.0)
    ratio("zinf bf16 / PyTorch bf16 autocast (memory)", "zinf bf16", "PyTorch bf16 autocast", 1.0)
    ratio("zinf bf16 / DeepSpeed ZeRO-3 bf16 (memory)", "zinf bf16", "DeepSpeed ZeRO-3 bf16", 1.0)
    ratio("zinf NVMe / DeepSpeed NVMe (bf16)", "zinf bf16 NVMe", "DeepSpeed ZeRO-3 bf16 NVMe", 1.2)
    if BASELINE_CASE in CASE_BIN:
        ratio("zinf bf16 / the baseline build's", "zinf bf16", BASELINE_CASE, 1.0)
    best = max(filter(None, roof.values()), default=None)
    for name, prec in (("zinf fp32", "fp32"), ("zinf bf16", "bf16"), (BASELINE_CASE, "bf16")):
        compute = compute_precision(name, prec)
        for label, r in ((f"{compute} roof", roof[compute]), ("best roof", best)):
            if name in tps and r:
                m = tps[name] * fpt / (r * 1e9)
                print(f"{'MFU ' + name + ' vs the ' + label:44} {m:5.2f}    goal >= 0.6: {'met' if m >= 0.6 else 'NOT met'}")
    print(f"rounds {a.rounds} x ({a.warmup} warm-up + {a.steps} timed) steps, micro-batch {B} x seq {T}; "
          f"{elapsed / 60:.1f} min")


if __name__ == "__main__":
    main()
