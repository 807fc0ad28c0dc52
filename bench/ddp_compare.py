#!/usr/bin/env python3
"""Compares the DDP probe of fabric-agent with PyTorch DDP run beside it.

Reads the JSON lines that `bench/gpu-check.sh ddp-compare` writes: fabric-agent result
documents tagged "run": "probe-rN" and bench/ddp_reference.py outputs tagged
"run": "pytorch-rN". Rounds pair by N. Prints, per round and GPU count, the step times
and scaling efficiencies of both and their difference in points, then the means over
the rounds, with the verdict against the target (within +-3 points).

Usage: python3 bench/ddp_compare.py RUNS.jsonl
"""

import json
import re
import statistics
import sys

TARGET_POINTS = 3.0


def rounds(lines):
    """{round: {"probe": {gpus: (step_ms, eff)}, "pytorch": {...}}}"""
    out = {}
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as e:
            print(f"line {n}: not JSON ({e}); skipped", file=sys.stderr)
            continue
        m = re.match(r"(probe|pytorch)-r(\d+)$", str(doc.get("run", "")))
        if not m:
            continue
        who, r = m.group(1), int(m.group(2))
        if who == "probe":
            pts = (doc.get("ddp") or {}).get("points", [])
            vals = {p["gpus"]: (p["stepMs"], p["scalingEfficiency"]) for p in pts}
        else:
            vals = {p["gpus"]: (p["step_ms"], p["efficiency"]) for p in doc.get("points", [])}
        out.setdefault(r, {})[who] = vals
    return out


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    try:
        with open(sys.argv[1]) as f:
            data = rounds(f.readlines())
    except OSError as e:
        print(f"cannot read {sys.argv[1]}: {e}", file=sys.stderr)
        sys.exit(2)
    diffs, probe_eff, torch_eff, probe_step, torch_step = {}, {}, {}, {}, {}
    print("| round | GPUs | probe step (ms) | PyTorch step (ms) | probe eff. | PyTorch eff. | difference |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in sorted(data):
        probe, torch = data[r].get("probe", {}), data[r].get("pytorch", {})
        for g in sorted(set(probe) | set(torch)):
            ps, pe = probe.get(g, (None, None))
            ts, te = torch.get(g, (None, None))
            if ps is not None:
                probe_step.setdefault(g, []).append(ps)
                probe_eff.setdefault(g, []).append(pe)
            if ts is not None:
                torch_step.setdefault(g, []).append(ts)
                torch_eff.setdefault(g, []).append(te)
            d = ""
            if pe is not None and te is not None and g > 1:
                diffs.setdefault(g, []).append((pe - te) * 100)
                d = f"{(pe - te) * 100:+.1f}"
            fmt = lambda v, k: "-" if v is None else f"{v * k:.2f}" if k == 1 else f"{v * k:.1f}%"
            print(f"| r{r} | {g} | {fmt(ps, 1)} | {fmt(ts, 1)} | {fmt(pe, 100)} | {fmt(te, 100)} | {d} |")
    print()
    print("| GPUs | probe step mean (ms) | PyTorch step mean (ms) | probe eff. mean | PyTorch eff. mean | difference of means | rounds within +-3 | verdict |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for g in sorted(set(probe_eff) & set(torch_eff)):
        if g == 1:
            print(f"| 1 | {statistics.mean(probe_step[g]):.2f} | {statistics.mean(torch_step[g]):.2f} | 100% | 100% | | | |")
            continue
        pe, te = statistics.mean(probe_eff[g]) * 100, statistics.mean(torch_eff[g]) * 100
        within = sum(abs(d) <= TARGET_POINTS for d in diffs.get(g, []))
        ok = abs(pe - te) <= TARGET_POINTS
        print(
            f"| {g} | {statistics.mean(probe_step[g]):.2f} | {statistics.mean(torch_step[g]):.2f} | {pe:.1f}% | {te:.1f}% "
            f"| {pe - te:+.1f} | {within} of {len(diffs.get(g, []))} | {'met' if ok else 'NOT met'} |"
        )


if __name__ == "__main__":
    main()
