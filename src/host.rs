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

#[cfg(test)]
mod tests {
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
