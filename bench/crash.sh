#!/usr/bin/env bash
# Crash: 100 SIGKILLs at random moments while distinct incidents stream in (KILLS=..., N=...).
# Prints incidents written, delivered, lost (must be 0) and alerts sent again per kill; exits 1
# if any incident was lost. Needs no root: the kernel log is a regular file, the receiver a
# webhook on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
python3 bench/crash.py target/release/xidwatch "${KILLS:-100}" "${N:-3000}"
