#!/usr/bin/env bash
# Daemon throughput: `xidwatch run` fed from a file source (kmsg.path = a regular file of kmsg
# records, read once at start-up as after a boot), pinned to one core, on two mixes:
#   bench     half the records Xid lines on three GPUs (a storm), half three ordinary lines
#   gpu-host  half an Xid storm on 8 GPUs, half a GPU container host's chatter (bench/gpuhost.py:
#             veth and bridge states, AppArmor audits, systemd container units, NIC and NVMe)
# Measures from start to the daemon's own "caught up (N records read at start-up)" line, which it
# logs only after the pipeline has handled every record before it; fails when that count is not N.
#
#   bench/daemon_file.sh             # 2,000,000 records per mix
#   N=500000 bench/daemon_file.sh
# Target: >= 1,000,000 records/s on both mixes; exits 1 when missed.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-2000000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# BIN=path: measure that binary instead of building this tree's (to compare two builds).
if [ -n "${BIN:-}" ]; then bin=$(realpath "$BIN"); else cargo build --release --quiet; bin=$PWD/target/release/xidwatch; fi

python3 - "$N" "$work/kmsg.records" <<'PY'
import random, sys
n, path = int(sys.argv[1]), sys.argv[2]
random.seed(5)
ordinary = [
    "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
    "e1000e 0000:00:1f.6 eno1: NIC Link is Up 1000 Mbps Full Duplex, Flow Control: Rx/Tx",
    "systemd[1]: Started Session 4711 of User ubuntu.",
]
faults = [
    "NVRM: Xid (PCI:0000:17:00): 13, pid=22871, name=python3, Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0): Out Of Range Address",
    "NVRM: Xid (PCI:0000:2a:00): 45, pid=3112, name=pt_main_thread, Ch 00000010",
    "NVRM: Xid (PCI:0000:3b:00): 31, pid=1912, name=python3, channel 0x00000008, intr 10000000. MMU Fault",
]
with open(path, "w") as f:
    ts, buf = 10_000_000, []
    for seq in range(n):
        ts += random.randrange(1, 500)
        msg = random.choice(faults) if seq % 2 == 0 else random.choice(ordinary)
        buf.append("%d,%d,%d,-;%s\n" % (4 if seq % 2 == 0 else 6, seq, ts, msg))
        if len(buf) >= 10000:
            f.write("".join(buf)); buf = []
    f.write("".join(buf))
PY
python3 bench/gpuhost.py kmsg "$N" "$work/gpuhost.records"
pin="taskset -c 0"; command -v taskset >/dev/null || pin=""

fail=0
# mix NAME FILE: runs the daemon on FILE, prints its rate, sets fail under the target.
mix() {
  local name=$1 f=$2 state
  state=$(mktemp -d -p "$work")
  cat > "$state/xidwatch.toml" <<TOML
[kmsg]
path = "$f"
[nvml]
enabled = false
[state]
dir = "$state/state"
TOML
  cat "$f" > /dev/null
  local start end pid read_n t rate
  start=$(date +%s.%N)
  $pin "$bin" run --json --config "$state/xidwatch.toml" > "$state/out.jsonl" 2> "$state/err.log" &
  pid=$!
  while ! grep -q "caught up" "$state/err.log"; do
    kill -0 "$pid" 2>/dev/null || { cat "$state/err.log" >&2; echo "xidwatch exited before catching up" >&2; exit 1; }
    sleep 0.02
  done
  end=$(date +%s.%N)
  kill "$pid"; wait "$pid" 2>/dev/null || true
  read_n=$(grep -o "caught up ([0-9]* records" "$state/err.log" | grep -o "[0-9]*")
  t=$(awk "BEGIN { print $end - $start }")
  rate=$(awk "BEGIN { printf \"%.0f\", $N / $t }")
  printf '%-9s  %d records in the file, %d read before "caught up", %.2f s from start (one core): %s records/s (target >= 1000000)\n' \
    "$name:" "$N" "$read_n" "$t" "$rate"
  [ "$read_n" -eq "$N" ] || { echo "FAIL: the daemon read $read_n of $N records" >&2; exit 1; }
  awk -v r="$rate" 'BEGIN { exit !(r >= 1000000) }' || { echo "MISSED: $name below 1000000 records/s" >&2; fail=1; }
}
mix bench "$work/kmsg.records"
mix gpu-host "$work/gpuhost.records"
exit $fail
