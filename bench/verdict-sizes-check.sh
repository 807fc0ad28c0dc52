#!/usr/bin/env bash
# The agent's standalone verdict on a clean GPU host at every sweep size, then faults the
# verdict must name, each brought from outside a test's spec, then a refused setting:
#
#   bench/verdict-sizes-check.sh AGENT [RUNS]     (default 5 runs of each size)
#
# 1. RUNS clean runs each of `node-check --quick`, `-e 64M`, `-e 256M` and the default suite
#    with --verdict: every one must pass (exit 0) with no Critical or Warning finding;
# 2. NVLink unused by NCCL (NCCL_P2P_DISABLE=1 from an NCCL config file, NCCL_CONF_FILE):
#    the default suite must fail (exit 3) with the collectives named;
# 3. a setting NCCL refuses (NCCL_ALGO=PAT on one node): exit 5, the collectives not run named.
# Each run's verdict JSON and log go to $OUT/verdicts/; a table is printed last. Stops
# starting new runs after VERDICT_BUDGET seconds (default 420) so its table is always printed.
set -u
AGENT=${1:?usage: bench/verdict-sizes-check.sh AGENT [RUNS]}
RUNS=${2:-5}
OUT=${OUT:-$PWD/verdict-out}
BUDGET=${VERDICT_BUDGET:-420}
mkdir -p "$OUT/verdicts"
. "$(dirname "$0")/lib.sh"
wheel_libs
T0=$(date +%s)
ROWS=()
run() { # NAME EXPECTED-EXIT ENV... -- ARGS...
  local name=$1 want=$2; shift 2
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  if [ $(( $(date +%s) - T0 )) -gt "$BUDGET" ]; then ROWS+=("| $name | - | not run (budget) | |"); return; fi
  local t=$(date +%s.%N)
  env "${envs[@]}" "$AGENT" node-check --verdict --verdict-json "$OUT/verdicts/$name.json" "$@" \
    > "$OUT/verdicts/$name.log" 2>&1
  local code=$?
  local took=$(python3 -c "import time; print(round(time.time() - $t, 1))")
  local summary=$(python3 - "$OUT/verdicts/$name.json" <<'PY'
import json, sys
try:
    v = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"no verdict ({e})"); sys.exit()
fs = v.get("findings", [])
bad = [f for f in fs if f.get("severity") in ("Critical", "Warning")]
head = v.get("verdict", "?")
names = "; ".join(f"{f.get('severity')}: {f.get('message', '')[:90]}" for f in bad[:3])
notrun = v.get("notRun") or v.get("not_run")
print(f"{head}, {len(bad)} Critical/Warning" + (f" ({names})" if names else "") + (f"; not run: {notrun}" if notrun else ""))
PY
)
  local ok=no; [ "$code" = "$want" ] && ok=yes
  ROWS+=("| $name | $code (want $want) | $summary | $took s | $ok |")
  echo "$name: exit $code (want $want) in $took s: $summary"
}
for i in $(seq 1 "$RUNS"); do
  run "quick-$i" 0 -- --quick
  run "e64m-$i" 0 -- -e 64M
  run "e256m-$i" 0 -- -e 256M
  run "default-$i" 0 --
done
printf 'NCCL_P2P_DISABLE=1\n' > "$OUT/p2p.conf"
run "p2p-disable-conf" 3 NCCL_CONF_FILE="$OUT/p2p.conf" --
run "refused-algo" 5 NCCL_ALGO=PAT -- --quick
echo
echo "| run | exit | verdict | took | as wanted |"
echo "| --- | --- | --- | --- | --- |"
printf '%s\n' "${ROWS[@]}"
