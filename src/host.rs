//! Facts about this machine that several stages need: its name, for alerts, incident ids and
//! runbook output. One helper, so an alert and the runbook evidence it carries name the host
//! the same way.

/// This machine's host name as the kernel has it (`gethostname(2)`, the same as
/// `/proc/sys/kernel/hostname`), or `"unknown"` when it cannot be read or is empty.
/// Alerts use [`alert_host`], which prefers `[incidents] host` and `$NODE_NAME`.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).trim().to_string();
    if name.is_empty() {
        "unknown".into()
    } else {
        name
    }
}

/// The environment variable that names the node under Kubernetes. The DaemonSet sets it from the
/// downward API (`spec.nodeName`): a pod's own host name is the pod's, not the node's, and alerts,
/// incident ids and the Prometheus rules' `host` label must all name the node.
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// The name alerts and evidence use for this machine: `[incidents] host` when the config sets
/// it, else `$NODE_NAME` when set and not empty (Kubernetes), else [`hostname`].
pub fn alert_host(configured: Option<&str>) -> String {
    resolve_host(
        configured,
        std::env::var(NODE_NAME_ENV).ok().as_deref(),
        hostname,
    )
}

/// [`alert_host`] with its inputs passed in, for tests. Blank values count as unset.
pub fn resolve_host(
    configured: Option<&str>,
    node_name: Option<&str>,
    hostname: impl FnOnce() -> String,
) -> String {
    let set = |v: Option<&str>| v.map(str::trim).filter(|v| !v.is_empty()).map(String::from);
    set(configured)
        .or_else(|| set(node_name))
        .unwrap_or_else(hostname)
}

/// Why `program` cannot answer on this system even where it is installed, or `None` when it
/// can: `systemctl` asks systemd, which a container (the Kubernetes DaemonSet's pod) or a
/// machine booted with another init does not run; `journalctl` reads a journal, which a
/// container does not have. Runbook steps that run them are then skipped with this reason
/// instead of failing with a message that does not say why.
pub fn unavailable_here(program: &str) -> Option<String> {
    unavailable_under(program, std::path::Path::new("/"))
}

/// [`unavailable_here`] for a system whose root is `root` (tests).
pub fn unavailable_under(program: &str, root: &std::path::Path) -> Option<String> {
    let dir = |p: &str| root.join(p).is_dir();
    match program {
        // sd_booted(3): systemd creates this directory when it runs as PID 1.
        "systemctl" if !dir("run/systemd/system") => Some(
            "systemd is not running here (no /run/systemd/system: a container, or another init \
             system); check the service on the host itself"
                .into(),
        ),
        "journalctl" if !dir("run/log/journal") && !dir("var/log/journal") => Some(
            "no systemd journal here (neither /run/log/journal nor /var/log/journal: a container \
             has none); read it on the host itself"
                .into(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn systemd_programs_are_unavailable_without_systemd_or_a_journal() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let why = |p: &str| super::unavailable_under(p, r);
        assert!(why("systemctl")
            .unwrap()
            .contains("systemd is not running here"));
        assert!(why("journalctl")
            .unwrap()
            .contains("no systemd journal here"));
        assert_eq!(why("lspci"), None);
        std::fs::create_dir_all(r.join("run/systemd/system")).unwrap();
        std::fs::create_dir_all(r.join("var/log/journal")).unwrap();
        assert_eq!(why("systemctl"), None);
        assert_eq!(why("journalctl"), None);
    }

    #[test]
    fn config_then_node_name_then_hostname() {
        let h = || "pod-xyz".to_string();
        assert_eq!(super::resolve_host(Some("cfg"), Some("node-7"), h), "cfg");
        assert_eq!(super::resolve_host(None, Some("node-7"), h), "node-7");
        assert_eq!(super::resolve_host(Some(" "), Some("node-7"), h), "node-7");
        assert_eq!(super::resolve_host(None, Some(""), h), "pod-xyz");
        assert_eq!(super::resolve_host(None, None, h), "pod-xyz");
    }

    #[test]
    fn matches_the_kernel() {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert_eq!(super::hostname(), kernel.trim());
    }
}
