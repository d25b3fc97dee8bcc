//! systemd's notification protocol (`sd_notify`): one datagram per state change to the socket
//! named by `NOTIFY_SOCKET`. A no-op when the variable is unset, so the same binary runs under
//! systemd, in a terminal and in tests.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// A handle on the notification socket, if any.
#[derive(Debug)]
pub struct Notifier {
    sock: Option<(UnixDatagram, std::path::PathBuf, bool)>,
    /// Half the watchdog interval systemd asked for (`WATCHDOG_USEC`), when it asked.
    pub watchdog_every: Option<Duration>,
}

impl Notifier {
    pub fn from_env() -> Notifier {
        let watchdog_every = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|us| *us > 0)
            // Never below 1 ms: a zero period would spin (and tokio refuses it).
            .map(|us| Duration::from_micros((us / 2).max(1000)));
        let sock = std::env::var_os("NOTIFY_SOCKET").and_then(|p| {
            let s = p.to_string_lossy().into_owned();
            let d = UnixDatagram::unbound().ok()?;
            // '@' names a socket in the abstract namespace.
            let abstract_ns = s.starts_with('@');
            Some((d, std::path::PathBuf::from(s), abstract_ns))
        });
        Notifier {
            sock,
            watchdog_every,
        }
    }

    /// Sends one state line such as `READY=1`. Errors are ignored: a missing listener must never
    /// stop the watcher.
    pub fn notify(&self, state: &str) {
        let Some((sock, path, abstract_ns)) = &self.sock else {
            return;
        };
        if *abstract_ns {
            #[cfg(target_os = "linux")]
            {
                use std::os::linux::net::SocketAddrExt;
                let name = path.to_string_lossy();
                if let Ok(addr) =
                    std::os::unix::net::SocketAddr::from_abstract_name(&name.as_bytes()[1..])
                {
                    let _ = sock.send_to_addr(state.as_bytes(), &addr);
                }
            }
        } else {
            let _ = sock.send_to(state.as_bytes(), path);
        }
    }
}
