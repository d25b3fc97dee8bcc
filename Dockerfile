# xidwatch's container image, for the Kubernetes DaemonSet (deploy/kubernetes/daemonset.yaml).
#
#   docker build -t registry.example.com/xidwatch:0.1.0 .
#
# builds the release binary in a Rust image and puts it in a small Debian image. From a binary
# already built (`cargo build --release --locked`), without a Rust image:
#
#   docker build --target prebuilt -t registry.example.com/xidwatch:0.1.0 .
#
# Both take the Debian base as a build argument, BASE (default debian:bookworm-slim); CI, which
# reaches no registry, builds `--target prebuilt` on a base it makes itself with debootstrap
# (.ci/image-checks.sh, docs/install.md).
#
# The runtime image: the binary, the shipped runbooks in /usr/share/xidwatch/runbooks (the
# daemon's default runbook directory), the shipped default config (every key commented out) in
# /etc/xidwatch/xidwatch.toml, and the read-only programs those runbooks run: lspci (pciutils),
# lsmod and modinfo (kmod), ps (procps), uname (coreutils). nvidia-smi and libnvidia-ml.so.1 are
# not in the image: the NVIDIA container runtime mounts the host driver's own copies into the pod
# (driver capability "utility"), so they always match the kernel module. No systemd: the steps
# that ask systemctl or journalctl about nvidia-persistenced and nvidia-fabricmanager are skipped
# in a pod with a note saying why; docs/install.md says where to look instead.
#
# Needs BuildKit (Docker's builder since 23.0) or buildah (podman): COPY --chmod, and only the
# stages a target needs are built (the Rust image is not pulled for --target prebuilt).
#
# Checked in CI by hadolint (.ci/fleet-checks.sh), and built, started and given an Xid 79 drill
# with podman (.ci/image-checks.sh).

ARG BASE=debian:bookworm-slim
ARG RUST_IMAGE=rust:1.88-bookworm

# --- The runtime, without the binary ------------------------------------------------------------
FROM ${BASE} AS runtime
# Versions are those of the Debian release the image is built from, with its security updates.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends pciutils kmod procps \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin xidwatch
COPY --chmod=0644 runbooks/*.toml /usr/share/xidwatch/runbooks/
# The DaemonSet mounts its config (a ConfigMap) on /etc/xidwatch over this default, and the
# node's /var/lib/xidwatch on the state directory; the image holds no state.
COPY --chown=root:xidwatch --chmod=0640 systemd/xidwatch.toml /etc/xidwatch/xidwatch.toml
ENV STATE_DIRECTORY=/var/lib/xidwatch \
    NVIDIA_DRIVER_CAPABILITIES=utility
# No USER: it runs as root, which reading /dev/kmsg in a pod needs (with a privileged
# container, see the DaemonSet); runbook programs run as the user xidwatch created above.
EXPOSE 9448
ENTRYPOINT ["/usr/bin/xidwatch"]
CMD ["run", "--config", "/etc/xidwatch/xidwatch.toml"]

# --- The runtime with a binary built outside (CI: the binary its tests ran against) -------------
FROM runtime AS prebuilt
# A path in the build context; .dockerignore lets target/release/xidwatch through.
ARG BINARY=target/release/xidwatch
COPY --chmod=0755 ${BINARY} /usr/bin/xidwatch

# --- The build, in a Rust image ------------------------------------------------------------------
FROM ${RUST_IMAGE} AS build
WORKDIR /src
# The manifests and the lock first, so the dependencies are a cached layer of their own.
COPY Cargo.toml Cargo.lock build.rs ./
COPY tests/fake-nvml/Cargo.toml tests/fake-nvml/Cargo.toml
RUN mkdir -p src tests/fake-nvml/src runbooks \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs tests/fake-nvml/src/lib.rs \
    && cargo fetch --locked
COPY . .
# Release profile: optimised, no debug info (Cargo.toml [profile.release]). A prebuilt binary
# the context let through is not used: the build writes its own.
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin xidwatch \
    && install -D -m 0755 target/release/xidwatch /out/usr/bin/xidwatch

# --- The default: the runtime with the binary built above ---------------------------------------
FROM runtime AS image
COPY --from=build /out/ /
