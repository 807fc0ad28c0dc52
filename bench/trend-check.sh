#!/usr/bin/env bash
# The drift record and the NCCL-settings rule on real GPUs:
#  nights   the default node check six times in a row with --verdict --trend-file: how much
#           each kept number (all_reduce busbw, worst GPU pair, slowest host link, DDP step)
#           moves between checks of a healthy node, against the drift rule's 5%; the sixth
#           check is judged against the five before it and must give no Drifting finding.
#  tuned    NCCL_MAX_NCHANNELS=1, then NCCL_P2P_DISABLE=1, in the agent's environment: the
#           slowed collectives must be Info findings that name the setting, and the node
#           must pass.
#  flip     --flip-sdc-bit $FLIP (default 1): the SDC check must name that GPU and count
#           exactly the outputs that are wrong.
# Everything goes to $OUT (default ./trend-out); summary.txt has the numbers.
#
#   OUT=... AGENT=.device/fabric-agent bash bench/trend-check.sh [CASE...]
set -u
cd "$(dirname "$0")/.."
. bench/lib.sh
wheel_libs
OUT=${OUT:-$PWD/trend-out}
AGENT=${AGENT:-$PWD/.device/fabric-agent}
FLIP=${FLIP:-1}
mkdir -p "$OUT"
SUM=$OUT/summary.txt
CASES=${*:-nights tuned flip}
echo "# $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), $(nvidia-smi -L | wc -l) GPUs" >> "$SUM"

check() {
  local name=$1; shift
  local t0 t1 rc
  t0=$(date +%s.%N)
  "$AGENT" node-check --verdict --json "$OUT/$name.json" "$@" > "$OUT/$name.out" 2> "$OUT/$name.err"
  rc=$?
  t1=$(date +%s.%N)
  echo "$name: exit $rc, $(python3 -c "print(f'{$t1 - $t0:.1f}')") s wall, $(grep -h '^# Verdict' "$OUT/$name.out" "$OUT/$name.err" | head -1)" >> "$SUM"
  grep -hE '^#  (critical|warning|info) ' "$OUT/$name.out" "$OUT/$name.err" | cut -c1-400 | sed "s/^/$name finding: /" >> "$SUM"
}

for case in $CASES; do
  case $case in
  nights)
    rm -f "$OUT/trend.json"
    for r in 1 2 3 4 5 6; do
      check "night-$r" --trend-file "$OUT/trend.json"
    done
    python3 - "$OUT/trend.json" >> "$SUM" <<'PY'
import json, sys
pts = json.load(open(sys.argv[1]))["tests"][0]["points"]
names = {"b": "all_reduce busbw GB/s", "p": "worst pair GB/s", "h": "slowest host link GB/s", "s": "DDP step ms"}
print(f"trend record: {len(pts)} checks kept")
for k, label in names.items():
    v = [p[k] for p in pts if k in p]
    if not v:
        print(f"{label}: none"); continue
    med = sorted(v)[len(v) // 2]
    spread = (max(v) - min(v)) / med * 100
    worst = max(abs(x - med) / med * 100 for x in v)
    print(f"{label}: {', '.join(f'{x:g}' for x in v)}; spread {spread:.2f}% of the median, farthest {worst:.2f}% from it")
PY
    ;;
  tuned)
    NCCL_MAX_NCHANNELS=1 check tuned-nchannels1
    NCCL_P2P_DISABLE=1 check tuned-p2p-disable
    ;;
  flip)
    check "flip-$FLIP" --no-nccl --no-pairs --no-ddp --flip-sdc-bit "$FLIP"
    python3 - "$OUT/flip-$FLIP.json" >> "$SUM" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for g in (d.get("compute") or {}).get("gpus", []):
    s = g.get("sdc") or {}
    print(f"flip gpu {g['gpu']}: wrong {s.get('wrongOutputs')}/{s.get('outputs')}, differs {s.get('differsFromOthers')}, first {s.get('firstWrong')}")
PY
    ;;
  esac
done
cat "$SUM"
