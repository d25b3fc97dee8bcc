//! Facts about this machine that several stages need: its name, for alerts, incident ids and
//! runbook output. One helper, so an alert and the runbook evidence it carries name the host
//! the same way.

/// This machine's host name as the kernel has it (`gethostname(2)`, the same as
/// `/proc/sys/kernel/hostname`), or `"unknown"` when it cannot be read or is empty.
/// `[incidents] host` in the config overrides it where the daemon uses it.
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

#[cfg(test)]
mod tests {
    #[test]
    fn matches_the_kernel() {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert_eq!(super::hostname(), kernel.trim());
    }
}
