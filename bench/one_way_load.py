"""A copy load in one direction between two GPUs: --src copies into --dst back to back
for --seconds, on two streams of the source GPU, so the source's sending ports and the
destination's receiving ports carry it and nothing else of the node does. Used by
bench/compare.sh faults: the agent's pair matrix beside it should name the source GPU's
sending side and the destination GPU's receiving side.
"""

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", type=int, required=True)
    ap.add_argument("--dst", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--mib", type=int, default=256)
    args = ap.parse_args()
    n = args.mib << 20
    src = torch.empty(n, dtype=torch.uint8, device=f"cuda:{args.src}").random_(0, 255)
    dst = [torch.empty(n, dtype=torch.uint8, device=f"cuda:{args.dst}") for _ in range(2)]
    streams = [torch.cuda.Stream(device=args.src) for _ in range(2)]
    end = time.monotonic() + args.seconds
    moved, t0, last = 0, time.monotonic(), time.monotonic()
    while time.monotonic() < end:
        for s, d in zip(streams, dst):
            with torch.cuda.stream(s):
                for _ in range(4):
                    d.copy_(src, non_blocking=True)
                    moved += n
        for s in streams:
            s.synchronize()
        if time.monotonic() - last > 5:
            last = time.monotonic()
            print(f"load {args.src} -> {args.dst}: {moved / (last - t0) / 1e9:.1f} GB/s", flush=True)
    print(f"load done: {moved / (time.monotonic() - t0) / 1e9:.1f} GB/s", flush=True)


if __name__ == "__main__":
    main()
