#!/usr/bin/env bash
# Storm: 100,000 Xid lines (N=...) written to the kernel log as fast as possible, then one marker
# line; prints the lines/s xidwatch kept up with (until the marker's incident came out, since it
# handles records in order), peak RSS, whether the counts were exact, and idle RSS and CPU
# beforehand. Exits 1 when the storm's summed count is not exactly N.
# Needs root: it writes test lines to /dev/kmsg.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -w /dev/kmsg ] || { echo "bench/storm.sh needs root (writes to /dev/kmsg)" >&2; exit 2; }
cargo build --release --quiet
python3 bench/kmsg_bench.py storm target/release/xidwatch
