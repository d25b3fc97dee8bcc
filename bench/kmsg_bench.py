#!/usr/bin/env python3
"""Drives `xidwatch run` against the real /dev/kmsg for bench/latency.sh and bench/storm.sh.

Writes go to /dev/kmsg as root, each through a fresh open: the kernel rate-limits userspace
writers per open file, and a benchmark must not change kernel.printk_devkmsg on the machine.
Lines carry a PCI domain drawn at random for this run (one in 61,000 to repeat), so lines of
earlier runs still in the ring buffer, which xidwatch reads at start-up, never name the same GPU.
Exits non-zero when a result is wrong (a line without its incident, an inexact storm count).
"""
import json, os, random, select, subprocess, sys, tempfile, time

mode = sys.argv[1]
binary = sys.argv[2]
work = tempfile.mkdtemp(prefix="xidwatch-bench-")
cfg = os.path.join(work, "xidwatch.toml")
with open(cfg, "w") as f:
    f.write('[kmsg]\npath = "/dev/kmsg"\naccept_userspace = true\n[nvml]\nenabled = false\n'
            '[state]\ndir = "%s/state"\n[incidents]\nwindow_secs = %d\nmax_open = 8192\n'
            # latency: the pipeline's own; the settle delay before a first page is a set wait
            'settle_ms = %d\n'
            % (work, 5 if mode == "storm" else 600, 2000 if mode == "storm" else 0))

proc = subprocess.Popen([binary, "run", "--json", "--config", cfg], stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, bufsize=0)
out = proc.stdout
err = b""
deadline = time.time() + 30
# Drain both pipes while xidwatch reads the ring buffer (which holds lines of earlier runs).
while b"caught up" not in err:
    if time.time() > deadline:
        sys.exit("xidwatch did not start: " + err.decode(errors="replace"))
    r, _, _ = select.select([proc.stderr, out], [], [], 0.1)
    for fd in r:
        data = os.read(fd.fileno(), 1 << 16)
        if fd is proc.stderr:
            err += data
time.sleep(0.2)
while select.select([out], [], [], 0)[0]:
    if not os.read(out.fileno(), 1 << 16):
        break
buf = b""

def next_incident(timeout):
    global buf
    end = time.time() + timeout
    while True:
        while b"\n" not in buf:
            r, _, _ = select.select([out], [], [], max(0, end - time.time()))
            if not r:
                return None
            buf += os.read(out.fileno(), 1 << 16)
        line, buf = buf.split(b"\n", 1)
        inc = json.loads(line)
        if not inc.get("found_at_startup"):
            return inc

def write(line):
    fd = os.open("/dev/kmsg", os.O_WRONLY)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)

def status(key):
    with open("/proc/%d/status" % proc.pid) as f:
        for l in f:
            if l.startswith(key + ":"):
                return int(l.split()[1])
    return 0

def cpu_ticks():
    with open("/proc/%d/stat" % proc.pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])

# A domain no earlier run used (the ring buffer may still hold their lines).
dom = random.SystemRandom().randrange(0x1000, 0xffff)
try:
    if mode == "latency":
        n = int(os.environ.get("N", "1000"))
        lat = []
        for i in range(n):
            bus, dev = (i // 32) % 256, i % 32
            t0 = time.monotonic_ns()
            write("<3>NVRM: Xid (PCI:%04x:%02x:%02x): 79, pid=1, name=bench, GPU has fallen off the bus.\n" % (dom, bus, dev))
            inc = next_incident(5)
            t1 = time.monotonic_ns()
            if inc is None:
                sys.exit("no incident for line %d" % i)
            lat.append((t1 - t0) / 1e6)
        lat.sort()
        print("lines:     %d, each a new (GPU, Xid) so each opens an incident" % n)
        print("median:    %.3f ms" % lat[len(lat) // 2])
        print("p99:       %.3f ms  (target < 10 ms)" % lat[int(len(lat) * 0.99) - 1])
        print("max:       %.3f ms" % lat[-1])
    else:
        idle_s = float(os.environ.get("IDLE_SECS", "5"))
        time.sleep(1)
        c0 = cpu_ticks()
        time.sleep(idle_s)
        idle_cpu = (cpu_ticks() - c0) / os.sysconf("SC_CLK_TCK") / idle_s * 100
        idle_rss = status("VmRSS") / 1024
        n = int(os.environ.get("N", "100000"))
        gpu = "%04x:01:00.0" % dom
        line = "<4>NVRM: Xid (PCI:%04x:01:00): 13, pid=1, name=bench, Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0): Out Of Range Address\n" % dom
        marker = "<3>NVRM: Xid (PCI:%04x:02:00): 79, pid=1, name=bench, GPU has fallen off the bus.\n" % dom
        t0 = time.monotonic()
        for _ in range(n):
            write(line)
        t_written = time.monotonic() - t0
        # The marker goes in after the storm: xidwatch handles records in order, so its incident
        # comes out only once every storm line before it was handled. That, not the incident
        # window, is when xidwatch has kept up.
        write(marker)
        counts, lost, t_done, window_end = {}, 0, None, None
        while True:
            wait = 60 if window_end is None else max(0.0, window_end - time.monotonic())
            inc = next_incident(wait)
            if inc is None:
                if window_end is None:
                    sys.exit("FAIL: no incident for the marker within 60 s")
                break
            if inc["kind"] == "kmsg_overrun":
                for f in inc.get("findings", []):
                    lost += (f.get("detail") or {}).get("lost", 0)
            if inc.get("xid") == 13 and inc.get("pci") == gpu:
                counts[inc["id"]] = max(counts.get(inc["id"], 0), inc["count"])
            if inc.get("xid") == 79 and inc.get("pci") == "%04x:02:00.0" % dom and t_done is None:
                t_done = time.monotonic() - t0
                # Every storm window closes within 5 s (window_secs) of its last line: wait for
                # the digests, and a little more.
                window_end = time.monotonic() + 7
        total = sum(counts.values())
        print("idle:      RSS %.1f MiB (target < 15), CPU %.2f%% over %.0f s (no busy polling)" % (idle_rss, idle_cpu, idle_s))
        print("storm:     %d lines written in %.2f s (%.0f lines/s offered)" % (n, t_written, n / t_written))
        print("kept up:   %.0f lines/s (all %d handled %.2f s after the first write, marker included)" % (n / t_done, n, t_done))
        print("peak RSS:  %.1f MiB (target < 50)" % (status("VmHWM") / 1024))
        print("incidents: %d for the storm (final counts summed), %d records lost by the kernel log (overruns reported)" % (len(counts), lost))
        if total == n:
            print("counts:    %d of %d: exact" % (total, n))
        elif total < n and n - total <= lost:
            print("counts:    %d of %d: short by %d, no more than the %d the kernel reported lost" % (total, n, n - total, lost))
            sys.exit(1)
        else:
            print("counts:    %d of %d: NOT EXACT (%d lost reported)" % (total, n, lost))
            sys.exit(1)
finally:
    proc.terminate()
    proc.wait()
