# xidwatch's container image, for the Kubernetes DaemonSet (deploy/kubernetes/daemonset.yaml).
#
#   docker build -t registry.example.com/xidwatch:0.1.0 .
#
# Two stages: the build (the Rust toolchain, the whole source) and a small runtime image with the
# binary, the shipped runbooks in /usr/share/xidwatch/runbooks (the daemon's default runbook
# directory) and the read-only programs those runbooks run: lspci (pciutils), lsmod and modinfo
# (kmod), ps (procps), uname (coreutils). nvidia-smi and libnvidia-ml.so.1 are not in the image:
# the NVIDIA container runtime mounts the host driver's own copies into the pod (driver
# capability "utility"), so they always match the kernel module. No systemd: the steps that ask
# systemctl or journalctl about nvidia-persistenced and nvidia-fabricmanager are skipped in a
# pod with a note saying why; docs/install.md says where to look instead.
#
# Checked in CI by hadolint (.ci/fleet-checks.sh), and built there when a container tool runs.

FROM rust:1.88-bookworm AS build
WORKDIR /src
# The manifests and the lock first, so the dependencies are a cached layer of their own.
COPY Cargo.toml Cargo.lock build.rs ./
COPY tests/fake-nvml/Cargo.toml tests/fake-nvml/Cargo.toml
RUN mkdir -p src tests/fake-nvml/src runbooks \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs tests/fake-nvml/src/lib.rs \
    && cargo fetch --locked
COPY . .
# Release profile: optimised, no debug info (Cargo.toml [profile.release]).
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin xidwatch \
    && install -D -m 0755 target/release/xidwatch /out/usr/bin/xidwatch \
    && install -d -m 0755 /out/usr/share/xidwatch/runbooks \
    && install -m 0644 runbooks/*.toml /out/usr/share/xidwatch/runbooks/

FROM debian:bookworm-slim
# Versions are those of the Debian release the image is built from, with its security updates.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends pciutils kmod procps \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin xidwatch
COPY --from=build /out/ /
# The DaemonSet mounts the config (ConfigMap) on /etc/xidwatch and the node's /var/lib/xidwatch
# on the state directory; the image itself holds no config and no state.
ENV STATE_DIRECTORY=/var/lib/xidwatch \
    NVIDIA_DRIVER_CAPABILITIES=utility
# No USER: it runs as root, which reading /dev/kmsg in a pod needs (with a privileged
# container, see the DaemonSet); runbook programs run as the user xidwatch created above.
EXPOSE 9448
ENTRYPOINT ["/usr/bin/xidwatch"]
CMD ["run", "--config", "/etc/xidwatch/xidwatch.toml"]
