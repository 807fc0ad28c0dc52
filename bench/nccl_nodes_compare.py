"""The multi-node NCCL sweep beside nccl-tests: reads what bench/nccl-nodes-compare.sh left in
OUT (the agent's rank-0 documents agent-rR-rank0.json, nccl-tests' logs
nccl-tests-rR-nK-COLL.log) and prints, per node count and collective, at each size from LARGE
up: the agent's busbw per round and its median, nccl-tests' median and its own spread
(min..max over the rounds), the ratio of the medians, and whether the agent's median lies
within nccl-tests' spread; then the same for the time of the smallest size. Out-of-place
columns of nccl-tests, as the agent measures out of place.

    python3 bench/nccl_nodes_compare.py OUT ROUNDS LARGE
"""

import json
import os
import statistics
import sys

NAMES = {
    "allReduce": "all_reduce",
    "allGather": "all_gather",
    "reduceScatter": "reduce_scatter",
    "allToAll": "alltoall",
}


def size_bytes(text):
    """`16M` -> 16777216."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip()
    if text[-1].upper() in units:
        return int(float(text[:-1]) * units[text[-1].upper()])
    return int(text)


def agent_rows(path):
    """{(nodes, collective, bytes): (busbw, time_us)} of one agent document, or None."""
    try:
        doc = json.load(open(path))
    except (OSError, ValueError) as e:
        print(f"  {os.path.basename(path)}: no document ({e})")
        return None
    rows = {}
    for point in doc.get("points", []):
        for row in point.get("rows", []):
            name = NAMES.get(row["collective"], row["collective"])
            rows[(point["nodes"], name, row["bytes"])] = (row["busbw"], row["timeUs"])
    if doc.get("notMeasured"):
        print(f"  {os.path.basename(path)}: not measured: {doc['notMeasured']['message']}")
    for e in doc.get("errors", []):
        print(f"  {os.path.basename(path)}: error: {e.get('message')}")
    return rows


def nccl_tests_rows(path):
    """{bytes: (busbw, time_us)} of one nccl-tests log, out-of-place columns, or None."""
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return None
    rows = {}
    for line in lines:
        cols = line.split()
        if len(cols) < 9 or not cols[0].isdigit():
            continue
        try:
            # size count type redop root time algbw busbw #wrong (out of place) ...
            rows[int(cols[0])] = (float(cols[7]), float(cols[5]))
        except ValueError:
            continue
    return rows or None


def spread(values):
    return min(values), statistics.median(values), max(values)


def main():
    out, rounds, large = sys.argv[1], int(sys.argv[2]), size_bytes(sys.argv[3])
    agent = {}
    for r in range(1, rounds + 1):
        rows = agent_rows(os.path.join(out, f"agent-r{r}-rank0.json"))
        for key, value in (rows or {}).items():
            agent.setdefault(key, []).append(value)
    counts = sorted({k[0] for k in agent})
    if not counts:
        print("the agent measured nothing: no comparison")
        return 1
    ref = {}
    for k in counts:
        if not any(os.path.exists(os.path.join(out, f"nccl-tests-r{r}-n{k}-{coll}.log"))
                   for r in range(1, rounds + 1) for coll in NAMES.values()):
            print(f"  nccl-tests did not run at {k} nodes (REF_COUNTS)")
            continue
        for coll in NAMES.values():
            for r in range(1, rounds + 1):
                rows = nccl_tests_rows(os.path.join(out, f"nccl-tests-r{r}-n{k}-{coll}.log"))
                if rows is None:
                    print(f"  nccl-tests n={k} {coll} round {r}: no rows")
                    continue
                for size, value in rows.items():
                    ref.setdefault((k, coll, size), []).append(value)
    within = total = 0
    ratios = []
    print("busbw (GB/s) at the large sizes; nccl-tests: median [min..max] over the rounds")
    print(f"{'nodes':>5} {'collective':<15} {'bytes':>10} {'agent rounds':<24} "
          f"{'agent':>7} {'nccl-tests':>26} {'ratio':>6}  in spread")
    for (k, coll, size), values in sorted(agent.items()):
        if size < large:
            continue
        theirs = [v[0] for v in ref.get((k, coll, size), [])]
        ours = [v[0] for v in values]
        mine = statistics.median(ours)
        if not theirs:
            print(f"{k:>5} {coll:<15} {size:>10} {statistics.median(v[0] for v in values):>7.2f}"
                  " (no nccl-tests rows)")
            continue
        lo, med, hi = spread(theirs)
        ratio = mine / med if med > 0 else float("nan")
        ok = lo <= mine <= hi
        total += 1
        within += ok
        ratios.append(ratio)
        rounds_text = " ".join(f"{v:.2f}" for v in ours)
        print(f"{k:>5} {coll:<15} {size:>10} {rounds_text:<24} {mine:>7.2f} "
              f"{med:>8.2f} [{lo:.2f}..{hi:.2f}]".ljust(95) + f"{ratio:>6.3f}  {'yes' if ok else 'NO'}")
    smallest = min(s for (_, _, s) in agent)
    print(f"\ntime (us) at the smallest size, {smallest} bytes")
    for (k, coll, size), values in sorted(agent.items()):
        if size != smallest:
            continue
        theirs = [v[1] for v in ref.get((k, coll, size), [])]
        mine = statistics.median(v[1] for v in values)
        if theirs:
            lo, med, hi = spread(theirs)
            print(f"{k:>5} {coll:<15} agent {mine:>9.1f}  nccl-tests {med:>9.1f} "
                  f"[{lo:.1f}..{hi:.1f}]  ratio {mine / med:.3f}")
    if ratios:
        print(f"\nlarge sizes: {within} of {total} agent medians within nccl-tests' spread; "
              f"ratio agent/nccl-tests median {statistics.median(ratios):.3f}, "
              f"range {min(ratios):.3f}..{max(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
