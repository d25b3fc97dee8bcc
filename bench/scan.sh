#!/usr/bin/env bash
# Scan throughput: xidwatch scan --json against ripgrep's `rg -c 'NVRM|SXid|nvidia'` on the same
# generated logs, both pinned to one core:
#   ordinary  mostly ordinary kernel lines, 1 in 1,000 an NVIDIA line; target ratio >= 0.8
#   storm     half the lines are Xid faults on three GPUs; target >= 1.5 M lines/s
# Prints throughputs and ratios; exits 1 when a target is missed.
#
#   bench/scan.sh            # 4,000,000 ordinary lines (about 340 MiB), 2,000,000 storm lines
#   LINES=1000000 STORM_LINES=500000 bench/scan.sh
set -euo pipefail
cd "$(dirname "$0")/.."
LINES=${LINES:-4000000}
STORM_LINES=${STORM_LINES:-2000000}
RUNS=${RUNS:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if ! command -v rg >/dev/null; then
  echo "installing ripgrep (needs root and apt)" >&2
  apt-get install -y -qq ripgrep >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq ripgrep >/dev/null; }
fi
cargo build --release --quiet
bin=target/release/xidwatch

python3 - "$LINES" "$work/big.log" <<'PY'
import random, sys
n, path = int(sys.argv[1]), sys.argv[2]
random.seed(7)
ordinary = [
    "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
    "e1000e 0000:00:1f.6 eno1: NIC Link is Up 1000 Mbps Full Duplex, Flow Control: Rx/Tx",
    "audit: type=1400 audit(1700000000.123:45): apparmor=\"STATUS\" operation=\"profile_load\" name=\"snap\"",
    "IPv6: ADDRCONF(NETDEV_CHANGE): eno1: link becomes ready",
    "systemd[1]: Started Session 4711 of User ubuntu.",
    "kauditd_printk_skb: 12 callbacks suppressed",
    "TCP: request_sock_TCP: Possible SYN flooding on port 8080. Sending cookies.",
    "mlx5_core 0000:3b:00.0: mlx5_cmd_out_err:838: QUERY_VPORT_COUNTER(0x770) op_mod(0x0) failed",
    "usb 1-1.4: new high-speed USB device number 5 using xhci_hcd",
    "oom_reaper: reaped process 31337 (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
]
nvidia = [
    "NVRM: Xid (PCI:0000:17:00): 13, pid=22871, name=python3, Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0): Out Of Range Address",
    "NVRM: Xid (PCI:0000:2a:00): 48, pid=3112, name=pt_main_thread, An uncorrectable double bit error (DBE) has been detected on GPU.",
    "NVRM: Xid (PCI:0000:17:00): 79, pid=2207, name=python3, GPU has fallen off the bus.",
    "nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
    "NVRM: GPU at PCI:0000:17:00: GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f",
    "nvidia-uvm: Loaded the UVM driver, major device number 508.",
]
with open(path, "w") as f:
    t = 10.0
    buf = []
    for i in range(n):
        t += random.random() * 0.01
        msg = random.choice(nvidia) if i % 1000 == 999 else random.choice(ordinary)
        buf.append("[%12.6f] %s\n" % (t, msg))
        if len(buf) >= 10000:
            f.write("".join(buf)); buf = []
    f.write("".join(buf))
PY
python3 - "$STORM_LINES" "$work/storm.log" <<'PY'
import random, sys
n, path = int(sys.argv[1]), sys.argv[2]
random.seed(11)
ordinary = [
    "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
    "e1000e 0000:00:1f.6 eno1: NIC Link is Up 1000 Mbps Full Duplex, Flow Control: Rx/Tx",
    "systemd[1]: Started Session 4711 of User ubuntu.",
    "kauditd_printk_skb: 12 callbacks suppressed",
]
faults = [
    "NVRM: Xid (PCI:0000:17:00): 45, pid=22871, name=python3, Ch 00000008",
    "NVRM: Xid (PCI:0000:2a:00): 45, pid=3112, name=pt_main_thread, Ch 00000010",
    "NVRM: Xid (PCI:0000:17:00): 13, pid=22871, name=python3, Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0): Out Of Range Address",
    "NVRM: Xid (PCI:0000:3b:00): 31, pid=1912, name=python3, channel 0x00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f12_3456_0000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
]
with open(path, "w") as f:
    t, buf = 10.0, []
    for i in range(n):
        t += random.random() * 0.0005
        msg = random.choice(faults) if i % 2 == 0 else random.choice(ordinary)
        buf.append("[%12.6f] %s\n" % (t, msg))
        if len(buf) >= 10000:
            f.write("".join(buf)); buf = []
    f.write("".join(buf))
PY
size=$(stat -c %s "$work/big.log")
cat "$work/storm.log" > /dev/null
cat "$work/big.log" > /dev/null   # warm the page cache for both tools

best() { # best wall time in seconds of RUNS runs of "$@"
  local b=""
  for _ in $(seq "$RUNS"); do
    local s e t
    s=$(date +%s.%N); "$@" > /dev/null || [ $? -eq 1 ]; e=$(date +%s.%N)
    t=$(echo "$e - $s" | bc -l)
    if [ -z "$b" ] || [ "$(echo "$t < $b" | bc -l)" = 1 ]; then b=$t; fi
  done
  echo "$b"
}
command -v bc >/dev/null || apt-get install -y -qq bc >/dev/null 2>&1
pin="taskset -c 0"; command -v taskset >/dev/null || pin=""

findings=$($bin scan --json "$work/big.log" | wc -l || true)
rg_lines=$(rg -c 'NVRM|SXid|nvidia' "$work/big.log")
tx=$(best $pin "$bin" scan --json "$work/big.log")
tr=$(best $pin rg -j1 -c 'NVRM|SXid|nvidia' "$work/big.log")
mb=$(echo "$size / 1048576" | bc -l)
ratio=$(echo "$tr / $tx" | bc -l)
printf 'ordinary:  %d lines, %.0f MiB, %s NVIDIA lines (rg -c), %s findings (xidwatch)\n' "$LINES" "$mb" "$rg_lines" "$findings"
printf '  xidwatch %8.0f MiB/s  (scan --json, full classification, best of %d)\n' "$(echo "$mb / $tx" | bc -l)" "$RUNS"
printf '  ripgrep  %8.0f MiB/s  (rg -j1 -c, best of %d)\n' "$(echo "$mb / $tr" | bc -l)" "$RUNS"
printf '  ratio    %.2f  (xidwatch / ripgrep; target >= 0.80)\n' "$ratio"

ssize=$(stat -c %s "$work/storm.log")
sfindings=$($bin scan --json "$work/storm.log" | wc -l || true)
[ "$sfindings" -eq $((STORM_LINES / 2)) ] || { echo "FAIL: storm log gave $sfindings findings, expected $((STORM_LINES / 2))" >&2; exit 1; }
sx=$(best $pin "$bin" scan --json "$work/storm.log")
st=$(best $pin "$bin" scan "$work/storm.log")
sr=$(best $pin rg -j1 -c 'NVRM|SXid|nvidia' "$work/storm.log")
rate=$(echo "$STORM_LINES / $sx" | bc -l)
printf 'storm:     %d lines, %.0f MiB, %d findings (half the lines)\n' "$STORM_LINES" "$(echo "$ssize / 1048576" | bc -l)" "$sfindings"
printf '  xidwatch %8.2f M lines/s with --json (%.2f s), %.2f M lines/s as text blocks grouped in incidents\n' "$(echo "$rate / 1000000" | bc -l)" "$sx" "$(echo "$STORM_LINES / $st / 1000000" | bc -l)"
printf '  ripgrep  %8.2f s; ratio %.3f (target >= 1.5 M lines/s, about 0.07x ripgrep)\n' "$sr" "$(echo "$sr / $sx" | bc -l)"

fail=0
awk -v r="$ratio" 'BEGIN { exit !(r >= 0.8) }' || { echo "MISSED: ordinary-log ratio below 0.80" >&2; fail=1; }
awk -v r="$rate" 'BEGIN { exit !(r >= 1500000) }' || { echo "MISSED: storm below 1.5 M lines/s" >&2; fail=1; }
exit $fail
