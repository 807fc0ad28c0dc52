#!/usr/bin/env bash
# The compute checks on real GPUs, beside PyTorch in the same call:
#  ref      PyTorch on every GPU at once (one process per GPU, as the agent measures them
#           all at once), timed as the agent times them: bf16 torch.matmul of 8192^3 (600
#           warm-up, 200 timed in 4 blocks, the best kept), TF32 the same with allow_tf32
#           (50 warm-up), a 1 GiB device copy (b.copy_(a), 2 x bytes counted) and fill
#           (b.fill_), 4 blocks of 50 each; then the agent's compute checks alone; three
#           rounds, alternated, so that drift shows in both.
#  clean    the default node check five times with --verdict (no finding may come from the
#           compute checks), and twice with --no-compute: the wall time with and without.
#  loaded   a PyTorch process multiplying matrices on GPU $LOADED (default 2) while the
#           agent measures with --shared-gpus: the compute check must name that GPU.
#  flip     --flip-sdc-bit $FLIP (default 1): the SDC check must name that GPU and the
#           element, and --verdict must fail the node.
# Everything goes to $OUT (default ./compute-out); summary.txt has the numbers.
#
#   OUT=... AGENT=.device/fabric-agent bash bench/compute-check.sh [CASE...]
set -u
cd "$(dirname "$0")/.."
. bench/lib.sh
wheel_libs
OUT=${OUT:-$PWD/compute-out}
AGENT=${AGENT:-$PWD/.device/fabric-agent}
LOADED=${LOADED:-2}
FLIP=${FLIP:-1}
mkdir -p "$OUT"
SUM=$OUT/summary.txt
GPUS=$(nvidia-smi -L | wc -l)
CASES=${*:-ref clean loaded flip}
echo "# $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), $GPUS GPUs" >> "$SUM"

torch_ref() {
  local round=$1 pids=() g
  for g in $(seq 0 $((GPUS - 1))); do
    python3 - "$g" > "$OUT/torch-$round-$g.json" 2> "$OUT/torch-$round-$g.err" <<'PY' &
import json, sys, torch
g = int(sys.argv[1])
torch.cuda.set_device(g)
dev = f"cuda:{g}"
n, warm, iters = 8192, 600, 200

def timed(fn, warm, per_block, blocks=4):
    """Seconds per call of the best of `blocks` timed blocks."""
    for _ in range(warm):
        fn()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(blocks + 1)]
    ev[0].record()
    for e in ev[1:]:
        for _ in range(per_block):
            fn()
        e.record()
    torch.cuda.synchronize()
    return min(a.elapsed_time(b) for a, b in zip(ev, ev[1:])) / 1e3 / per_block

out = {"gpu": g}
a = torch.full((n, n), 0.001, dtype=torch.bfloat16, device=dev)
b = torch.full((n, n), 0.001, dtype=torch.bfloat16, device=dev)
c = torch.empty((n, n), dtype=torch.bfloat16, device=dev)
t = timed(lambda: torch.matmul(a, b, out=c), warm, iters // 4)
out["bf16_tflops"] = 2 * n**3 / t / 1e12
del a, b, c
torch.backends.cuda.matmul.allow_tf32 = True
a = torch.full((n, n), 0.001, dtype=torch.float32, device=dev)
b = torch.full((n, n), 0.001, dtype=torch.float32, device=dev)
c = torch.empty((n, n), dtype=torch.float32, device=dev)
t = timed(lambda: torch.matmul(a, b, out=c), 50, iters // 4)
out["tf32_tflops"] = 2 * n**3 / t / 1e12
del a, b, c
nbytes = 1 << 30
src = torch.full((nbytes,), 0x5A, dtype=torch.uint8, device=dev)
dst = torch.empty((nbytes,), dtype=torch.uint8, device=dev)
t = timed(lambda: dst.copy_(src), 1, 50)
out["copy_gbps"] = 2 * nbytes / t / 1e9
t = timed(lambda: dst.fill_(0xA5), 1, 50)
out["fill_gbps"] = nbytes / t / 1e9
print(json.dumps(out))
PY
    pids+=($!)
  done
  wait "${pids[@]}"
  python3 - "$OUT" "$round" "$GPUS" >> "$SUM" <<'PY'
import json, sys
out, r, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for g in range(n):
    try:
        d = json.load(open(f"{out}/torch-{r}-{g}.json"))
        print(f"torch round {r} gpu {g}: bf16 {d['bf16_tflops']:.1f} TFLOP/s, tf32 {d['tf32_tflops']:.1f}, copy {d['copy_gbps']:.0f} GB/s, fill {d['fill_gbps']:.0f}")
    except Exception as e:
        print(f"torch round {r} gpu {g}: failed: {e}")
PY
}

agent_compute() {
  local name=$1; shift
  local t0 t1 rc
  t0=$(date +%s.%N)
  "$AGENT" node-check --no-nccl --no-pairs --no-ddp --json "$OUT/$name.json" "$@" > "$OUT/$name.out" 2> "$OUT/$name.err"
  rc=$?
  t1=$(date +%s.%N)
  grep -hE '^# Verdict|^#  (critical|info) ' "$OUT/$name.out" "$OUT/$name.err" | sed "s/^/$name verdict: /" >> "$SUM"
  python3 - "$OUT/$name.json" "$name" "$rc" "$t0" "$t1" >> "$SUM" <<'PY'
import json, sys
path, name, rc, t0, t1 = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
try:
    d = json.load(open(path))
except Exception as e:
    print(f"{name}: exit {rc}, no document: {e}")
    sys.exit()
c = d.get("compute") or {}
print(f"{name}: exit {rc}, {t1 - t0:.1f} s wall, check {d.get('durationS', 0):.1f} s, errors {d.get('errors', [])}")
for g in c.get("gpus", []):
    s = g.get("sdc") or {}
    l = g.get("underLoad") or {}
    print(f"{name} gpu {g['gpu']}: bf16 {g.get('gemmBf16Tflops', 0):.1f} TFLOP/s, tf32 {g.get('gemmTf32Tflops', 0):.1f}, copy {g.get('memoryCopyGbps', 0):.0f} GB/s, fill {g.get('memoryWriteGbps', 0):.0f}, sdc wrong {s.get('wrongOutputs')}/{s.get('outputs')} differs {s.get('differsFromOthers')} first {s.get('firstWrong')}, {l.get('smClockMhz')}/{l.get('maxSmClockMhz')} MHz {l.get('powerW')}/{l.get('powerLimitW')} W {l.get('temperatureC')} C {l.get('throttle', [])}")
PY
}

for case in $CASES; do
  case $case in
  ref)
    for r in 1 2 3; do
      torch_ref "$r"
      agent_compute "agent-$r" --verdict
    done
    ;;
  clean)
    for r in 1 2 3 4 5; do
      t0=$(date +%s.%N)
      "$AGENT" node-check --verdict --json "$OUT/clean-$r.json" > "$OUT/clean-$r.out" 2> "$OUT/clean-$r.err"
      rc=$?
      t1=$(date +%s.%N)
      echo "clean $r: exit $rc, $(python3 -c "print(f'{$t1 - $t0:.1f}')") s wall, $(grep -h '^# Verdict' "$OUT/clean-$r.out" "$OUT/clean-$r.err" | head -1)" >> "$SUM"
      grep -hE '^#  (critical|info) ' "$OUT/clean-$r.out" "$OUT/clean-$r.err" | sed "s/^/clean $r finding: /" >> "$SUM"
    done
    for r in 1 2; do
      t0=$(date +%s.%N)
      "$AGENT" node-check --no-compute --json "$OUT/nocompute-$r.json" > "$OUT/nocompute-$r.out" 2> "$OUT/nocompute-$r.err"
      rc=$?
      t1=$(date +%s.%N)
      echo "no-compute $r: exit $rc, $(python3 -c "print(f'{$t1 - $t0:.1f}')") s wall" >> "$SUM"
    done
    ;;
  loaded)
    python3 - "$LOADED" > "$OUT/burner.log" 2>&1 <<'PY' &
import sys, time, torch
g = int(sys.argv[1])
torch.cuda.set_device(g)
a = torch.randn(8192, 8192, device=f"cuda:{g}", dtype=torch.bfloat16)
print("burning", flush=True)
t = time.time()
while time.time() - t < 120:
    for _ in range(20):
        b = a @ a
    torch.cuda.synchronize()
PY
    BURNER=$!
    for _ in $(seq 1 60); do grep -q burning "$OUT/burner.log" 2>/dev/null && break; sleep 0.5; done
    agent_compute loaded --shared-gpus --verdict
    kill "$BURNER" 2>/dev/null; wait "$BURNER" 2>/dev/null
    ;;
  flip)
    agent_compute flip --flip-sdc-bit "$FLIP" --verdict
    ;;
  esac
done
# Each collective's peak bus bandwidth against the median one-way pair copy of the same
# node, per clean check: what a healthy node's collectives reach of its own links.
python3 - "$OUT" >> "$SUM" <<'PY'
import glob, json, statistics, sys
for path in sorted(glob.glob(f"{sys.argv[1]}/clean-*.json")):
    try:
        d = json.load(open(path))
    except Exception as e:
        print(f"{path}: {e}")
        continue
    p = d.get("pairs") or {}
    copies = [e["gbps"] for e in p.get("unidirectional", [])]
    if not copies:
        continue
    pair = statistics.median(copies)
    cols = []
    for c in (d.get("nccl") or {}).get("collectives", []):
        peak = max((r["busbw"] for r in c.get("rows", [])), default=0)
        cols.append(f"{c['collective']} {peak:.0f} ({peak / pair:.3f})")
    print(f"ratio {path.split('/')[-1]}: median pair {pair:.1f} GB/s; " + ", ".join(cols))
PY
cat "$SUM"
# Few files come back from a device: the documents and logs in one archive.
tar czf "$OUT/docs.tgz" -C "$OUT" $(cd "$OUT" && ls | grep -vE '^(summary.txt|docs.tgz)$') && (cd "$OUT" && ls | grep -vE '^(summary.txt|docs.tgz)$' | xargs rm -f)
