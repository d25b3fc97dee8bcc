#!/usr/bin/env bash
# Checks the systemd unit, the install layout and the fleet configs with the real tools. Works
# offline and without systemd running as PID 1 (a container, a CI runner):
#
#   1. systemd-analyze verify on the unit prints nothing at all (it exits 0 on warnings).
#   2. systemd-analyze security --offline rates the unit's exposure at 2.5 or lower.
#   3. `xidwatch install --root DIR` gives a tree that systemd-sysusers, systemd-tmpfiles and
#      `systemctl --root enable` accept, with the config group-readable by xidwatch only;
#      `xidwatch uninstall --root DIR` takes it all away again.
#   4. promtool check rules + promtool test rules on deploy/prometheus.
#   5. amtool check-config + routing tests on deploy/alertmanager.
#   6. deploy/kubernetes parses, and every volume mount names a declared volume.
#   7. If cargo-deb is installed and runbooks/ has runbooks: the .deb holds what it should.
#
# Missing tools come from Debian/Ubuntu packages via apt-get: systemd is installed; promtool and
# amtool are only extracted from their packages (installing them would start daemons).
#
# Usage: .ci/systemd-checks.sh   (from anywhere; honours CARGO_TARGET_DIR)
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$PWD
max_exposure=2.5

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

step() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

apt_updated=
apt_update() {
    [ -n "$apt_updated" ] && return
    command -v apt-get >/dev/null || fail "apt-get not found: install $* by hand"
    apt-get update -qq
    apt_updated=1
}

# A tool from a Debian package without installing the package: download it, extract one file.
extract_tool() { # package path-in-package
    local pkg=$1 file=$2
    apt_update "$pkg"
    (cd "$tmp" && apt-get download -qq "$pkg" >/dev/null 2>&1) || fail "apt-get download $pkg"
    dpkg-deb -x "$tmp/${pkg}"_*.deb "$tmp/pkg-$pkg"
    echo "$tmp/pkg-$pkg$file"
}

if ! command -v systemd-analyze >/dev/null; then
    apt_update systemd
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null
fi
command -v promtool >/dev/null && command -v amtool >/dev/null || apt_update promtool amtool
promtool=$(command -v promtool || extract_tool prometheus /usr/bin/promtool)
amtool=$(command -v amtool || extract_tool prometheus-alertmanager /usr/bin/amtool)
[ -x "$promtool" ] && [ -x "$amtool" ] || fail "promtool or amtool unavailable"

step "build"
cargo build --quiet --bin xidwatch
target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target=$repo/$target ;; esac
bin=$target/debug/xidwatch
[ -x "$bin" ] || fail "no binary at $bin"
echo "$bin"

# verify checks that ExecStart= is executable, so check a copy that starts the binary just built.
# Everything else is the shipped unit, byte for byte.
mkdir "$tmp/unit"
unit=$tmp/unit/xidwatch.service
sed "s|^ExecStart=/usr/bin/xidwatch |ExecStart=$bin |" systemd/xidwatch.service >"$unit"
[ "$(diff systemd/xidwatch.service "$unit" | grep -c '^[<>]')" = 2 ] || fail "ExecStart= rewrite"

step "systemd-analyze verify systemd/xidwatch.service"
verify_out=$(systemd-analyze verify "$unit" 2>&1) || fail "verify exited $?: $verify_out"
[ -z "$verify_out" ] || fail "verify printed something:
$verify_out"
echo "nothing printed: OK"

step "systemd-analyze security --offline=yes systemd/xidwatch.service"
security_out=$(systemd-analyze security --offline=yes "$unit" 2>&1) || fail "security: $security_out"
# The settings that still count against the unit, each explained in the unit's comments.
grep '✗' <<<"$security_out" || true
overall=$(grep -m1 'Overall exposure level' <<<"$security_out") || fail "no overall line:
$security_out"
echo "$overall"
score=$(sed -E 's/.*: ([0-9]+\.[0-9]+) .*/\1/' <<<"$overall")
awk -v s="$score" -v m="$max_exposure" 'BEGIN { exit !(s <= m) }' ||
    fail "exposure $score is above $max_exposure"

step "xidwatch install --root (checked with systemd-sysusers, systemd-tmpfiles, systemctl)"
root=$tmp/root
mkdir "$root"
"$bin" install --root "$root" >"$tmp/install.out"
cat "$tmp/install.out"
grep -q "^ExecStart=/usr/local/bin/xidwatch run --config /etc/xidwatch/xidwatch.toml$" \
    "$root/etc/systemd/system/xidwatch.service" || fail "installed ExecStart="
installed_security=$(systemd-analyze security --offline=yes --root="$root" xidwatch.service 2>&1 |
    grep -m1 'Overall exposure level') || fail "security of the installed unit"
echo "installed unit: $installed_security"
systemd-sysusers --root="$root"
systemd-tmpfiles --root="$root" --create
gid=$(awk -F: '$1 == "xidwatch" { print $3 }' "$root/etc/group")
[ -n "$gid" ] || fail "systemd-sysusers created no group xidwatch"
[ "$(stat -c '%a %u %g' "$root/etc/xidwatch/xidwatch.toml")" = "640 0 $gid" ] ||
    fail "config is $(stat -c '%a %u:%g' "$root/etc/xidwatch/xidwatch.toml"), want 640 0:$gid"
echo "config 0640 root:xidwatch: OK"
systemctl --root="$root" enable xidwatch.service 2>&1 | grep -v 'non-existent unit' || true
[ -L "$root/etc/systemd/system/multi-user.target.wants/xidwatch.service" ] || fail "enable link"
# A second install changes nothing, now that the group exists as well.
"$bin" install --root "$root" | tee "$tmp/install2.out" | tail -1
grep -q '^install: 0 changed' "$tmp/install2.out" || fail "second install changed something"
"$bin" uninstall --root "$root" | tail -1
left=$(cd "$root" && find . -path ./etc/passwd -o -path ./etc/group -o -path ./etc/shadow \
    -o -path ./etc/gshadow -o -path ./etc/.pwd.lock -o \( \( -type f -o -type l \) -print \))
[ "$left" = "./etc/xidwatch/xidwatch.toml" ] || fail "uninstall left: $left"
echo "uninstall left only the config: OK"

step "promtool check rules / test rules (deploy/prometheus)"
"$promtool" check rules deploy/prometheus/xidwatch.rules.yml
"$promtool" test rules deploy/prometheus/xidwatch.rules.test.yml

step "amtool check-config / routing (deploy/alertmanager)"
am=deploy/alertmanager/route.example.yml
"$amtool" check-config "$am"
route() { # expected-receivers label=value...
    local want=$1
    shift
    "$amtool" config routes test --config.file="$am" --verify.receivers="$want" "$@" >/dev/null 2>&1 ||
        fail "route for $* should reach $want"
    echo "$* -> $want"
}
route gpu-pagerduty,gpu-slack alertname=GpuCriticalFault severity=critical host=n1 pci=0000:3b:00.0
route gpu-slack alertname=GpuXidRateHigh severity=warning host=n1 pci=0000:3b:00.0
route gpu-email,gpu-slack alertname=XidwatchDown severity=warning host=n1 component=watcher
# xidwatch's own GPU alerts (alertname Xidwatch<Kind>) are GPU faults, not watcher health.
route gpu-pagerduty,gpu-slack alertname=XidwatchXid severity=critical host=n1 gpu=3 pci=0000:3b:00.0 xid=79
route gpu-slack alertname=XidwatchXid severity=warning host=n1 gpu=3 pci=0000:3b:00.0 xid=13

step "deploy/kubernetes parses"
python3 - deploy/kubernetes/*.yaml <<'EOF'
import sys
import yaml

for path in sys.argv[1:]:
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    for d in docs:
        assert d.get("apiVersion") and d.get("kind"), f"{path}: a document without apiVersion/kind"
        if d["kind"] == "DaemonSet":
            pod = d["spec"]["template"]["spec"]
            volumes = {v["name"] for v in pod.get("volumes", [])}
            for c in pod["containers"]:
                for m in c.get("volumeMounts", []):
                    assert m["name"] in volumes, f"{path}: mount {m['name']} has no volume"
            assert d["spec"]["selector"]["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
    print(f"{path}: {', '.join(d['kind'] for d in docs)}: OK")
EOF

step ".deb contents"
if ! cargo deb --version >/dev/null 2>&1; then
    echo "skipped: cargo-deb is not installed (cargo install cargo-deb)"
elif ! ls runbooks/*.toml >/dev/null 2>&1; then
    echo "skipped: runbooks/ has no *.toml yet, and cargo-deb refuses a glob that matches nothing"
else
    deb=$(cargo deb 2>/dev/null | tail -1)
    dpkg-deb -c "$deb" | awk '{ print $1, $NF }' | tee "$tmp/deb.txt"
    for want in "-rwxr-xr-x ./usr/bin/xidwatch" \
        "-rw-r--r-- ./usr/lib/systemd/system/xidwatch.service" \
        "-rw-r----- ./etc/xidwatch/xidwatch.toml" \
        "-rw-r--r-- ./usr/lib/sysusers.d/xidwatch.conf" \
        "-rw-r--r-- ./usr/lib/tmpfiles.d/xidwatch.conf"; do
        grep -qxF -- "$want" "$tmp/deb.txt" || fail ".deb lacks $want"
    done
    dpkg-deb -f "$deb" Depends
    dpkg-deb -I "$deb" conffiles 2>/dev/null | grep -qx /etc/xidwatch/xidwatch.toml ||
        fail "the config is not a conffile"
fi

printf '\nall systemd checks passed (exposure %s)\n' "$score"
