"""DeepSpeed ZeRO-3 peer of bench/capacity.sh: one GPT preset trained a few steps with its state on NVMe.

  capacity_deepspeed.py SIZE --config ds.json --steps N [--seq 256] [--zinf-params N]
                        [--rbw GB/s --wbw GB/s] [--timeout 900] [--rss-cap BYTES|none]
Run with the side-by-side benchmark's Python (bench/cpu_side_by_side/make_venv.sh). SIZE is one of
zinf's presets with the built-in corpus's byte vocabulary and --seq positions, as `zinf train
--model SIZE --seq T` makes it, so the parameter count is zinf's (--zinf-params checks it). The
config is capacity.sh's own ds.json: DeepSpeed reads the very file zinf read, NVMe folder included.

Training runs in a child process (this script with --child) on DeepSpeed's CPU accelerator; the
parent samples the child's process tree every 0.25 s for RSS and the swap folder every second for
its size, and prints one row in capacity.sh's columns: params, disk bytes/param (the folder's
peak), peak RSS (the larger of the tree's sampled sum and the kernel's high-water mark of the
largest process), the last step's time, forward, backward and optimizer step, I/O wait (not
separable in DeepSpeed: "-"), bytes the process read and wrote to storage in the last step
(/proc/PID/io), capacity.sh's optimizer-phase I/O efficiency formula, and the losses. A run that
fails (an exception, a signal, the watchdog's timeout or RSS cap) prints a FAILED row with the
reason instead: that is the measurement. The child asks the OOM killer to take it first. Its
output and per-step log lie beside the config: deepspeed-SIZE.log and deepspeed-SIZE.jsonl.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# zinf's presets (src/model/config.cpp kPresets): layers, hidden, heads; max positions = --seq.
PRESETS = {"tiny": (2, 64, 4), "mini": (4, 128, 4), "small": (6, 384, 6), "gpt2": (12, 768, 12),
           "gpt2-medium": (24, 1024, 16), "gpt2-large": (36, 1280, 20), "1.3b": (24, 2048, 16),
           "gpt2-xl": (48, 1600, 25), "2.7b": (32, 2560, 32), "6.7b": (32, 4096, 32), "13b": (40, 5120, 40)}
VOCAB = 256  # zinf's built-in corpus is bytes


def child(a):
    """Trains a.steps steps; one JSON line per event into a.log (flushed: a killed run leaves its steps)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    import torch
    sys.path.insert(0, os.path.join(HERE, "cpu_side_by_side"))
    import gpt  # the side-by-side benchmark's GPT: zinf's architecture in PyTorch
    import peer  # and its DeepSpeed set-up
    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(1234)
    log = open(a.log, "a", buffering=1)
    layers, hidden, heads = PRESETS[a.size]
    t0 = time.perf_counter()
    engine, n = peer.deepspeed_engine(json.load(open(a.config)),
                                      lambda: gpt.Gpt(layers, hidden, heads, seq=a.seq, vocab=VOCAB))
    log.write(json.dumps({"params": n, "init_s": time.perf_counter() - t0}) + "\n")
    batches = gpt.Batches(gpt.load_corpus(), 1, a.seq)
    for step in range(1, a.steps + 1):
        x, y = batches.next()
        io0 = storage_bytes("self")
        t0 = time.perf_counter()
        loss = engine(x, y)
        t1 = time.perf_counter()
        engine.backward(loss)
        t2 = time.perf_counter()
        engine.step()
        t3 = time.perf_counter()
        log.write(json.dumps({"step": step, "loss": loss.item(), "step_s": t3 - t0, "forward_s": t1 - t0,
                              "backward_s": t2 - t1, "optimizer_s": t3 - t2,
                              "io_bytes": storage_bytes("self") - io0}) + "\n")


def storage_bytes(pid):
    """Bytes a process (all its threads) read from and wrote to storage: /proc/PID/io."""
    kv = dict(l.split(": ") for l in open(f"/proc/{pid}/io").read().splitlines())
    return int(kv["read_bytes"]) + int(kv["write_bytes"])


def tree_rss(root):
    """Resident bytes of root and all its descendants, summed (/proc)."""
    kids, rss = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            rss[int(d)] = int(open(f"/proc/{d}/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    total, todo = 0, [root]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo += kids.get(p, [])
    return total


def folder_bytes(path):
    """Apparent size of the files under path, as `du -sb`."""
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(d, f)).st_size
            except OSError:
                pass
    return total


def mem_available():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def watch(a, cmd, err_path, nvme):
    """Runs cmd, sampling it; returns (pid, wait status, rusage, peak tree RSS, peak folder bytes, why stopped)."""
    with open(err_path, "w") as err:
        p = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT, start_new_session=True)
    peak_rss = peak_disk = 0
    stopped, t0, tick = None, time.time(), 0
    try:
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                p.returncode = status  # reaped here, not by Popen
                return p.pid, status, usage, peak_rss, peak_disk, stopped
            peak_rss = max(peak_rss, tree_rss(p.pid))
            if tick % 4 == 0:
                peak_disk = max(peak_disk, folder_bytes(nvme))
            tick += 1
            if not stopped and time.time() - t0 > a.timeout:
                stopped = f"stopped by the watchdog after {a.timeout:.0f} s"
            elif not stopped and peak_rss > a.rss_cap:
                stopped = f"stopped by the watchdog at RSS {peak_rss / 2**30:.1f} GiB > cap {a.rss_cap / 2**30:.1f} GiB"
            if stopped:
                os.killpg(p.pid, signal.SIGKILL)
            time.sleep(0.25)
    finally:
        if p.returncode is None:
            os.killpg(p.pid, signal.SIGKILL)


def oom_killed(pid):
    """The kernel log's line saying the OOM killer took pid, or None (also when dmesg is not readable)."""
    try:
        log = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [l for l in log.splitlines() if f"Killed process {pid} " in l]
    return lines[-1].split("] ", 1)[-1] if lines else None


def why_failed(pid, status, stopped, err_path):
    if stopped:
        how = stopped
    elif os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        oom = oom_killed(pid) if sig == signal.SIGKILL else None
        how = f"killed by {signal.Signals(sig).name}" + (f" (kernel: {oom})" if oom else "")
    else:
        how = f"exit status {os.WEXITSTATUS(status)}"
    lines = [l.strip() for l in open(err_path, errors="replace") if l.strip()]
    errors = [l for l in lines if "Error" in l or "error:" in l or "Exception" in l or "assert" in l.lower()]
    last = (errors or lines or ["(no output)"])[-1]
    return f"{how}; last {'error ' if errors else ''}line: {last[:300]}"


def parent(a):
    cfg = json.load(open(a.config))
    nvme = cfg["zero_optimization"]["offload_param"]["nvme_path"]
    base = os.path.join(os.path.dirname(os.path.abspath(a.config)), f"deepspeed-{a.size}")
    log_path, err_path = base + ".jsonl", base + ".log"
    open(log_path, "w").close()
    cmd = [sys.executable, os.path.abspath(__file__), a.size, "--child", "--log", log_path,
           "--config", a.config, "--steps", str(a.steps), "--seq", str(a.seq)]
    t0 = time.time()
    pid, status, usage, peak_rss, peak_disk, stopped = watch(a, cmd, err_path, nvme)
    elapsed = time.time() - t0
    peak_rss = max(peak_rss, usage.ru_maxrss * 1024)
    events = [json.loads(l) for l in open(log_path) if l.strip()]
    n = next((e["params"] for e in events if "params" in e), 0)
    steps = [e for e in events if "step" in e]
    print(f"{a.label:<10} " if a.label else "", end="")
    code = row(a, n, steps, (pid, status, stopped), elapsed, peak_rss, peak_disk, err_path)
    if n and a.zinf_params:
        same = "the same" if n == a.zinf_params else "DIFFERENT"
        print(f"  ({a.size}: DeepSpeed's model {n:,} parameters, zinf's {a.zinf_params:,}: {same})")
    return code


def row(a, n, steps, end, elapsed, peak_rss, peak_disk, err_path):
    """capacity.sh's row for this run, or a FAILED row with the reason; returns the exit code.
    end: (pid, wait status, why the watchdog stopped it or None)."""
    pid, status, stopped = end
    if status != 0 or stopped or len(steps) < a.steps:
        print(f"{a.size:<12} {n or '-':>14} FAILED after {elapsed:.0f} s, {len(steps)} of {a.steps} steps, "
              f"peak RSS {peak_rss / 2**20:.0f} MiB, swap folder peak {peak_disk / 1e9:.1f} GB: "
              f"{why_failed(pid, status, stopped, err_path)}")
        for st in steps:  # the steps it did finish
            print(f"  step {st['step']}: {st['step_s']:.2f} s (forward {st['forward_s']:.2f}, backward "
                  f"{st['backward_s']:.2f}, optimizer {st['optimizer_s']:.2f}), {st['io_bytes'] / 1e6:.0f} MB "
                  f"read and written, loss {st['loss']:.3f}")
        return 3
    last = steps[-1]
    read, write = n * (12 + 4), n * (12 + 2)  # capacity.sh's optimizer-phase formula
    eff = ((read / (a.rbw * 1e9) + write / (a.wbw * 1e9)) / last["optimizer_s"]) if a.rbw > 0 and a.wbw > 0 \
        else float("nan")
    losses = " ".join(f"{s['loss']:.3f}" for s in steps)
    print(f"{a.size:<12} {n:>14} {peak_disk / n:>10.2f} {peak_rss / 2**20:>12.0f} {last['step_s']:>9.2f} "
          f"{last['forward_s']:>8.2f} {last['backward_s']:>8.2f} {last['optimizer_s']:>8.2f} {'-':>8} "
          f"{last['io_bytes'] / 1e6:>12.0f} {eff:>8.2f} {losses}")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("size", choices=sorted(PRESETS))
    ap.add_argument("--config", required=True, help="capacity.sh's ds.json (ZeRO-3, NVMe offload)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--zinf-params", type=int, default=0, help="zinf's parameter count at this size, to compare")
    ap.add_argument("--rbw", type=float, default=0.0, help="aio_bench's best read GB/s, for the I/O efficiency")
    ap.add_argument("--wbw", type=float, default=0.0, help="aio_bench's best write GB/s")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds before the watchdog stops the run")
    ap.add_argument("--rss-cap", default="",
                    help="bytes of process-tree RSS at which the watchdog stops the run (default: MemAvailable "
                    "at start less 1 GiB, so that the machine's other jobs keep their memory); none: no cap, "
                    "the OOM killer decides (the child asks to be its first choice)")
    ap.add_argument("--label", default="", help="a first column, e.g. deepspeed (capacity.sh --deepspeed)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--log", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
        return 0
    a.rss_cap = float("inf") if a.rss_cap == "none" else int(a.rss_cap) if a.rss_cap else mem_available() - 2**30
    return parent(a)


if __name__ == "__main__":
    sys.exit(main())
