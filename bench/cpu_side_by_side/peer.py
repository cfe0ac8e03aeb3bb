"""One peer run of the side-by-side benchmark: PyTorch (fp32 or bf16 autocast) or DeepSpeed ZeRO-3.

  python peer.py MODE --warmup W --steps N [--config ds_config.json]
MODE: torch-fp32, torch-bf16, deepspeed (ZeRO-3 on DeepSpeed's CPU accelerator, --config given).
Prints one JSON line: {"mode", "threads", "params", "step_s": [timed steps]} (warm-up not listed).
"""
import argparse
import json
import os
import socket
import sys
import time

import torch

import gpt

B, T = 8, 256


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_steps(bf16, steps, model, batches, opt_cfg, clip):
    p = opt_cfg["params"]
    opt = torch.optim.AdamW(model.parameters(), lr=p["lr"], betas=tuple(p["betas"]), eps=p["eps"],
                            weight_decay=p["weight_decay"])
    times = []
    for _ in range(steps):
        x, y = batches.next()
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return times, loss.item()


def deepspeed_engine(cfg, make_model=gpt.Gpt):
    """A DeepSpeed engine for cfg on its CPU accelerator, one rank over gloo, around make_model()
    built under zero.Init (so ZeRO-3 partitions and offloads it as it is made).
    Returns (engine, the model's parameter count)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_SIZE", "1"),
                 ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port()))):
        os.environ.setdefault(k, v)
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = make_model()
    n = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine, n


def deepspeed_steps(steps, cfg, batches):
    engine, n = deepspeed_engine(cfg)
    times = []
    for _ in range(steps):
        x, y = batches.next()
        t0 = time.perf_counter()
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - t0)
    return times, loss.item(), n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["torch-fp32", "torch-bf16", "deepspeed"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--config", required=True, help="ds_config.json (optimizer, clipping; ZeRO for deepspeed)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1234)
    cfg = json.load(open(a.config))
    batches = gpt.Batches(gpt.load_corpus(), B, T)
    total = a.warmup + a.steps
    if a.mode == "deepspeed":
        times, loss, n = deepspeed_steps(total, cfg, batches)
    else:
        model = gpt.Gpt()
        n = gpt.num_params(model)
        times, loss = torch_steps(a.mode == "torch-bf16", total, model, batches, cfg["optimizer"],
                                  cfg["gradient_clipping"])
    print(json.dumps({"mode": a.mode, "threads": torch.get_num_threads(), "params": n,
                      "loss": loss, "step_s": times[a.warmup:]}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
