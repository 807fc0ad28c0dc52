#!/usr/bin/env python3
"""The clean node check of two bench/gpu-e2e.sh runs side by side (e.g. the process-kubelet
and the real kubelet with the agent image, on one host in one call): every number of the
host's verdict, and how far the second is from the first. Where a run kept several clean
verdicts (E2E_CLEAN_REPEATS), each number is their median.

    python3 bench/e2e-compare.py A/gpu-e2e.json B/gpu-e2e.json [LIMIT_PERCENT]   (default 2)

Exits 1 when a number differs by more than LIMIT_PERCENT, or a run has no clean verdict.
"""
import json
import statistics
import sys

a_path, b_path = sys.argv[1:3]
limit = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0


def clean(path):
    try:
        doc = json.load(open(path))
    except (OSError, ValueError) as e:
        sys.exit(f"cannot read {path}: {e}")
    detail = doc.get("details", {}).get("clean test", {})
    vs = detail.get("verdicts") or [detail.get("verdict") or {}]
    nums = {}
    for v in vs:
        for k, x in v.items():
            if isinstance(x, (int, float)) and not isinstance(x, bool):
                nums.setdefault(k, []).append(x)
    print(f"{path}: {len(vs)} clean verdict(s)")
    return {k: statistics.median(xs) for k, xs in nums.items()}


a, b = clean(a_path), clean(b_path)
if not a or not b:
    print(f"no clean verdict in {a_path if not a else b_path}")
    sys.exit(1)
worst = 0.0
print(f"{'number':32} {'first':>12} {'second':>12} {'diff':>8}")
for k in sorted(set(a) & set(b)):
    d = 0.0 if a[k] == b[k] == 0 else 100.0 * (b[k] - a[k]) / (abs(a[k]) or 1)
    worst = max(worst, abs(d))
    print(f"{k:32} {a[k]:12.4g} {b[k]:12.4g} {d:+7.2f}%")
print(f"largest difference {worst:.2f}% (limit {limit}%)")
sys.exit(0 if worst <= limit else 1)
