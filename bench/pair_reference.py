"""PyTorch reference for fabric-agent node-pair: all_reduce and a send/recv exchange of one
message size between the ranks of a torch.distributed NCCL group, timed as nccl-tests and the
agent time them (warm-up, barrier, timed iterations, host time per iteration).

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=192.0.2.10 MASTER_PORT=29500 python3 pair_reference.py BYTES [ITERS]

With G GPUs a node, run G processes a node with LOCAL_RANK=0..G-1 (the GPU each uses) and
GPUS_PER_NODE=G: ranks node * G + LOCAL_RANK, and sendRecv pairs GPU i of one node with GPU i
of the other (rail to rail), as the agent does.

Rank 0 prints `REF {json}` with time_us, algbw and busbw (GB/s) per collective.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    addr = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    per_node = int(os.environ.get("GPUS_PER_NODE", "1"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", init_method=addr, rank=rank, world_size=world,
                            device_id=torch.device("cuda", local))
    n = int(sys.argv[1]) // 4
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    x = torch.ones(n, device="cuda")
    y = torch.empty_like(x)
    peer = (rank + per_node) % world
    res = {}
    for name in ("allReduce", "sendRecv"):
        def op():
            if name == "allReduce":
                dist.all_reduce(x)
            else:
                reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, peer),
                                               dist.P2POp(dist.irecv, y, peer)])
                for r in reqs:
                    r.wait()
        for _ in range(5):
            op()
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(iters):
            op()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t) / iters
        algbw = n * 4 / dt / 1e9
        factor = 2 * (world - 1) / world if name == "allReduce" else 1.0
        res[name] = {"time_us": dt * 1e6, "algbw": algbw, "busbw": algbw * factor}
    if rank == 0:
        print("REF " + json.dumps(res), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
