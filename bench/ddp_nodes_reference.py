#!/usr/bin/env python3
"""PyTorch DDP reference for `fabric-agent ddp-nodes`: the same MLP step (LAYERS x
Linear(HIDDEN, HIDDEN), BATCH samples per GPU, bf16 autocast, DDP's default buckets: first
1 MiB, then 25 MiB; forward + backward + bucketed all-reduce, no optimizer step), one
process per node started like torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT;
LOCAL_RANK picks the GPU, default 0). Rank 0 prints
  REF {"world": N, "step_ms": ..., "wall_ms": ...}
where step_ms is GPU event time per step, wall_ms host time per step and comm_alone_ms
the gradient all-reduces alone per step (every parameter's, back to back), each the
slowest rank's. With PROFILE=1, rank 0 then runs one more step under torch.profiler and
prints its GPU timeline (kernels and copies over 0.2 ms, ms from the step's first one)
and the host's CUDA calls that took 0.5 ms or more, to set beside `fabric-agent ddp-nodes --trace`.

Usage: RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. \
       python3 bench/ddp_nodes_reference.py [HIDDEN] [LAYERS] [BATCH] [STEPS] [WARMUP]
"""

import json
import os
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def main():
    defaults = [8192, 8, 4096, 10, 3]
    given = [int(a) for a in sys.argv[1:6]]
    hidden, layers, batch, steps, warmup = given + defaults[len(given):]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", dev))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(hidden, hidden) for _ in range(layers)]).cuda(dev)
    ddp = DDP(model, device_ids=[dev])
    x = torch.randn(batch, hidden, device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = ddp(x)
        y.float().mean().backward()
        ddp.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(steps):
        step()
    end.record()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / steps
    # The gradient all-reduces alone (as the agent's "comm alone"): every parameter's
    # gradient, last layer first, in fp32, back to back.
    grads = [torch.ones_like(p, dtype=torch.float32) for p in reversed(list(model.parameters()))]
    torch.cuda.synchronize()
    dist.barrier()
    c0, c1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    c0.record()
    for _ in range(steps):
        for g in grads:
            dist.all_reduce(g)
    c1.record()
    torch.cuda.synchronize()
    t = torch.tensor([start.elapsed_time(end) / steps, wall, c0.elapsed_time(c1) / steps], device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if os.environ.get("PROFILE") == "1":
        profile_step(step, rank)
    if rank == 0:
        print("REF " + json.dumps({"world": world, "step_ms": round(float(t[0]), 3), "wall_ms": round(float(t[1]), 3),
                                   "comm_alone_ms": round(float(t[2]), 3)}), flush=True)
    dist.destroy_process_group()


def profile_step(step, rank):
    """One step under torch.profiler (every rank, as DDP's collectives need); rank 0 prints
    the GPU timeline."""
    import tempfile
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    if rank != 0:
        return
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name)).get("traceEvents", [])
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    if not gpu:
        print("PROF no GPU events")
        return
    t0 = min(e["ts"] for e in gpu)
    sums = {}
    for e in sorted(gpu, key=lambda e: e["ts"]):
        name, dur = e["name"], e["dur"] / 1e3
        kind = "nccl" if "nccl" in name.lower() else ("copy" if e["cat"] != "kernel" else (
            "gemm" if any(k in name.lower() for k in ("gemm", "cutlass", "xmma", "nvjet", "sm90")) else "elementwise"))
        n, total = sums.get(kind, (0, 0.0))
        sums[kind] = (n + 1, total + dur)
        if dur >= 0.2:
            print(f"PROF stream {e.get('args', {}).get('stream', '?'):>3} {kind:<11} start {(e['ts'] - t0) / 1e3:8.3f} ms"
                  f"  dur {dur:7.3f} ms  {name[:60]}")
    for kind, (n, total) in sums.items():
        print(f"PROF sum {kind:<11} {n:4} x  total {total:8.3f} ms")
    # The host's CUDA calls that held it 0.5 ms or more: where it waited for the GPU.
    for e in sorted(events, key=lambda e: e.get("ts", 0)):
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("dur", 0) >= 500:
            print(f"PROF host {e['name']:<28} start {(e['ts'] - t0) / 1e3:8.3f} ms  dur {e['dur'] / 1e3:7.3f} ms")


if __name__ == "__main__":
    main()
