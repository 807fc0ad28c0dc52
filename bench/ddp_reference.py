#!/usr/bin/env python3
"""PyTorch DDP reference for the DDP scaling probe of fabric-agent.

MLP of 8 x Linear(8192, 8192), batch 4096 per GPU, bf16 autocast, DDP with its default
buckets (first 1 MiB, then 25 MiB), one process per GPU (torch.multiprocessing), weak
scaling over 1, 2, 4, ... GPUs. A step is forward + backward + DDP's bucketed gradient
all-reduce (no optimizer step: the probe measures the same). Prints one line per GPU count
and a final JSON line:
  {"points": [{"gpus": 1, "step_ms": ..., "samples_per_s": ..., "efficiency": 1.0}, ...]}

With --trace, each GPU count then profiles one more step (torch.profiler, CUDA activity)
and rank 0 prints its GPU timeline: every kernel and copy with stream, start and duration
from the step's first GPU operation, then the time per kind (GEMM, NCCL, elementwise, ...),
to compare with `FABRIC_DDP_TRACE=1 fabric-agent node-check`.

Usage: python3 bench/ddp_reference.py [--counts 1,2,4] [--steps 10] [--warmup 3] [--trace]
"""

import argparse
import json
import os
import socket
import tempfile
import time

# Never use NVLink multicast (NVLS) on shared hosts.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, args, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    torch.manual_seed(0)
    h, layers, batch = args.hidden, args.layers, args.batch
    model = nn.Sequential(*[nn.Linear(h, h) for _ in range(layers)]).cuda(rank)
    ddp = DDP(model, device_ids=[rank])
    x = torch.randn(batch, h, device=rank)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = ddp(x)
        loss = y.float().mean()
        loss.backward()
        ddp.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(args.steps):
        step()
    end.record()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3 / args.steps
    ev_ms = start.elapsed_time(end) / args.steps
    t = torch.tensor([ev_ms, wall_ms], device=rank)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        queue.put((float(t[0]), float(t[1])))
    if args.trace:
        trace_step(step, rank, world)
    dist.destroy_process_group()


def kind_of(name):
    n = name.lower()
    if "nccl" in n:
        return "nccl"
    if "gemm" in n or "nvjet" in n or "cutlass" in n or "xmma" in n:
        return "gemm"
    if "memcpy" in n or "memset" in n:
        return n.split()[0] if " " in n else n
    if "reduce" in n:
        return "reduce"
    return "elementwise"


def trace_step(step, rank, world):
    """Profiles one step after one warm-up step; rank 0 prints the GPU timeline."""
    from torch.profiler import ProfilerActivity, profile, schedule

    path = os.path.join(tempfile.mkdtemp(), f"trace{rank}.json")
    with profile(
        activities=[ProfilerActivity.CUDA],
        schedule=schedule(wait=0, warmup=1, active=1),
        on_trace_ready=lambda p: p.export_chrome_trace(path),
    ) as prof:
        for _ in range(2):
            step()
            prof.step()
    torch.cuda.synchronize()
    dist.barrier()
    if rank != 0:
        return
    with open(path) as f:
        events = json.load(f).get("traceEvents", [])
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    if not gpu:
        print(f"torch trace {world} GPU(s): no GPU events", flush=True)
        return
    gpu.sort(key=lambda e: e["ts"])
    t0 = gpu[0]["ts"]
    sums = {}
    for e in gpu:
        kind = kind_of(e["name"])
        stream = "comm" if kind == "nccl" else f"s{e.get('args', {}).get('stream', '?')}"
        print(
            f"torch trace {world} GPU(s) gpu0: {stream:<7} {e['name'][:90]:<90} "
            f"start {(e['ts'] - t0) / 1e3:8.3f} ms  dur {e['dur'] / 1e3:7.3f} ms",
            flush=True,
        )
        n, total = sums.get(kind, (0, 0.0))
        sums[kind] = (n + 1, total + e["dur"] / 1e3)
    end = max(e["ts"] + e["dur"] for e in gpu)
    print(f"torch trace {world} GPU(s) gpu0: span {(end - t0) / 1e3:.3f} ms", flush=True)
    for kind, (n, total) in sums.items():
        print(f"torch trace {world} GPU(s) gpu0: sum {kind:<14} {n:3} x  total {total:7.3f} ms", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--counts", default=None, help="GPU counts, e.g. 1,2,4 (default 1,2,4,...,all)")
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--trace", action="store_true", help="print rank 0's GPU timeline of one profiled step")
    args = p.parse_args()
    n = torch.cuda.device_count()
    if n == 0:
        print("skipped: no GPU")
        return
    if args.counts:
        counts = [int(c) for c in args.counts.split(",") if 0 < int(c) <= n]
    else:
        counts, c = [], 1
        while c < n:
            counts.append(c)
            c *= 2
        counts.append(n)
    flops = 2.0 * args.batch * args.hidden * args.hidden * (3 * args.layers - 1)
    points = []
    ctx = mp.get_context("spawn")
    for world in counts:
        queue = ctx.Queue()
        mp.spawn(worker, args=(world, free_port(), args, queue), nprocs=world, join=True)
        ev_ms, wall_ms = queue.get()
        sps = world * args.batch / (ev_ms / 1e3)
        base = points[0]["samples_per_s"] / points[0]["gpus"] if points else sps / world
        eff = sps / world / base
        point = {
            "gpus": world,
            "step_ms": round(ev_ms, 3),
            "wall_step_ms": round(wall_ms, 3),
            "samples_per_s": round(sps, 1),
            "efficiency": round(eff, 4),
            "tflops_per_gpu": round(flops / (ev_ms / 1e3) / 1e12, 1),
        }
        points.append(point)
        print(
            f"pytorch ddp {world} GPU(s): step {ev_ms:.2f} ms, {sps:.0f} samples/s, "
            f"efficiency {eff * 100:.1f}%, {point['tflops_per_gpu']} TFLOP/s per GPU",
            flush=True,
        )
    print(json.dumps({"torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())), "points": points}))


if __name__ == "__main__":
    main()
