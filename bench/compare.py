"""Ratios of fabric-agent to nccl-tests and nvbandwidth from one bench/compare.sh run.

    python3 bench/compare.py OUT_DIR

Reads nccltests-<coll>-r<N>.txt, agent-sweep-r<N>.json, nccltests-wall-r<N>.txt,
agent-wall-r<N>.txt, nvbandwidth.json and agent-pairs.json, and prints per collective and
size the agent's time and bus bandwidth over nccl-tests' (out of place, the same round),
the sweeps' wall times, small-size stability, and per copy direction the agent's
bandwidth over nvbandwidth's.
"""

import glob
import json
import os
import re
import statistics
import sys

AGENT_NAME = {
    "all_reduce": "allReduce",
    "all_gather": "allGather",
    "reduce_scatter": "reduceScatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "alltoall": "allToAll",
    "sendrecv": "sendRecv",
}


def nccl_tests_rows(path):
    """size -> (time_us, busbw) of the out-of-place columns of one nccl-tests output."""
    rows = {}
    with open(path) as f:
        for line in f:
            t = line.split()
            if len(t) < 9 or not t[0].isdigit():
                continue
            try:
                rows[int(t[0])] = (float(t[5]), float(t[7]))
            except ValueError:
                continue
    return rows


def agent_rows(doc, coll):
    for c in (doc.get("nccl") or {}).get("collectives", []):
        if c["collective"] == AGENT_NAME[coll]:
            return {r["bytes"]: (r["timeUs"], r["busbw"]) for r in c["rows"]}
    return {}


def read_wall(path):
    try:
        with open(path) as f:
            m = re.search(r"wall ([0-9.]+) s", f.read())
            return float(m.group(1)) if m else None
    except OSError:
        return None


def by_round(out, rounds):
    """(coll, size) -> ([nccl-tests (us, busbw) by round], [agent (us, busbw) by round])."""
    table = {}
    for rnd in rounds:
        with open(os.path.join(out, f"agent-sweep-r{rnd}.json")) as f:
            doc = json.load(f)
        for coll in AGENT_NAME:
            path = os.path.join(out, f"nccltests-{coll}-r{rnd}.txt")
            if not os.path.exists(path):
                continue
            nt, ag = nccl_tests_rows(path), agent_rows(doc, coll)
            for size in set(nt) & set(ag):
                e = table.setdefault((coll, size), ([], []))
                e[0].append(nt[size])
                e[1].append(ag[size])
    return table


def spread(out, rounds):
    """How far each tool moves between its own rounds (its largest over its smallest value
    per point), and the agent's median over rounds against nccl-tests' median over rounds:
    the same targets, judged with the run-to-run noise of the reference in view."""
    if len(rounds) < 2:
        return
    table = by_round(out, rounds)
    print(f"\n## spread over {len(rounds)} rounds, and medians over rounds")
    for what, limit, cond, col in [
        ("busbw >= 16 MiB", 0.01, lambda s: s >= 16 << 20, 1),
        ("time <= 1 MiB", 0.10, lambda s: s <= 1 << 20, 0),
    ]:
        pts = [(k, v) for k, v in table.items() if cond(k[1]) and min(x[col] for x in v[0]) > 0]
        if not pts:
            continue
        for name, side in (("nccl-tests", 0), ("agent", 1)):
            sp = [max(x[col] for x in v[side]) / min(x[col] for x in v[side]) - 1.0
                  for _, v in pts if min(x[col] for x in v[side]) > 0]
            inside = sum(1 for x in sp if x <= limit)
            print(f"{what}: {name} against itself: {inside} of {len(sp)} points move by at most "
                  f"{limit:.0%} between rounds; largest move {max(sp):.1%}, median {statistics.median(sp):.1%}")
        ratios = [statistics.median(x[col] for x in v[1]) / statistics.median(x[col] for x in v[0])
                  for _, v in pts]
        inside = sum(1 for r in ratios if abs(r - 1.0) <= limit)
        print(f"{what}: agent median / nccl-tests median: {inside} of {len(ratios)} within "
              f"{limit:.0%}, range {min(ratios):.3f}-{max(ratios):.3f}")
        # The points outside, each with both tools' values per round, to read the misses.
        for (k, v), r in zip(pts, ratios):
            if abs(r - 1.0) > limit:
                nt = " ".join(f"{x[col]:.2f}" for x in v[0])
                ag = " ".join(f"{x[col]:.2f}" for x in v[1])
                print(f"    outside: {k[0]} {k[1]} B median ratio {r:.3f}  nccl-tests {nt}  agent {ag}")
        # The same medians, judged against the reference's own reproducibility: a point counts
        # when the ratio is within the limit, or within nccl-tests' own largest move between
        # its rounds at that point where that is larger (the limit cannot be read finer than
        # the reference repeats itself).
        own = [max(x[col] for x in v[0]) / min(x[col] for x in v[0]) - 1.0 for _, v in pts]
        inside = sum(1 for r, o in zip(ratios, own) if abs(r - 1.0) <= max(limit, o))
        print(f"{what}: agent median / nccl-tests median within {limit:.0%} or within "
              f"nccl-tests' own move between rounds where larger: {inside} of {len(ratios)}")
        # Each round's agent over the same round's nccl-tests, median over rounds: the
        # estimator for runs where the two tools ran side by side in time (and, pinned, on
        # one CPU), so that each pair of values saw the same host.
        ratios = [statistics.median(a[col] / n[col] for n, a in zip(v[0], v[1]) if n[col] > 0)
                  for _, v in pts]
        inside = sum(1 for r in ratios if abs(r - 1.0) <= limit)
        print(f"{what}: agent / nccl-tests of the same round, median over rounds: {inside} of "
              f"{len(ratios)} within {limit:.0%}, range {min(ratios):.3f}-{max(ratios):.3f}, "
              f"median {statistics.median(ratios):.3f}")
        # Each tool's best round per point (least time, most busbw): what either reaches
        # when the host leaves it alone, the same estimator for both.
        best = min if col == 0 else max
        ratios = [best(x[col] for x in v[1]) / best(x[col] for x in v[0]) for _, v in pts]
        inside = sum(1 for r in ratios if abs(r - 1.0) <= limit)
        print(f"{what}: agent best round / nccl-tests best round: {inside} of {len(ratios)} within "
              f"{limit:.0%}, range {min(ratios):.3f}-{max(ratios):.3f}, "
              f"median {statistics.median(ratios):.3f}")


def sweep(out):
    rounds = sorted(
        int(m.group(1))
        for p in glob.glob(os.path.join(out, "agent-sweep-r*.json"))
        if (m := re.search(r"-r(\d+)\.json$", p))
    )
    big, small, stable = [], [], []
    for rnd in rounds:
        with open(os.path.join(out, f"agent-sweep-r{rnd}.json")) as f:
            doc = json.load(f)
        nt_wall = read_wall(os.path.join(out, f"nccltests-wall-r{rnd}.txt"))
        ag_wall = read_wall(os.path.join(out, f"agent-wall-r{rnd}.txt"))
        print(f"\n## round {rnd}: sweep wall time nccl-tests {nt_wall} s, agent {ag_wall} s", end="")
        if nt_wall and ag_wall:
            print(f" (agent / nccl-tests {ag_wall / nt_wall:.2f})")
        else:
            print()
        print(f"{'collective':>15} {'bytes':>11} {'nt us':>9} {'agent us':>9} {'t ratio':>7} "
              f"{'nt busbw':>9} {'agent busbw':>11} {'bw ratio':>8}")
        for coll in AGENT_NAME:
            path = os.path.join(out, f"nccltests-{coll}-r{rnd}.txt")
            if not os.path.exists(path):
                continue
            nt = nccl_tests_rows(path)
            ag = agent_rows(doc, coll)
            for size in sorted(set(nt) & set(ag)):
                (nt_us, nt_bw), (ag_us, ag_bw) = nt[size], ag[size]
                tr = ag_us / nt_us if nt_us > 0 else float("nan")
                br = ag_bw / nt_bw if nt_bw > 0 else float("nan")
                print(f"{coll:>15} {size:>11} {nt_us:>9.2f} {ag_us:>9.2f} {tr:>7.3f} "
                      f"{nt_bw:>9.2f} {ag_bw:>11.2f} {br:>8.3f}")
                if size >= 16 << 20 and nt_bw > 0:
                    big.append((br, coll, size, rnd))
                if size <= 1 << 20 and nt_us > 0:
                    small.append((tr, coll, size, rnd))
            small_ag = [ag[s][0] for s in sorted(ag) if s <= 1024]
            for a, b in zip(small_ag, small_ag[1:]):
                if min(a, b) > 0:
                    stable.append((max(a, b) / min(a, b), coll, rnd))
            missing = sorted(set(nt) ^ set(ag))
            if missing:
                print(f"{coll:>15} sizes in one only: {missing}")
    spread(out, rounds)
    print("\n## targets")
    if big:
        worst = max(big, key=lambda x: abs(x[0] - 1.0))
        inside = sum(1 for b in big if abs(b[0] - 1.0) <= 0.01)
        print(f"busbw >= 16 MiB, agent / nccl-tests: {len(big)} points, {inside} within 1%, "
              f"range {min(b[0] for b in big):.3f}-{max(b[0] for b in big):.3f}, "
              f"median {statistics.median(b[0] for b in big):.3f}; farthest {worst[0]:.3f} "
              f"({worst[1]} {worst[2]} B, round {worst[3]})")
    if small:
        inside = sum(1 for s in small if abs(s[0] - 1.0) <= 0.10)
        print(f"time <= 1 MiB, agent / nccl-tests: {len(small)} points, {inside} within 10%, "
              f"range {min(s[0] for s in small):.3f}-{max(s[0] for s in small):.3f}, "
              f"median {statistics.median(s[0] for s in small):.3f}")
    if stable:
        worst = max(stable)
        inside = sum(1 for s in stable if s[0] <= 1.15)
        print(f"adjacent sizes <= 1 KiB (agent): {len(stable)} steps, {inside} within 15%, "
              f"largest step {worst[0]:.3f} ({worst[1]}, round {worst[2]})")


def nvbandwidth(out):
    try:
        with open(os.path.join(out, "nvbandwidth.json")) as f:
            text = f.read()
        doc = json.loads(text[text.index("{"):])
    except (OSError, ValueError) as e:
        print(f"\nnvbandwidth: no result ({e})")
        return {}
    tests = {}
    for t in doc.get("nvbandwidth", {}).get("testcases", []):
        rows = t.get("bandwidth_matrix") or []
        m = [[float(v) if v not in ("N/A", "") else None for v in row] for row in rows]
        tests[t.get("name")] = m
    return tests


def copies(out):
    tests = nvbandwidth(out)
    try:
        with open(os.path.join(out, "agent-pairs.json")) as f:
            pairs = json.load(f).get("pairs") or {}
    except (OSError, ValueError) as e:
        print(f"\nagent pairs: no result ({e})")
        return
    print("\n## copies, agent / nvbandwidth (GB/s)")

    def cell(name, a, b):
        m = tests.get(name) or []
        return m[a][b] if a < len(m) and b < len(m[a]) else None

    ratios = {}

    def show(what, ag, nv):
        if nv:
            r = ag / nv
            ratios.setdefault(what, []).append(r)
            print(f"{what:>28} agent {ag:8.1f} nvbandwidth {nv:8.1f} ratio {r:.3f}")
        else:
            print(f"{what:>28} agent {ag:8.1f} nvbandwidth -")

    for e in pairs.get("unidirectional", []):
        a, b = e["src"], e["dst"]
        show(f"{a} -> {b} one way (write)", e["gbps"], cell("device_to_device_memcpy_write_ce", a, b))
        # Read CE: the row GPU reads from the column GPU, so data moves column -> row.
        show(f"{a} -> {b} one way (read)", e["gbps"], cell("device_to_device_memcpy_read_ce", b, a))
    for e in pairs.get("bidirectional", []):
        a, b = e["src"], e["dst"]
        x = cell("device_to_device_bidirectional_memcpy_write_ce", a, b)
        y = cell("device_to_device_bidirectional_memcpy_write_ce", b, a)
        show(f"{a} <-> {b} both ways (sum)", e["gbps"], (x + y) if x and y else None)
    for e in pairs.get("hostToDevice", []):
        show(f"host -> {e['gpu']}", e["gbps"], cell("host_to_device_memcpy_ce", 0, e["gpu"]))
    for e in pairs.get("deviceToHost", []):
        show(f"{e['gpu']} -> host", e["gbps"], cell("device_to_host_memcpy_ce", 0, e["gpu"]))
    kinds = {}
    for k, v in ratios.items():
        kind = k.split(" ", 3)[-1] if k[0].isdigit() and ("one way" in k or "both" in k) else (
            "host -> device" if k.startswith("host") else "device -> host")
        kinds.setdefault(kind, []).extend(v)
    for kind, v in sorted(kinds.items()):
        print(f"{kind:>28}: {len(v)} cells, ratio median {statistics.median(v):.3f}, "
              f"range {min(v):.3f}-{max(v):.3f}")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "compare-out"
    sweep(out)
    copies(out)


if __name__ == "__main__":
    main()
