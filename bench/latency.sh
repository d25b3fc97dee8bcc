#!/usr/bin/env bash
# Latency from a line written to the kernel log to the incident on xidwatch's output, over 1,000
# lines (N=...). Needs root: it writes test lines to /dev/kmsg (userspace facility, accepted only
# because the bench config says accept_userspace = true).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -w /dev/kmsg ] || { echo "bench/latency.sh needs root (writes to /dev/kmsg)" >&2; exit 2; }
cargo build --release --quiet
python3 bench/kmsg_bench.py latency target/release/xidwatch
