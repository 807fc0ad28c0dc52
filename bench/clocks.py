"""Small-message times beside the GPUs' clocks, from bench/compare.sh's clocks stage.

    python3 bench/clocks.py OUT_DIR/clocks

Reads gpu-clocks.csv (nvidia-smi samples: timestamp, index, SM MHz, memory MHz, pstate,
utilization %, power W), marks.txt (epoch seconds at the start and end of each nccl-tests
process) and agent.log (each agent progress line with the epoch seconds it was written).
Prints, per nccl-tests process and per agent size line, the time per iteration at the
smallest size beside the median SM clock and pstate of the GPUs while it ran, so the two
small-message states can be set beside the GPU's clock.
"""

import datetime
import os
import re
import statistics
import sys


def samples(path):
    """[(epoch s, gpu index, sm MHz, pstate)] from nvidia-smi's csv."""
    out = []
    with open(path) as f:
        for line in f:
            t = [x.strip() for x in line.split(",")]
            if len(t) < 5:
                continue
            try:
                ts = datetime.datetime.strptime(t[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                out.append((ts, int(t[1]), float(t[2]), t[4]))
            except ValueError:
                continue
    return out


def window(smp, a, b):
    inside = [s for s in smp if a <= s[0] <= b]
    if not inside:
        return "no sample"
    sm = statistics.median(s[2] for s in inside)
    states = sorted({s[3] for s in inside})
    return f"sm {sm:6.0f} MHz (min {min(s[2] for s in inside):.0f}) {'/'.join(states)} {len(inside)} samples"


def nccl_tests_first(path):
    with open(path) as f:
        for line in f:
            t = line.split()
            if len(t) > 6 and t[0].isdigit():
                return f"{int(t[0]):>8} B {float(t[5]):7.2f} us"
    return "no rows"


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "compare-out/clocks"
    smp = samples(os.path.join(d, "gpu-clocks.csv"))
    print(f"{len(smp)} clock samples")
    starts = {}
    with open(os.path.join(d, "marks.txt")) as f:
        for line in f:
            ts, what, coll = line.split()[:3]
            if what == "start":
                starts[coll] = float(ts)
            elif coll in starts:
                first = nccl_tests_first(os.path.join(d, f"nccltests-{coll}.txt"))
                print(f"nccl-tests {coll:>15} {first}  {window(smp, starts[coll], float(ts))}")
    prev = None
    with open(os.path.join(d, "agent.log")) as f:
        for line in f:
            ts, _, text = line.partition(" ")
            try:
                ts = float(ts)
            except ValueError:
                continue
            m = re.search(r"(\w+) +(\d+) +([\d.]+) us", text)
            if m and prev is not None and int(m.group(2)) <= 4096:
                print(f"agent {m.group(1):>15} {int(m.group(2)):>8} B {float(m.group(3)):7.2f} us  "
                      f"{window(smp, prev, ts)}")
            prev = ts


if __name__ == "__main__":
    main()
