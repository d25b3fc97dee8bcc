#!/usr/bin/env bash
# Daemon throughput: `xidwatch run` fed from a file source (kmsg.path = a regular file of kmsg
# records, read once at start-up as after a boot), pinned to one core. Half the records are Xid
# lines on a few GPUs (a storm), half ordinary kernel lines. Measures from start to the daemon's
# own "caught up (N records read at start-up)" line, which it logs only after the pipeline has
# handled every record before it; fails when that count is not N.
#
#   bench/daemon_file.sh             # 2,000,000 records
#   N=500000 bench/daemon_file.sh
# Target: >= 500,000 records/s.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-2000000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cargo build --release --quiet
bin=$PWD/target/release/xidwatch

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
cat > "$work/xidwatch.toml" <<TOML
[kmsg]
path = "$work/kmsg.records"
[nvml]
enabled = false
[state]
dir = "$work/state"
TOML
pin="taskset -c 0"; command -v taskset >/dev/null || pin=""

start=$(date +%s.%N)
$pin "$bin" run --json --config "$work/xidwatch.toml" > "$work/out.jsonl" 2> "$work/err.log" &
pid=$!
while ! grep -q "caught up" "$work/err.log"; do
  kill -0 "$pid" 2>/dev/null || { cat "$work/err.log" >&2; echo "xidwatch exited before catching up" >&2; exit 1; }
  sleep 0.02
done
end=$(date +%s.%N)
kill "$pid"; wait "$pid" 2>/dev/null || true
read_n=$(grep -o "caught up ([0-9]* records" "$work/err.log" | grep -o "[0-9]*")
t=$(echo "$end - $start" | bc -l)
printf 'records:   %d in the file, %d read before "caught up"\n' "$N" "$read_n"
printf 'time:      %.2f s from start (one core)\n' "$t"
printf 'rate:      %.0f records/s (target >= 500000)\n' "$(echo "$N / $t" | bc -l)"
[ "$read_n" -eq "$N" ] || { echo "FAIL: the daemon read $read_n of $N records" >&2; exit 1; }
awk -v r="$(echo "$N / $t" | bc -l)" 'BEGIN { exit !(r >= 500000) }' || { echo "FAIL: below 500000 records/s" >&2; exit 1; }
