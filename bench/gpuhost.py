#!/usr/bin/env python3
"""Writes a log shaped like a GPU container host's kernel log, for bench/scan.sh and
bench/daemon_file.sh.

    gpuhost.py text N PATH      N lines, three prefix styles mixed (dmesg, journald, syslog)
    gpuhost.py kmsg N PATH      N /dev/kmsg records of the same chatter plus an Xid storm on 8 GPUs

The ordinary lines are what such a host logs all day: container networking (veth ports entering
blocking and forwarding state, promiscuous mode, renames), AppArmor audits naming /proc/N/status,
systemd mount units of containers, NIC link changes, NVMe and filesystem notices, conntrack and
cgroup OOM chatter. These share leading bytes with several of the prefilter's literals ("state",
"status", "blocking", "comm=", "nvme"), which the project's older bench log had none of. One line
in a thousand is an NVIDIA line (text mode); in kmsg mode half the records are an Xid storm.
"""
import random
import sys

mode, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
random.seed(25)

HEX = "0123456789abcdef"


def hexs(k):
    return "".join(random.choice(HEX) for _ in range(k))


def veth():
    return "veth" + hexs(7)


def ordinary():
    r = random.random()
    pid = random.randrange(1000, 4000000)
    port = random.randrange(1, 64)
    br = random.choice(["cni0", "docker0", "br-" + hexs(12)])
    if r < 0.30:
        v = veth()
        return random.choice([
            "%s: port %d(%s) entered blocking state" % (br, port, v),
            "%s: port %d(%s) entered disabled state" % (br, port, v),
            "%s: port %d(%s) entered forwarding state" % (br, port, v),
            "device %s entered promiscuous mode" % v,
            "device %s left promiscuous mode" % v,
            "IPv6: ADDRCONF(NETDEV_CHANGE): %s: link becomes ready" % v,
            "eth0: renamed from tmp%s" % hexs(5),
            "%s: renamed from eth0" % v,
        ])
    if r < 0.52:
        a = "audit: type=1400 audit(%d.%03d:%d): " % (
            random.randrange(1700000000, 1800000000), random.randrange(1000), random.randrange(1, 10**6))
        return a + random.choice([
            'apparmor="DENIED" operation="open" class="file" profile="cri-containerd.apparmor.d" '
            'name="/proc/%d/status" pid=%d comm="runc:[2:INIT]" requested_mask="r" denied_mask="r" '
            'fsuid=0 ouid=0' % (pid, pid),
            'apparmor="DENIED" operation="open" class="file" profile="docker-default" '
            'name="/proc/%d/stat" pid=%d comm="node_exporter" requested_mask="r" denied_mask="r" '
            'fsuid=65534 ouid=0' % (pid, pid),
            'apparmor="STATUS" operation="profile_replace" info="same as current profile, skipping" '
            'profile="unconfined" name="cri-containerd.apparmor.d" pid=%d comm="apparmor_parser"' % pid,
            'apparmor="DENIED" operation="ptrace" class="ptrace" profile="docker-default" pid=%d '
            'comm="ps" requested_mask="read" denied_mask="read" peer="unconfined"' % pid,
        ])
    if r < 0.66:
        cid = hexs(64)
        return random.choice([
            "systemd[1]: run-containerd-runc-k8s.io-%s-runc.%s.mount: Deactivated successfully." % (cid, hexs(6)),
            "systemd[1]: Started libcontainer container %s." % cid,
            "systemd[1]: cri-containerd-%s.scope: Deactivated successfully." % cid,
            "systemd[1]: var-lib-kubelet-pods-%s-volumes-kubernetes.io\\x7eprojected-kube\\x2dapi\\x2daccess\\x2d%s.mount: Succeeded." % (hexs(8), hexs(5)),
            "systemd[1]: Started Session %d of User ubuntu." % random.randrange(1, 99999),
            "systemd-journald[812]: Data hash table of /var/log/journal/%s/system.journal has a fill level at 75.0 (174763 of 233016 items, 134217728 file size, 767 bytes per hash table item), suggesting rotation." % hexs(32),
        ])
    if r < 0.80:
        return random.choice([
            "mlx5_core 0000:%02x:00.0 ens%df0np0: Link up" % (random.randrange(256), random.randrange(1, 9)),
            "mlx5_core 0000:%02x:00.1: mlx5e_ethtool_get_link_ksettings:1044:(pid %d): Unknown port type" % (random.randrange(256), pid),
            "ice 0000:31:00.0 ens2f0: NIC Link is up 100 Gbps Full Duplex, Requested FEC: RS-FEC, Negotiated FEC: RS-FEC, Autoneg Advertised: On, Autoneg Negotiated: False, Flow Control: None",
            "bond0: (slave ens1f1np1): link status definitely up, 25000 Mbps full duplex",
            "bond0: (slave ens1f0np0): link status up again after 0 ms",
            "e1000e 0000:00:1f.6 eno1: NIC Link is Up 1000 Mbps Full Duplex, Flow Control: Rx/Tx",
            "IPVS: rr: TCP 10.96.0.1:443 - no destination available",
            "nf_conntrack: nf_conntrack: table full, dropping packet",
            "TCP: request_sock_TCP: Possible SYN flooding on port 10250. Sending cookies.  Check SNMP counters.",
        ])
    if r < 0.92:
        d = random.randrange(8)
        return random.choice([
            "nvme nvme%d: I/O %d QID %d timeout, completion polled" % (d, random.randrange(1024), random.randrange(1, 64)),
            "nvme nvme%d: 63/0/0 default/read/poll queues" % d,
            "nvme%dn1: p1 p2" % d,
            "EXT4-fs (nvme%dn1p2): mounted filesystem with ordered data mode. Quota mode: none." % d,
            "XFS (nvme%dn1): Ending clean mount" % d,
            "overlayfs: upper fs does not support tmpfile.",
            "blk_update_request: I/O error, dev nvme%dn1, sector %d op 0x1:(WRITE) flags 0x800 phys_seg 1 prio class 0" % (d, random.randrange(10**9)),
        ])
    return random.choice([
        "kauditd_printk_skb: %d callbacks suppressed" % random.randrange(1, 200),
        "Memory cgroup out of memory: Killed process %d (python3) total-vm:%dkB, anon-rss:%dkB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:%dkB oom_score_adj:999" % (pid, random.randrange(10**7), random.randrange(10**7), random.randrange(10**5)),
        "oom_reaper: reaped process %d (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB" % pid,
        "python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=999",
        "cgroup: fork rejected by pids controller in /kubepods.slice/kubepods-burstable.slice",
        "perf: interrupt took too long (2503 > 2500), lowering kernel.perf_event_max_sample_rate to 79750",
        "hrtimer: interrupt took 41235 ns",
    ])


GPUS = ["0000:%02x:00" % b for b in (0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb)]


def nvidia():
    g = random.choice(GPUS)
    pid = random.randrange(1000, 4000000)
    return random.choice([
        "NVRM: Xid (PCI:%s): 13, pid=%d, name=python3, Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0): Out Of Range Address" % (g, pid),
        "NVRM: Xid (PCI:%s): 31, pid=%d, name=pt_main_thread, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f12_34560000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ" % (g, pid),
        "NVRM: Xid (PCI:%s): 43, pid=%d, name=python3, Ch 00000010" % (g, pid),
        "NVRM: GPU at PCI:%s: GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f" % g,
        "NVRM: GPU Board Serial Number: 1654922012345",
        "nvidia-uvm: Loaded the UVM driver, major device number 508.",
        "nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
        "nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  535.129.03",
    ])


def storm():
    g = random.choice(GPUS)
    return "NVRM: Xid (PCI:%s): %s" % (g, random.choice([
        "45, pid=%d, name=python3, Ch 00000008" % random.randrange(1000, 4000000),
        "13, pid=%d, name=python3, Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0): Out Of Range Address" % random.randrange(1000, 4000000),
        "31, pid=%d, name=python3, Ch 00000010, intr 10000000. MMU Fault" % random.randrange(1000, 4000000),
    ]))


MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

with open(path, "w") as f:
    t, ts, buf = 10.0, 10_000_000, []
    # A pool of generated ordinary lines, reused: random.choice per line keeps the generator fast.
    pool = [ordinary() for _ in range(20000)]
    for i in range(n):
        if mode == "text":
            t += random.random() * 0.01
            msg = nvidia() if i % 1000 == 999 else random.choice(pool)
            style = (i // 50000) % 3  # stretches of one style, as concatenated exports look
            if style == 0:
                line = "[%12.6f] %s" % (t, msg)
            elif style == 1:
                s = int(t)
                line = "2026-11-%02dT%02d:%02d:%02d+0000 gpu-node-17 kernel: %s" % (
                    1 + s // 86400 % 28, s // 3600 % 24, s // 60 % 60, s % 60, msg)
            else:
                s = int(t)
                line = "%s %2d %02d:%02d:%02d gpu-node-17 kernel: %s" % (
                    MONTHS[s // 2419200 % 12], 1 + s // 86400 % 28, s // 3600 % 24, s // 60 % 60, s % 60, msg)
            buf.append(line + "\n")
        else:
            ts += random.randrange(1, 500)
            fault = i % 2 == 0
            msg = storm() if fault else random.choice(pool)
            buf.append("%d,%d,%d,-;%s\n" % (4 if fault else 6, i, ts, msg))
        if len(buf) >= 10000:
            f.write("".join(buf))
            buf = []
    f.write("".join(buf))
