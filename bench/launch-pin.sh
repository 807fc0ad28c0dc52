#!/usr/bin/env bash
# Does launching the NCCL sweep from the fastest CPU (`--pin-launch-cpu`) hold its
# small-message times still? ROUNDS rounds (default 8) of the agent with and without
# --pin-launch-cpu, the order turning each round, beside nccl-tests' all_reduce; each run
# sweeps all_reduce, broadcast and sendrecv at 8 B - 4 KiB with FLAGS (default -w 50 -n 1000).
# Prints, per collective and mode, the time per iteration of every run (median over its
# sizes) and how far the runs spread. Files go to $OUT (default ./launch-pin-out).
#
#   OUT=... AGENT=.device/fabric-agent bash bench/launch-pin.sh
set -u
export NCCL_NVLS_ENABLE=0
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PWD/launch-pin-out}
AGENT=${AGENT:-.device/fabric-agent}
REF=${REF:-/tmp/gf-ref}
FLAGS=${FLAGS:-"-b 8 -e 4K -f 8 -w 50 -n 1000"}
mkdir -p "$OUT"
NCCL_HOME=/tmp/gf-nccl
export LD_LIBRARY_PATH=$NCCL_HOME/lib:${LD_LIBRARY_PATH:-}
[ -x "$REF/nccl-tests/build/all_reduce_perf" ] || { echo "build nccl-tests first: bench/compare.sh build" >&2; exit 2; }
NGPU=$(nvidia-smi -L | wc -l)
agent() { # mode round
  local extra=""
  [ "$1" = pinned ] && extra=--pin-launch-cpu
  timeout 300 "$AGENT" node-check --no-pairs --no-ddp --no-health $extra \
    --collectives all_reduce,broadcast,sendrecv $FLAGS --json "$OUT/$1-r$2.json" \
    > /dev/null 2> "$OUT/$1-r$2.log" || echo "agent $1 round $2 failed: $(tail -1 "$OUT/$1-r$2.log")"
}
for r in $(seq 1 "${ROUNDS:-8}"); do
  if [ $((r % 2)) = 1 ]; then agent pinned "$r"; agent unpinned "$r"; else agent unpinned "$r"; agent pinned "$r"; fi
  timeout 120 "$REF/nccl-tests/build/all_reduce_perf" $FLAGS -g "$NGPU" > "$OUT/nccltests-r$r.txt" 2>&1
done
python3 - "$OUT" <<'PY'
import glob, json, os, re, statistics, sys
out = sys.argv[1]
def agent(path):
    doc = json.load(open(path))
    return {c["collective"]: statistics.median(r["timeUs"] for r in c["rows"])
            for c in (doc.get("nccl") or {}).get("collectives", [])}
def nt(path):
    v = [float(l.split()[5]) for l in open(path) if l.split() and l.split()[0].isdigit()]
    return statistics.median(v) if v else float("nan")
runs = {}
for mode in ("pinned", "unpinned"):
    for p in sorted(glob.glob(os.path.join(out, f"{mode}-r*.json")), key=lambda p: int(re.search(r"r(\d+)", p).group(1))):
        for coll, us in agent(p).items():
            runs.setdefault((coll, mode), []).append(us)
runs[("allReduce", "nccl-tests")] = [nt(p) for p in sorted(glob.glob(os.path.join(out, "nccltests-r*.txt")),
                                                         key=lambda p: int(re.search(r"r(\d+)", p).group(1)))]
print(f"{'collective':>10} {'mode':>10} {'runs (us an iteration, median over sizes)':<60} {'max/min':>7} {'stdev/mean':>10}")
for (coll, mode), v in sorted(runs.items()):
    v = [x for x in v if x == x]
    if not v:
        continue
    cv = statistics.pstdev(v) / statistics.mean(v)
    print(f"{coll:>10} {mode:>10} {' '.join(f'{x:5.1f}' for x in v):<60} {max(v) / min(v):7.2f} {cv:10.1%}")
PY
