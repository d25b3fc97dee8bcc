#!/usr/bin/env python3
"""Crash bench: SIGKILL the daemon at random moments while distinct incidents stream in.

A writer appends one distinct Xid 13 incident (its own GPU address; one application fault per
GPU, since the same critical fault on several GPUs at once is one host page) to a regular-file kernel log
every few milliseconds; the daemon sends each incident's alert to a webhook receiver on loopback;
the bench SIGKILLs the daemon KILLS times at random moments and restarts it at once. At the end
it prints how many incidents were written, how many reached the receiver, how many were lost
(must be 0) and how many alerts were sent again per kill, and exits 1 if any was lost.

Usage: crash.py XIDWATCH_BINARY [KILLS] [INCIDENTS]
"""

import http.server
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

BINARY = sys.argv[1]
KILLS = int(sys.argv[2]) if len(sys.argv) > 2 else 100
INCIDENTS = int(sys.argv[3]) if len(sys.argv) > 3 else 3000

received = []  # (id, phase, pci)
lock = threading.Lock()


class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        try:
            doc = json.loads(body)
            with lock:
                received.append((doc.get("id"), doc.get("phase"), (doc.get("gpu") or {}).get("pci")))
        except ValueError:
            pass
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def record(seq, i):
    dom, bus, dev = i // 8192, (i // 32) % 256, i % 32
    return (f"3,{seq},{1_000_000 + seq},-;NVRM: Xid (PCI:{dom:04x}:{bus:02x}:{dev:02x}): 13, "
            f"pid=42, name=python3, crash bench\n")


def main():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/alerts"
    work = tempfile.mkdtemp(prefix="xidwatch-crash-")
    kmsg = os.path.join(work, "kmsg")
    open(kmsg, "w").close()
    with open(os.path.join(work, "boot_id"), "w") as f:
        f.write("5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f\n")
    os.makedirs(os.path.join(work, "runbooks"))
    with open(os.path.join(work, "runbooks", "cheap.toml"), "w") as f:
        f.write('title = "cheap"\nfallback = true\n[guide]\nmeaning = "m"\nnext_steps = "n"\n'
                '[[step]]\nname = "log"\nkmsg = { lines_before = 2, lines_after = 0 }\n')
    config = os.path.join(work, "xidwatch.toml")
    with open(config, "w") as f:
        f.write(f'[kmsg]\npath = "{kmsg}"\n[nvml]\nenabled = false\nsysfs_root = "{work}/sys"\n'
                f'[state]\ndir = "{work}/state"\n[runbooks]\ndirs = ["{work}/runbooks"]\n'
                f'[alerts.outbox]\nmax_count = 100000\nmax_bytes = 1073741824\n'
                f'[alerts.retry]\ninitial_backoff_ms = 50\nmax_backoff_secs = 1\n'
                f'[[alerts.webhook]]\nname = "bench"\nurl = "{url}"\nformat = "json"\n'
                f'rate_limit_count = 1000000\nrate_limit_window_secs = 1\n')
    os.chmod(config, 0o600)
    env = dict(os.environ, XIDWATCH_BOOT_ID_PATH=os.path.join(work, "boot_id"))
    env.pop("NOTIFY_SOCKET", None)
    log = open(os.path.join(work, "daemon.log"), "w")

    def start():
        return subprocess.Popen([BINARY, "run", "--config", config], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)

    # The writer: distinct incidents, spread over the kills.
    per_kill = 0.25
    interval = per_kill * KILLS / INCIDENTS
    done = threading.Event()

    def writer():
        with open(kmsg, "a") as f:
            for i in range(INCIDENTS):
                f.write(record(i, i))
                f.flush()
                time.sleep(interval)
        done.set()

    daemon = start()
    t0 = time.time()
    threading.Thread(target=writer, daemon=True).start()
    rng = random.Random(int(os.environ.get("SEED", "1")))
    kills = 0
    while kills < KILLS:
        time.sleep(rng.uniform(0.02, 2 * per_kill))
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
        kills += 1
        daemon = start()
    done.wait()
    # Let the last run deliver everything, then stop it the way systemd would.
    deadline = time.time() + 120
    while time.time() < deadline:
        with lock:
            if len({r[2] for r in received if r[1] == "opened"}) >= INCIDENTS:
                break
        time.sleep(0.1)
    daemon.send_signal(signal.SIGTERM)
    daemon.wait(timeout=30)
    elapsed = time.time() - t0
    with lock:
        opened = [r for r in received if r[1] == "opened"]
    distinct = len({r[2] for r in opened})
    ids = len({r[0] for r in opened})
    lost = INCIDENTS - distinct
    resent = len(opened) - distinct
    print(f"crash bench: {KILLS} SIGKILLs over {elapsed:.1f} s of {INCIDENTS} distinct incidents")
    print(f"  incidents written   {INCIDENTS}")
    print(f"  delivered (distinct) {distinct}  (distinct ids {ids})")
    print(f"  lost                {lost}")
    print(f"  sent again          {resent} in all, {resent / KILLS:.2f} per kill")
    if ids != distinct:
        print("  FAIL: an incident was sent under two ids")
        sys.exit(1)
    if lost:
        print(f"  FAIL: {lost} incidents never reached the receiver; daemon log in {work}")
        sys.exit(1)


if __name__ == "__main__":
    main()
