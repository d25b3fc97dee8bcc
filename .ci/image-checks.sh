#!/usr/bin/env bash
# The container image, really built and run, with no registry: podman (runc, cgroupfs, file
# events) as root on a Debian machine.
#
#   1. Tools: podman, runc, debootstrap from apt-get when missing.
#   2. The release binary (`cargo build --release --locked`; nothing to do when it is current).
#   3. A Debian bookworm base made here: `debootstrap --variant=minbase` from the mirror apt uses,
#      `podman import`ed as localhost/debian-base:bookworm. The rootfs tarball is cached in
#      target/image-ci/, the imported base in podman's storage there, so reruns skip both.
#   4. The image: the Dockerfile's `prebuilt` stage on that base (BASE build argument), with the
#      binary from step 2. Its contents: the binary runs, the runbook programs, the runbooks, the
#      default config (which `xidwatch check` accepts), the xidwatch user.
#   5. A drill in the running image: a kmsg record file with an AER report and an Xid 79, NVML
#      off, a JSON webhook to a receiver on the host's loopback (.ci/webhook_sink.py, host
#      network), the state directory a tmpfs. The page must arrive within 60 s and be the
#      Xid 79 "fell off the bus" incident for 0000:17:00.0, one page for the AER report and the
#      Xid, with the fallen-off-bus runbook's lspci steps done inside the image; the daemon
#      then stops cleanly on SIGTERM (podman stop).
#
# Every step is bounded in time; a failure prints the container's log and the receiver's.
# Needs root (podman's root storage, debootstrap). Environment: XIDWATCH_DEBIAN_MIRROR (else read
# from apt's sources), XIDWATCH_IMAGE_STORAGE_DRIVER (overlay, else vfs when overlay fails).
#
# Usage: .ci/image-checks.sh   (from anywhere; honours CARGO_TARGET_DIR)
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$PWD
started=$SECONDS

step() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "needs root (podman's root storage, debootstrap)"

target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target=$repo/$target ;; esac
cache=$target/image-ci
mkdir -p "$cache"
suite=bookworm
base=localhost/debian-base:$suite
image=localhost/xidwatch:ci
name=xidwatch-ci-drill-$$

tmp=$(mktemp -d)
sink_pid=
container=
cleanup() {
    local rc=$?
    if [ "$rc" != 0 ] && [ -n "$container" ]; then
        echo "--- container log ($container)" >&2
        pod 30 logs "$container" >&2 2>&1 | tail -80 >&2 || true
    fi
    if [ "$rc" != 0 ] && [ -s "$tmp/sink.log" ]; then
        echo "--- webhook receiver log" >&2
        tail -40 "$tmp/sink.log" >&2 || true
    fi
    if [ -n "$container" ]; then pod 60 rm -f -t 5 "$container" >/dev/null 2>&1 || true; fi
    if [ -n "$sink_pid" ]; then kill "$sink_pid" 2>/dev/null || true; wait "$sink_pid" 2>/dev/null || true; fi
    # The overlay driver mounts its directory on itself and leaves it so: unmounted, target/ can
    # be removed (cargo clean) after the run. The cached images stay.
    if [ -n "${driver:-}" ] && mountpoint -q "$cache/storage-$driver/$driver" 2>/dev/null; then
        umount "$cache/storage-$driver/$driver" 2>/dev/null || true
    fi
    rm -rf "$tmp"
    exit "$rc"
}
trap cleanup EXIT

apt_updated=
apt_install() {
    command -v apt-get >/dev/null || fail "apt-get not found: install $* by hand"
    if [ -z "$apt_updated" ]; then timeout 300 apt-get update -qq; apt_updated=1; fi
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

step "tools"
missing=()
for t in podman runc debootstrap python3; do
    command -v "$t" >/dev/null || missing+=("$t")
done
[ ${#missing[@]} = 0 ] || apt_install "${missing[@]}"
# podman's own defaults for this machine: runc, cgroupfs (no systemd to ask for cgroups), events
# in a file (no journald), and no default ulimits (raising RLIMIT_NOFILE past the caller's hard
# limit fails in a CI container).
cat >"$tmp/containers.conf" <<'EOF'
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
export CONTAINERS_CONF=$tmp/containers.conf
driver=${XIDWATCH_IMAGE_STORAGE_DRIVER:-overlay}
# podman on this script's own storage (target/image-ci), bounded: pod SECONDS ARGS...
pod() {
    local limit=$1
    shift
    timeout "$limit" podman --root "$cache/storage-$driver" --runroot "$cache/run-$driver" \
        --storage-driver "$driver" --cgroup-manager=cgroupfs --events-backend=file "$@"
}
echo "$(podman --version), $(runc --version | head -1), debootstrap $(dpkg-query -W -f='${Version}' debootstrap 2>/dev/null || echo '?')"

step "release binary"
timeout 1800 cargo build --release --locked --quiet --bin xidwatch
bin=$target/release/xidwatch
[ -x "$bin" ] || fail "no $bin"
"$bin" --version

step "base image $base (debootstrap --variant=minbase $suite)"
mirror=${XIDWATCH_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
    # The first Debian archive apt uses for $suite itself (not -security/-updates): deb822 stanzas
    # (sources.list.d/*.sources), then one-line entries.
    mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v s="$suite" '
        BEGIN { RS = ""; FS = "\n" }
        { uris = ""; ok = 0; deb = 0
          for (i = 1; i <= NF; i++) {
            if ($i ~ /^URIs:/) { sub(/^URIs:[ \t]*/, "", $i); split($i, u, /[ \t]+/); uris = u[1] }
            if ($i ~ /^Suites:/) { n = split($i, w, /[ \t]+/); for (j = 2; j <= n; j++) if (w[j] == s) ok = 1 }
            if ($i ~ /^Types:/ && $i ~ /(^|[ \t])deb([ \t]|$)/) deb = 1
          }
          if (ok && deb && uris != "") { print uris; exit } }' || true)
fi
if [ -z "$mirror" ]; then
    mirror=$(awk -v s="$suite" '
        $1 == "deb" { i = 2; if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ } if ($(i + 1) == s) { print $i; exit } }' \
        /etc/apt/sources.list 2>/dev/null || true)
fi
mirror=${mirror:-http://deb.debian.org/debian}
rootfs_tar=$cache/debian-$suite-minbase.tar
if [ ! -s "$rootfs_tar" ]; then
    echo "debootstrap from $mirror"
    rm -rf "$cache/rootfs"
    timeout 900 debootstrap --variant=minbase "$suite" "$cache/rootfs" "$mirror" >"$tmp/debootstrap.log" 2>&1 ||
        { tail -30 "$tmp/debootstrap.log" >&2; fail "debootstrap"; }
    # No downloaded packages or package lists in the image (the Dockerfile's apt-get update
    # fetches its own).
    rm -rf "$cache/rootfs"/var/cache/apt/archives/*.deb "$cache/rootfs"/var/lib/apt/lists/*
    tar -C "$cache/rootfs" --numeric-owner -cf "$rootfs_tar.part" .
    mv "$rootfs_tar.part" "$rootfs_tar"
    rm -rf "$cache/rootfs"
else
    echo "cached rootfs: $rootfs_tar"
fi
import_base() {
    pod 300 image exists "$base" && return 0
    pod 300 import --quiet "$rootfs_tar" "$base" >/dev/null
}
import_base || fail "podman import"
if ! pod 120 run --rm --network=host "$base" /bin/true 2>"$tmp/probe.log"; then
    if [ -z "${XIDWATCH_IMAGE_STORAGE_DRIVER:-}" ] && [ "$driver" = overlay ]; then
        echo "overlay storage does not work here ($(tail -1 "$tmp/probe.log")); using vfs"
        driver=vfs
        import_base || fail "podman import (vfs)"
        pod 120 run --rm --network=host "$base" /bin/true || fail "a container of $base does not start"
    else
        cat "$tmp/probe.log" >&2
        fail "a container of $base does not start"
    fi
fi
debian=$(pod 120 run --rm --network=host "$base" cat /etc/debian_version)
echo "$base: Debian $debian, storage $driver"

step "image $image (Dockerfile, --target prebuilt, BASE=$base)"
# The binary from the build context: the repository itself when the binary is in its target/
# (.dockerignore lets target/release/xidwatch through), else a context of just what the stage
# copies.
case $bin in
    "$repo"/*) context=$repo; binary_arg=${bin#"$repo"/} ;;
    *)
        context=$tmp/context
        mkdir -p "$context/systemd"
        cp -r runbooks "$context/"
        cp systemd/xidwatch.toml "$context/systemd/"
        cp "$bin" "$context/xidwatch"
        binary_arg=xidwatch
        ;;
esac
[ "$binary_arg" = target/release/xidwatch ] || [ "$context" != "$repo" ] ||
    fail "the binary is at $binary_arg in the repository, which .dockerignore leaves out"
# --network=host: the runtime stage's apt-get reaches the mirror the way apt does here.
pod 900 build --quiet --network=host --pull=never -f "$repo/Dockerfile" --target prebuilt \
    --build-arg BASE="$base" --build-arg BINARY="$binary_arg" -t "$image" "$context" >"$tmp/build.log" 2>&1 ||
    { tail -40 "$tmp/build.log" >&2; fail "podman build"; }
pod 60 images --format '{{.Repository}}:{{.Tag}} {{.ID}} {{.Size}}' "$image"

step "image contents"
in_image() { pod 120 run --rm --network=host --entrypoint /bin/sh "$image" -c "$1"; }
got=$(pod 60 run --rm --network=host "$image" --version)
[ "$got" = "$("$bin" --version)" ] || fail "the image's binary says '$got', the one built says '$("$bin" --version)'"
echo "xidwatch --version: $got"
# shellcheck disable=SC2016
in_image 'for p in lspci lsmod modinfo ps uname; do command -v $p >/dev/null || { echo "no $p"; exit 1; }; done' ||
    fail "a runbook program is missing from the image"
# shellcheck disable=SC2016
in_image 'ls /usr/share/xidwatch/runbooks/*.toml >/dev/null && id xidwatch >/dev/null &&
    [ "$(stat -c "%a %U:%G" /etc/xidwatch/xidwatch.toml)" = "640 root:xidwatch" ] &&
    [ "$(stat -c %a /usr/bin/xidwatch)" = 755 ]' ||
    fail "runbooks, the xidwatch user, the default config (0640 root:xidwatch) or the binary's mode"
[ "$(# shellcheck disable=SC2016
in_image 'ls /usr/share/xidwatch/runbooks' | sort)" = "$(cd runbooks && printf '%s\n' *.toml | sort)" ] ||
    fail "the image's runbooks are not the shipped ones"
cmp -s <(in_image 'cat /etc/xidwatch/xidwatch.toml') systemd/xidwatch.toml || fail "the default config is not the shipped one"
pod 60 run --rm --network=host "$image" check --config /etc/xidwatch/xidwatch.toml >"$tmp/check.log" 2>&1 ||
    { cat "$tmp/check.log" >&2; fail "xidwatch check rejects the image's default config"; }
echo "runbook programs, runbooks, xidwatch user, default config (xidwatch check: OK): OK"

step "drill: an Xid 79 in a kmsg record file, the page to a loopback webhook"
drill=$tmp/drill
mkdir -p "$drill/etc"
: >"$drill/kmsg"
: >"$tmp/pages.jsonl"
python3 -u .ci/webhook_sink.py 127.0.0.1 0 "$tmp/pages.jsonl" >"$tmp/sink.out" 2>"$tmp/sink.log" &
sink_pid=$!
for _ in $(seq 100); do
    grep -q '^listening ' "$tmp/sink.out" 2>/dev/null && break
    kill -0 "$sink_pid" 2>/dev/null || fail "the webhook receiver exited"
    sleep 0.1
done
port=$(awk '/^listening / { print $2 }' "$tmp/sink.out")
[ -n "$port" ] || fail "the webhook receiver did not start"
echo "receiver on 127.0.0.1:$port"
cat >"$drill/etc/xidwatch.toml" <<EOF
[kmsg]
path = "/drill/kmsg"
[nvml]
enabled = false
[state]
dir = "/var/lib/xidwatch"
[incidents]
host = "ci-image-drill"
[[alerts.webhook]]
name = "drill"
url = "http://127.0.0.1:$port/page"
format = "json"
EOF
chmod 0640 "$drill/etc/xidwatch.toml"
pod 60 run --rm --network=host -v "$drill/etc:/etc/xidwatch:ro" "$image" \
    check --config /etc/xidwatch/xidwatch.toml >"$tmp/check.log" 2>&1 ||
    { cat "$tmp/check.log" >&2; fail "xidwatch check rejects the drill config"; }
# The image's own entrypoint and command (run --config /etc/xidwatch/xidwatch.toml), the config
# mounted over the default as the DaemonSet does, the state directory a tmpfs.
container=$name
started_run=$SECONDS
pod 120 run -d --name "$name" --network=host \
    -v "$drill/etc:/etc/xidwatch:ro" -v "$drill/kmsg:/drill/kmsg:ro" \
    --tmpfs /var/lib/xidwatch:rw,mode=0755 "$image" >/dev/null || fail "podman run"
# The fault as a GPU falling off the bus logs it, appended to the file once the daemon has read
# it to its end and follows it, as new records come on /dev/kmsg.
until pod 30 logs "$name" 2>&1 | grep -q 'kernel log: caught up'; do
    [ "$(pod 30 inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" = true ] ||
        fail "the container stopped at start-up (exit $(pod 30 inspect -f '{{.State.ExitCode}}' "$name" 2>/dev/null))"
    [ "$SECONDS" -lt "$((started_run + 30))" ] || fail "the daemon did not read the record file within 30 s"
    sleep 0.2
done
cat >>"$drill/kmsg" <<'EOF'
3,4410,9512100231,-;pcieport 0000:16:01.0: AER: Uncorrected (Fatal) error received: 0000:17:00.0
3,4411,9512105231,-;NVRM: Xid (PCI:0000:17:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
EOF
# The pages received, kept for a look after the run.
pages=$cache/drill-pages.jsonl
xid_page() {
    python3 - "$tmp/pages.jsonl" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    page = json.loads(json.loads(line)["body"])
    if page.get("kind") == "xid" and page.get("xid") == 79:
        sys.exit(0)
sys.exit(1)
EOF
}
deadline=$((SECONDS + 60))
until xid_page; do
    [ "$(pod 30 inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" = true ] ||
        fail "the container stopped before paging (exit $(pod 30 inspect -f '{{.State.ExitCode}}' "$name" 2>/dev/null))"
    if [ "$SECONDS" -ge "$deadline" ]; then
        cp "$tmp/pages.jsonl" "$pages"
        fail "no Xid 79 page within 60 s ($(wc -l <"$tmp/pages.jsonl") other requests, in $pages)"
    fi
    sleep 0.5
done
echo "page received after $((SECONDS + 60 - deadline)) s"
cp "$tmp/pages.jsonl" "$pages"
python3 - "$tmp/pages.jsonl" <<'EOF' || fail "the page (all requests received: $pages)"
import json, sys

reqs = [json.loads(line) for line in open(sys.argv[1])]
pages = [json.loads(r["body"]) for r in reqs]
for page in pages:
    print(f"page: {page.get('headline')}")
# One fault, one page: the AER report folds into the Xid 79's incident.
if len(pages) != 1:
    sys.exit(f"{len(pages)} pages for one fault")
req, page = reqs[0], pages[0]
h = {k.lower(): v for k, v in req["headers"].items()}
evidence = page.get("evidence") or []
checks = [
    (req["path"] == "/page", f"path {req['path']}"),
    (h.get("content-type", "").startswith("application/json"), f"content-type {h.get('content-type')}"),
    (h.get("x-xidwatch-schema") == "xidwatch.alert/v1", "X-Xidwatch-Schema"),
    (page.get("schema") == "xidwatch.alert/v1", f"schema {page.get('schema')}"),
    (page.get("phase") == "opened", f"phase {page.get('phase')}"),
    (page.get("test") is False, "a test alert"),
    (page.get("kind") == "xid" and page.get("xid") == 79, f"kind {page.get('kind')}, xid {page.get('xid')}"),
    (page.get("severity") == "critical", f"severity {page.get('severity')}"),
    (page.get("host") == "ci-image-drill", f"host {page.get('host')}"),
    ((page.get("gpu") or {}).get("pci") == "0000:17:00.0", f"gpu {page.get('gpu')}"),
    ("fell off the bus" in page.get("title", ""), f"title {page.get('title')}"),
    ("Xid 79" in page.get("headline", ""), f"headline {page.get('headline')}"),
    # The fallen-off-bus runbook ran in the image: its lspci steps, through the step sandbox.
    (any(e.get("runbook") == "fallen-off-bus" and any(
        st.get("kind") == "run" and "lspci" in str(st.get("target")) and st.get("status") == "done"
        and st.get("exit_code") == 0 for st in e.get("steps", [])) for e in evidence),
     "no fallen-off-bus evidence with an lspci step done: " + json.dumps(
        [{"runbook": e.get("runbook"), "steps": [(st.get("name"), st.get("status")) for st in e.get("steps", [])]}
         for e in evidence])),
]
bad = [what for ok, what in checks if not ok]
if bad:
    print(json.dumps(page, indent=2)[:4000], file=sys.stderr)
    sys.exit("wrong page: " + "; ".join(bad))
print("Xid 79, critical, 0000:17:00.0, fell off the bus, the fallen-off-bus runbook's lspci steps: OK")
for e in evidence:
    steps = e.get("steps", [])
    done = sum(st.get("status") == "done" for st in steps)
    print(f"evidence {e.get('runbook')}: {done} of {len(steps)} steps done ({', '.join(sorted({st.get('status', '?') for st in steps}))})")
EOF
pod 60 stop -t 10 "$name" >/dev/null || fail "podman stop"
code=$(pod 30 inspect -f '{{.State.ExitCode}}' "$name")
echo "container stopped, exit status $code"
[ "$code" = 0 ] || fail "the daemon exited $code on SIGTERM"
pod 60 rm "$name" >/dev/null
container=
kill "$sink_pid" 2>/dev/null || true
wait "$sink_pid" 2>/dev/null || true
sink_pid=

printf '\nimage checks passed (%d s)\n' "$((SECONDS - started))"
