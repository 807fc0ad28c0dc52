#!/usr/bin/env bash
# Two agent builds' NCCL sweeps with CUDA graphs, alternating: $AGENT_A and $AGENT_B (e.g.
# graphs launched from one thread, and from one thread per GPU), ROUNDS rounds (default 3)
# of FLAGS (default the issue's sweep with -G 10). Prints each run's wall time and, per
# collective, the median time over its sizes up to 64 KiB; files go to $OUT (default
# ./graph-threads-out).
#
#   OUT=... AGENT_A=.device/fabric-agent-single AGENT_B=.device/fabric-agent bash bench/graph-threads.sh
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-$PWD/graph-threads-out}
FLAGS=${FLAGS:-"-b 8 -e 1G -f 8 -w 5 -n 20 -G 10"}
mkdir -p "$OUT"
NCCL_LIB=$(python3 -c "import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], 'lib'))")
mkdir -p /tmp/gf-threads-lib
ln -sf "$NCCL_LIB/libnccl.so.2" /tmp/gf-threads-lib/libnccl.so
export LD_LIBRARY_PATH=/tmp/gf-threads-lib:$NCCL_LIB:${LD_LIBRARY_PATH:-}
run() { # name exe round
  local t0 t1
  t0=$(date +%s.%N)
  timeout 300 "$2" node-check --no-pairs --no-ddp --no-health $FLAGS --json "$OUT/$1-r$3.json" \
    > /dev/null 2> "$OUT/$1-r$3.log" || echo "$1 round $3 failed: $(tail -1 "$OUT/$1-r$3.log")"
  t1=$(date +%s.%N)
  echo "$1 r$3 wall $(python3 -c "print(f'{$t1 - $t0:.2f}')") s" | tee -a "$OUT/walls.txt"
}
for r in $(seq 1 "${ROUNDS:-3}"); do
  if [ $((r % 2)) = 1 ]; then run a "$AGENT_A" "$r"; run b "$AGENT_B" "$r"; else run b "$AGENT_B" "$r"; run a "$AGENT_A" "$r"; fi
done
python3 - "$OUT" <<'PY'
import glob, json, os, re, statistics, sys
out = sys.argv[1]
rows = {}
for p in sorted(glob.glob(os.path.join(out, "[ab]-r*.json"))):
    who, r = re.search(r"([ab])-r(\d+)\.json", p).groups()
    doc = json.load(open(p))
    for c in (doc.get("nccl") or {}).get("collectives", []):
        small = [x["timeUs"] for x in c["rows"] if x["bytes"] <= 65536]
        if small:
            rows.setdefault((c["collective"], who), []).append(statistics.median(small))
print(f"{'collective':>14} {'build':>5}  runs (us an iteration, median over sizes <= 64 KiB)  max/min")
for (coll, who), v in sorted(rows.items()):
    print(f"{coll:>14} {who:>5}  {' '.join(f'{x:5.2f}' for x in v):<40} {max(v) / min(v):5.2f}")
PY
