#!/usr/bin/env bash
# NVLink error counters between checks on a real GPU host (issue 14, part 6): the agent's
# --counters-file keeps each GPU's NVLink replay/recovery/CRC count between checks, and
# --verdict judges the growth since the previous check.
#
#   1. three checks with --max-nvlink-error-growth 1000: a healthy node passes each time
#      (the first has nothing to compare; the next two judge the growth), and the file
#      holds the latest counts;
#   2. one more check with --max-nvlink-error-growth 1: healthy links add no replay,
#      recovery or CRC (flit) error under full NCCL traffic, so even the tightest threshold
#      passes, and unchanged counts leave the record as it was.
#
# nvidia-smi's own counters (the same three) are printed beside each step, and NVML's data
# CRC and ECC counters of link 0 (which grow with traffic on healthy links, so the agent
# does not use them) when pynvml is installed. The agent: $AGENT, else
# .device/fabric-agent. Writes under $OUT (default ./nvlink-counters-out).
set -u
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/nvlink-counters-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/check.log") 2>&1
AGENT=$(realpath "${AGENT:-.device/fabric-agent}")
[ -x "$AGENT" ] || { echo "no agent binary at $AGENT"; exit 1; }
. "$(dirname "$0")/lib.sh"
wheel_libs
banner() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
smi_counts() {
  # Sum of the replay, recovery and CRC counters per GPU, as nvidia-smi reports them.
  nvidia-smi nvlink -e 2>/dev/null | awk '/^GPU/{g=$2; sub(":","",g)} /Replay|Recovery|CRC/{s[g]+=$NF} END{for (g in s) printf "nvidia-smi GPU %s: replay+recovery+CRC %d\n", g, s[g]}' | sort
  python3 - <<'PY' 2>/dev/null || true
import pynvml as N
N.nvmlInit()
for i in range(N.nvmlDeviceGetCount()):
    h = N.nvmlDeviceGetHandleByIndex(i)
    print(f"NVML GPU {i} link 0: data CRC {N.nvmlDeviceGetNvLinkErrorCounter(h, 0, 3)}, data ECC {N.nvmlDeviceGetNvLinkErrorCounter(h, 0, 4)} (corrected in flight; not used)")
PY
}
COUNTERS=$OUT/counters.json
rm -f "$COUNTERS"
nvidia-smi --query-gpu=index,name,driver_version --format=csv
status=0
for i in 1 2 3; do
  banner "check $i of 3, --max-nvlink-error-growth 1000"
  smi_counts
  "$AGENT" node-check --verdict --counters-file "$COUNTERS" --max-nvlink-error-growth 1000 \
    > "$OUT/check$i.txt" 2>&1
  rc=$?
  echo "exit $rc"; grep -E "^# Verdict|NvlinkErrors" "$OUT/check$i.txt" | cut -c1-300
  echo "record: $(cat "$COUNTERS" 2>/dev/null)"
  [ $rc -eq 0 ] || status=1
done
banner "check 4, --max-nvlink-error-growth 1 (healthy links add none)"
before=$(cat "$COUNTERS")
"$AGENT" node-check --verdict --counters-file "$COUNTERS" --max-nvlink-error-growth 1 \
  > "$OUT/check4.txt" 2>&1
rc=$?
echo "exit $rc"; grep -E "^# Verdict|NvlinkErrors" "$OUT/check4.txt" | cut -c1-300
after=$(cat "$COUNTERS")
echo "record unchanged: $([ "$before" = "$after" ] && echo yes || echo NO)"
[ $rc -eq 0 ] && [ "$before" = "$after" ] || status=1
smi_counts
banner "verdict: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
