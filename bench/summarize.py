#!/usr/bin/env python3
"""Summarises fabric-agent result documents (full JSON) against the H200 x4 targets.

Usage: python3 bench/summarize.py DIR
DIR holds what bench/gpu-check.sh wrote: full.json, quick.json, ddp_reference.json,
slowpair.json, straggler.json, clean.jsonl (any may be missing).
"""

import json
import os
import statistics
import sys

# Reference tools on 4 x H200 (NV18 all pairs, NCCL 2.28, CUDA 13).
AR_REF_BUSBW = {1 << 30: 355.3, 16 << 20: 248.6}
AR_REF_8B_US = 20.2


def load(path):
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(text.splitlines()[-1])


def verdict(ok):
    return "met" if ok else "NOT met"


def sweep_rows(doc, name):
    for c in (doc.get("nccl") or {}).get("collectives", []):
        if c["collective"] == name:
            return c
    return None


def summarize_full(doc, label):
    print(f"== {label}: {doc['node']} {len(doc['gpus'])} x {doc['gpus'][0]['product']} "
          f"duration {doc['durationS']:.1f} s versions {doc['versions']}")
    for e in doc.get("errors", []):
        print(f"  error: {e}")
    ar = sweep_rows(doc, "allReduce")
    if ar:
        print("  all_reduce busbw (out-of-place / in-place), time:")
        for r in ar["rows"]:
            b = r["bytes"]
            line = (f"    {b:>11} B  {r['timeUs']:>9.2f} us  busbw {r['busbw']:7.2f} / "
                    f"{r['inPlaceBusbw']:7.2f} GB/s  wrong {r['wrong'] + r['inPlaceWrong']}")
            if b >= 16 << 20 and b in AR_REF_BUSBW:
                ref = AR_REF_BUSBW[b]
                line += f"  ref {ref} -> {r['busbw'] / ref * 100:.1f}% ({verdict(r['busbw'] >= 0.98 * ref)})"
            print(line)
        first = ar["rows"][0]
        print(f"  all_reduce {first['bytes']} B latency {first['timeUs']:.2f} us (target <= 22): "
              f"{verdict(first['timeUs'] <= 22.0)}")
        print(f"  all_reduce fit: {ar.get('fit')}")
    for c in (doc.get("nccl") or {}).get("collectives", []):
        wrong = sum(r["wrong"] + r["inPlaceWrong"] for r in c["rows"])
        peak = max((r["busbw"] for r in c["rows"]), default=0)
        print(f"  {c['collective']:>14}: peak busbw {peak:7.2f} GB/s, 8B-ish time "
              f"{c['rows'][0]['timeUs']:.2f} us, wrong {wrong}, fit {c.get('fit')}")
    pairs = doc.get("pairs")
    if pairs:
        uni = [p["gbps"] for p in pairs["unidirectional"]]
        bi = [p["gbps"] for p in pairs["bidirectional"]]
        if uni:
            print(f"  pair one-way: min {min(uni):.1f} median {statistics.median(uni):.1f} max {max(uni):.1f} GB/s "
                  f"(target >= 390): {verdict(min(uni) >= 390)}")
        if bi:
            print(f"  pair bidirectional: min {min(bi):.1f} median {statistics.median(bi):.1f} max {max(bi):.1f} GB/s "
                  f"(target >= 775): {verdict(min(bi) >= 775)}")
        print(f"  host->device {[round(h['gbps'], 1) for h in pairs['hostToDevice']]} "
              f"device->host {[round(h['gbps'], 1) for h in pairs['deviceToHost']]} corrupt {pairs['corruptCopies']}")
    ddp = doc.get("ddp")
    if ddp:
        for p in ddp["points"]:
            print(f"  ddp {p['gpus']} GPU(s): step {p['stepMs']:.2f} ms eff {p['scalingEfficiency'] * 100:.1f}% "
                  f"comm {p['commFraction'] * 100:.1f}% overlap {p['overlapEfficiency'] * 100:.1f}% "
                  f"{p['tflopsPerGpu']:.0f} TFLOP/s compute {[round(x, 2) for x in p['computeMs']]}")
    for t in doc.get("transports", []):
        pass
    if doc.get("transports"):
        print(f"  transports: {[(t['a'], t['b'], t['transport']) for t in doc['transports']]}")
    h = doc.get("health")
    if h:
        for g in h["gpus"]:
            print(f"  health gpu {g['index']}: nvlink {g['nvlinkActive']}/{g['nvlinkExpected']} err {g['nvlinkErrors']} "
                  f"pcie gen {g['pcieGen']}/{g['pcieGenMax']} x{g['pcieWidth']}/{g['pcieWidthMax']} xids {g['xids']} "
                  f"ecc {g['eccUncorrected']} remap {g['remappedPending']}/{g['remappedFailed']} throttle {g['throttle']} "
                  f"{g['temperatureC']} C {g['powerW']:.0f} W")


def pair_table(doc):
    pairs = doc.get("pairs") or {}
    uni = {(p["src"], p["dst"]): p["gbps"] for p in pairs.get("unidirectional", [])}
    bi = {(p["src"], p["dst"]): p["gbps"] for p in pairs.get("bidirectional", [])}
    return uni, bi


def ddp_compute_ratios(doc):
    ddp = doc.get("ddp") or {}
    pts = ddp.get("points") or []
    if not pts:
        return None
    last = max(pts, key=lambda p: p["gpus"])
    med = statistics.median(last["computeMs"])
    return {i: c / med for i, c in zip(last["gpuIndices"], last["computeMs"])}


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    for name in ("quick.json", "full.json"):
        doc = load(os.path.join(d, name))
        if doc:
            summarize_full(doc, name)
            target = 20 if name == "quick.json" else 60
            print(f"  wall {doc['durationS']:.1f} s (target <= {target}): {verdict(doc['durationS'] <= target)}")
    ref = load(os.path.join(d, "ddp_reference.json"))
    full = load(os.path.join(d, "full.json"))
    if ref and full and full.get("ddp"):
        print("== DDP probe vs PyTorch DDP (same call)")
        ours = {p["gpus"]: p for p in full["ddp"]["points"]}
        for p in ref["points"]:
            o = ours.get(p["gpus"])
            if not o:
                continue
            diff = (o["scalingEfficiency"] - p["efficiency"]) * 100
            print(f"  {p['gpus']} GPU(s): probe {o['scalingEfficiency'] * 100:.1f}% (step {o['stepMs']:.2f} ms) "
                  f"pytorch {p['efficiency'] * 100:.1f}% (step {p['step_ms']:.2f} ms) diff {diff:+.1f} points: "
                  f"{verdict(abs(diff) <= 3.0)}")
    sp = load(os.path.join(d, "slowpair.json"))
    if sp:
        uni, bi = pair_table(sp)
        print("== slow pair injected (see gpu-check.sh for the pair)")
        print("  one-way matrix:", {f"{a}->{b}": round(v, 1) for (a, b), v in sorted(uni.items())})
        print("  bidirectional:", {f"{a}<->{b}": round(v, 1) for (a, b), v in sorted(bi.items())})
        if bi:
            worst = min(bi, key=bi.get)
            print(f"  slowest bidirectional pair: {worst} {bi[worst]:.1f} GB/s")
    st = load(os.path.join(d, "straggler.json"))
    if st:
        r = ddp_compute_ratios(st)
        print("== straggler injected: compute ratio to median per GPU", {k: round(v, 3) for k, v in (r or {}).items()})
    try:
        with open(os.path.join(d, "clean.jsonl")) as f:
            clean = [json.loads(l) for l in f if l.strip()]
    except OSError:
        clean = []
    if clean:
        print(f"== {len(clean)} clean runs")
        maxr, bi_spread, uni_spread = [], [], []
        for doc in clean:
            r = ddp_compute_ratios(doc)
            if r:
                maxr.append(max(r.values()))
            uni, bi = pair_table(doc)
            if bi:
                bi_spread.append((min(bi.values()), max(bi.values())))
            if uni:
                uni_spread.append((min(uni.values()), max(uni.values())))
        print(f"  max compute ratio to median per run: {[round(x, 3) for x in maxr]} (outlier if > 1.10): "
              f"{verdict(all(x <= 1.10 for x in maxr))}")
        print(f"  one-way pair min/max per run: {[(round(a, 1), round(b, 1)) for a, b in uni_spread]}")
        print(f"  bidirectional min/max per run: {[(round(a, 1), round(b, 1)) for a, b in bi_spread]}")


if __name__ == "__main__":
    main()
