#!/usr/bin/env python3
"""Drives `xidwatch run` against the real /dev/kmsg for bench/latency.sh and bench/storm.sh.

Writes go to /dev/kmsg as root, each through a fresh open: the kernel rate-limits userspace
writers per open file, and a benchmark must not change kernel.printk_devkmsg on the machine.
Lines carry a PCI bus unique to this run so older lines in the ring buffer are told apart.
"""
import json, os, select, subprocess, sys, tempfile, time

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

tag = 0x40 + os.getpid() % 0x40
try:
    if mode == "latency":
        n = int(os.environ.get("N", "1000"))
        lat = []
        for i in range(n):
            bus, dev = tag + (i // 32) % 64, i % 32
            t0 = time.monotonic_ns()
            write("<3>NVRM: Xid (PCI:0001:%02x:%02x): 79, pid=1, name=bench, GPU has fallen off the bus.\n" % (bus, dev))
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
        line = "<4>NVRM: Xid (PCI:0001:%02x:00): 13, pid=1, name=bench, Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0): Out Of Range Address\n" % tag
        t0 = time.monotonic()
        for _ in range(n):
            write(line)
        t_written = time.monotonic() - t0
        incidents, digest, overruns = [], None, 0
        while digest is None:
            inc = next_incident(60)
            if inc is None:
                sys.exit("no digest within 60 s")
            incidents.append(inc)
            if inc["kind"] == "kmsg_overrun":
                overruns += 1
            if inc["phase"] == "digest" and inc.get("xid") == 13 and inc.get("pci") == "0001:%02x:00.0" % tag:
                digest = inc
        t_done = time.monotonic() - t0 - 5  # the digest waits for the 5 s window to close
        print("idle:      RSS %.1f MiB (target < 15), CPU %.2f%% over %.0f s (no busy polling)" % (idle_rss, idle_cpu, idle_s))
        print("storm:     %d lines written in %.2f s (%.0f lines/s offered)" % (n, t_written, n / t_written))
        print("kept up:   %.0f lines/s (all %d handled %.2f s after the first write)" % (n / max(t_done, t_written), n, max(t_done, t_written)))
        print("peak RSS:  %.1f MiB (target < 50)" % (status("VmHWM") / 1024))
        print("incidents: %d for the storm (opened + digest), %d kernel log overruns reported" % (
            sum(1 for i in incidents if i.get("xid") == 13), overruns))
        print("counts:    digest says %d of %d: %s" % (digest["count"], n,
              "exact" if digest["count"] == n else ("short by the overrun reported" if overruns else "NOT EXACT")))
finally:
    proc.terminate()
    proc.wait()
