#!/usr/bin/env bash
# On a GPU host: an NCCL tuning setting the test did not choose is named with where it came
# from, whichever way it reached NCCL; the same setting chosen by the test's spec is spared;
# a setting NCCL refuses is never a pass.
#
#   bench/setting-sources-check.sh AGENT [SETTING]     (default NCCL_MAX_NCHANNELS=1)
#
# Each row is `node-check --quick --verdict --verdict-json` with the setting brought one way:
#   clean            nothing set: exit 0, no Critical or Warning finding;
#   conf-file        NCCL_CONF_FILE naming a file that sets it;
#   user-conf        .nccl.conf in the user's home (the password database's, as NCCL finds it);
#   system-conf      /etc/nccl.conf (each file written for its row, the host's own put back after);
#   pod-env          the process environment, not named by FABRIC_SPEC_ENV (an image's ENV,
#                    a mutating webhook, a CDI hook all arrive so);
#   spec-env         the environment with FABRIC_SPEC_ENV naming it, as the operator passes
#                    a FabricTest's spec.agent.env: spared, no finding names it;
#   refused          NCCL_ALGO=PAT (an algorithm NCCL refuses for most collectives): never exit 0.
# A not-chosen row is as wanted when a Critical or Warning finding names the setting and its
# source (Critical and exit 3 when the node's collectives fall below its own links, which
# needs two GPUs or more; Warning and exit 0 otherwise). Verdicts and logs in $OUT/sources/.
set -u
AGENT=$(realpath "${1:?usage: bench/setting-sources-check.sh AGENT [NAME=VALUE]}")
SETTING=${2:-NCCL_MAX_NCHANNELS=1}
NAME=${SETTING%%=*}
OUT=${OUT:-$PWD/setting-sources-out}
mkdir -p "$OUT/sources"
cd "$(dirname "$0")/.."
. bench/lib.sh
wheel_libs
export NCCL_NVLS_ENABLE=0
SCRATCH=$(mktemp -d)
ROWS=()
# NAME WANT (clean|named:SOURCE-WORDS|spared|not-zero) ENV... -- ARGS...
run() {
  local name=$1 want=$2; shift 2
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  local t=$(date +%s.%N)
  env "${envs[@]}" timeout 300 "$AGENT" node-check --quick --verdict \
    --verdict-json "$OUT/sources/$name.json" "$@" > "$OUT/sources/$name.log" 2>&1
  local code=$?
  local took=$(python3 -c "import time; print(round(time.time() - $t, 1))")
  local line
  line=$(python3 - "$OUT/sources/$name.json" "$code" "$want" "$NAME" <<'PY'
import json, sys
path, code, want, name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
try:
    v = json.load(open(path))
except Exception as e:
    v = {"verdict": f"no verdict ({e})", "findings": []}
fs = v.get("findings", [])
bad = [f for f in fs if f.get("severity") in ("Critical", "Warning")]
naming = [f for f in bad if name in f.get("message", "")]
if want == "clean":
    ok = code == 0 and not bad
elif want.startswith("named:"):
    words = want[len("named:"):]
    ok = any(words in f.get("message", "") for f in naming)
elif want == "spared":
    ok = code == 0 and not naming
else:  # not-zero
    ok = code != 0
shown = "; ".join(f"{f.get('severity')}: {f.get('message', '')[:160]}" for f in (naming or bad)[:2])
print(f"{v.get('verdict', '?')} | {len(bad)} | {shown or '-'} | {'yes' if ok else 'NO'}")
PY
)
  ROWS+=("| $name | $code | $line | $took s |")
  echo "$name: exit $code: $line ($took s)"
}
run clean clean --
printf '%s\n' "$SETTING" > "$SCRATCH/nccl.conf"
run conf-file "named:NCCL_CONF_FILE $SCRATCH/nccl.conf" NCCL_CONF_FILE="$SCRATCH/nccl.conf" --
# with_file ROW WANT FILE: the setting written to FILE for the row, the host's own file put
# back after.
with_file() {
  local row=$1 want=$2 file=$3 saved=""
  if [ -e "$file" ]; then saved=$SCRATCH/saved-$row; cp -p "$file" "$saved"; fi
  if printf '%s\n' "$SETTING" > "$file" 2>/dev/null; then
    run "$row" "$want" --
    if [ -n "$saved" ]; then cp -p "$saved" "$file"; else rm -f "$file"; fi
  else
    ROWS+=("| $row | - | not run: $file is not writable here | | | | |")
  fi
}
# NCCL's user file is in the home the password database gives (NCCL's userHomeDir), not $HOME.
PWHOME=$(getent passwd "$(id -u)" | cut -d: -f6)
if [ -n "$PWHOME" ]; then
  with_file user-conf "named:~/.nccl.conf" "$PWHOME/.nccl.conf"
else
  ROWS+=("| user-conf | - | not run: this user has no password entry, so NCCL reads no user file | | | | |")
fi
with_file system-conf "named:/etc/nccl.conf" /etc/nccl.conf
run pod-env "named:pod env not set by the spec" "$SETTING" --
run spec-env spared "$SETTING" FABRIC_SPEC_ENV="$NAME" --
run refused not-zero NCCL_ALGO=PAT --
rm -rf "$SCRATCH"
echo
echo "GPUs: $(nvidia-smi -L 2>/dev/null | wc -l); setting: $SETTING"
echo "| row | exit | verdict | Critical/Warning | the finding naming $NAME (or the first) | as wanted | took |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${ROWS[@]}"
