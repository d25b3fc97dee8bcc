#!/usr/bin/env bash
# Checks the systemd unit and the install layout with the real tools. Works
# offline and without systemd running as PID 1 (a container, a CI runner):
#
#   1. systemd-analyze verify on the unit prints nothing at all (it exits 0 on warnings).
#   2. systemd-analyze security --offline rates the unit's exposure at 2.2 or lower, and the unit's
#      system call filter lets the Landlock calls through that confine runbook steps.
#   3. `xidwatch install --root DIR` gives a tree that systemd-sysusers, systemd-tmpfiles and
#      `systemctl --root enable` accept, with the config group-readable by xidwatch only;
#      `xidwatch uninstall --root DIR` takes it all away again.
#
# The fleet configs (Prometheus, Alertmanager, Kubernetes, NPD), the Dockerfile and the .deb are
# checked by .ci/fleet-checks.sh.
#
# Missing tools come from Debian/Ubuntu packages via apt-get: systemd is installed.
#
# Usage: .ci/systemd-checks.sh   (from anywhere; honours CARGO_TARGET_DIR)
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$PWD
max_exposure=2.2

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

if ! command -v systemd-analyze >/dev/null; then
    apt_update systemd
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null
fi

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

step "the unit's system call filter allows Landlock"
# Whatever systemd's groups hold on this version, the unit's filter must name each call the
# steps' confinement makes, or the daemon's steps would run without Landlock.
for call in landlock_create_ruleset landlock_add_rule landlock_restrict_self; do
    if ! systemd-analyze syscall-filter @system-service | grep -qw "$call"; then
        grep '^SystemCallFilter=' "$unit" | grep -v '^SystemCallFilter=~' | grep -qw "$call" ||
            fail "$call is in no group of @system-service and the unit does not allow it"
    fi
done
echo "landlock calls allowed: OK"

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

printf '\nall systemd checks passed (exposure %s)\n' "$score"
