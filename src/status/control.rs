//! Local status for `xidwatch status`: a Unix socket in the state directory that answers every
//! connection with the current [`StatusSnapshot`] as JSON, and `status.json` beside it, rewritten
//! periodically, so the last known state survives the daemon.
//!
//! The socket is mode 0660 inside the state directory (0700 under systemd), and every peer is
//! checked with `SO_PEERCRED`: only root and the daemon's own user get an answer. The snapshot
//! names GPUs, processes and alert errors, which other local users have no business reading.
//! The protocol is one-shot and read-only: connect, read to the end; nothing the peer sends is
//! read, so there is nothing to parse and nothing to exploit.

use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

use super::telemetry::{StatusSnapshot, Telemetry};

/// The socket's name in the state directory.
pub const SOCKET_NAME: &str = "xidwatch.sock";
/// The status file's name in the state directory.
pub use crate::state::DAEMON_STATUS_FILE as STATUS_FILE;
/// How often the daemon should rewrite `status.json`; `xidwatch status` treats a file older
/// than three of these (with its pid gone) as the last word of a stopped daemon.
pub const STATUS_FILE_INTERVAL: Duration = Duration::from_secs(10);
/// Deadline for writing one answer.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections answered at once.
const MAX_CONNECTIONS: usize = 8;
/// Largest answer a client reads.
const MAX_ANSWER_BYTES: u64 = 64 << 20;

/// The socket path for a state directory.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join(SOCKET_NAME)
}

/// Whether a peer may read the status: root, or the user the daemon runs as.
pub fn peer_allowed(peer_uid: u32, daemon_uid: u32) -> bool {
    peer_uid == 0 || peer_uid == daemon_uid
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Binds the status socket at `path`: a stale socket left by a crash is removed first; a socket
/// another daemon still answers on, or a file that is not a socket, is an error (never deleted).
pub fn bind_status_socket(path: &Path) -> anyhow::Result<UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                anyhow::bail!(
                    "{}: another xidwatch is answering on this socket; two daemons must not share a state directory",
                    path.display()
                );
            }
            std::fs::remove_file(path)
                .with_context(|| format!("removing stale socket {}", path.display()))?;
        }
        Ok(_) => anyhow::bail!(
            "{}: exists and is not a socket; not touching it",
            path.display()
        ),
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("inspecting {}", path.display())),
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("setting the mode of {}", path.display()))?;
    Ok(listener)
}

/// Binds `path` (see [`bind_status_socket`]) and answers there until `shutdown` turns `true` (or
/// its sender is dropped); removes the socket on the way out. Errors only when binding fails.
pub async fn serve_status(
    path: &Path,
    telemetry: Arc<Telemetry>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let listener = bind_status_socket(path)?;
    serve_status_on(listener, telemetry, shutdown).await;
    let _ = std::fs::remove_file(path);
    Ok(())
}

/// Answers on an already bound listener until `shutdown`.
pub async fn serve_status_on(
    listener: UnixListener,
    telemetry: Arc<Telemetry>,
    shutdown: watch::Receiver<bool>,
) {
    let daemon_uid = euid();
    let limits = super::serve::Limits {
        name: "status socket",
        max_connections: MAX_CONNECTIONS,
        per_connection: WRITE_TIMEOUT,
    };
    let l = &listener;
    super::serve::accept_loop(
        limits,
        move || async move { l.accept().await.map(|(stream, _)| stream) },
        shutdown,
        |stream| {
            let t = telemetry.clone();
            async move {
                let _ = answer(stream, &t, daemon_uid).await;
            }
        },
    )
    .await;
}

async fn answer(
    mut stream: UnixStream,
    telemetry: &Telemetry,
    daemon_uid: u32,
) -> std::io::Result<()> {
    // tokio's peer_cred is getsockopt(SO_PEERCRED): the credentials the kernel recorded at
    // connect(), which the peer cannot forge.
    let cred = stream.peer_cred()?;
    if !peer_allowed(cred.uid(), daemon_uid) {
        tracing::debug!(uid = cred.uid(), pid = ?cred.pid(), "status socket: refused a peer");
        let msg = format!(
            "error: permission denied: uid {} may not read xidwatch's status (root or uid {daemon_uid} only)\n",
            cred.uid()
        );
        stream.write_all(msg.as_bytes()).await?;
        return stream.shutdown().await;
    }
    let mut body = serde_json::to_vec(&telemetry.snapshot()).map_err(std::io::Error::other)?;
    body.push(b'\n');
    stream.write_all(&body).await?;
    stream.shutdown().await
}

/// Why asking the socket failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// No socket, or nobody listening: the daemon is not running (or runs elsewhere).
    #[error("{path}: {message}")]
    NotListening { path: String, message: String },
    /// The socket (or its directory) is not ours to open.
    #[error("{path}: permission denied")]
    PermissionDenied { path: String },
    /// The daemon answered with a refusal.
    #[error("{0}")]
    Refused(String),
    #[error("{path}: no answer within {secs} s")]
    Timeout { path: String, secs: u64 },
    #[error("{path}: {message}")]
    Other { path: String, message: String },
}

/// Asks the daemon on `path` for its status, within `timeout` in all.
pub async fn query_status(path: &Path, timeout: Duration) -> Result<StatusSnapshot, QueryError> {
    let shown = path.display().to_string();
    let work = async {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|e| match e.kind() {
                ErrorKind::PermissionDenied => QueryError::PermissionDenied {
                    path: shown.clone(),
                },
                ErrorKind::NotFound | ErrorKind::ConnectionRefused => QueryError::NotListening {
                    path: shown.clone(),
                    message: e.to_string(),
                },
                _ => QueryError::Other {
                    path: shown.clone(),
                    message: e.to_string(),
                },
            })?;
        let mut buf = Vec::new();
        stream
            .take(MAX_ANSWER_BYTES)
            .read_to_end(&mut buf)
            .await
            .map_err(|e| QueryError::Other {
                path: shown.clone(),
                message: e.to_string(),
            })?;
        if buf.starts_with(b"error:") {
            return Err(QueryError::Refused(
                String::from_utf8_lossy(&buf).trim().to_string(),
            ));
        }
        serde_json::from_slice(&buf).map_err(|e| QueryError::Other {
            path: shown.clone(),
            message: format!("not a status document: {e}"),
        })
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(QueryError::Timeout {
            path: shown.clone(),
            secs: timeout.as_secs().max(1),
        }),
    }
}

/// Writes `<state_dir>/status.json` atomically (blocking: call it from `spawn_blocking` in the
/// daemon, or accept a short fsync on the runtime every [`STATUS_FILE_INTERVAL`]).
pub fn write_status_file(state_dir: &Path, snapshot: &StatusSnapshot) -> anyhow::Result<()> {
    let bytes = serde_json::to_vec_pretty(snapshot).context("serialising the status")?;
    let path = state_dir.join(STATUS_FILE);
    Ok(crate::state::write_atomic(
        &path,
        &bytes,
        crate::state::STATE_FILE_MODE,
    )?)
}

/// Reads `<state_dir>/status.json`; `Ok(None)` when there is none.
pub fn read_status_file(state_dir: &Path) -> anyhow::Result<Option<StatusSnapshot>> {
    let path = state_dir.join(STATUS_FILE);
    // Not a plain read: a FIFO planted here must not hang `xidwatch status`.
    let bytes = match crate::state::file::read_bounded(
        &path,
        crate::state::MAX_STATE_FILE,
        crate::state::file::Reader::Visitor,
    )? {
        Some(b) => b,
        None => return Ok(None),
    };
    let snap = serde_json::from_slice(&bytes)
        .with_context(|| format!("{}: not a status document", path.display()))?;
    Ok(Some(snap))
}

/// Whether process `pid` exists and looks like xidwatch (by `/proc/<pid>/comm` where readable),
/// so a recycled pid is not taken for the daemon.
pub fn process_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks for existence and permission; it sends nothing.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    let exists = rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    if !exists {
        return false;
    }
    // A zombie (exited, not yet reaped) is not running.
    if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        if let Some(state) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
        {
            if state == "Z" || state == "X" {
                return false;
            }
        }
    }
    match std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        Ok(comm) => comm.trim().starts_with("xidwatch"),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn who_may_read() {
        assert!(peer_allowed(0, 998));
        assert!(peer_allowed(998, 998));
        assert!(!peer_allowed(1000, 998));
    }

    #[test]
    fn status_file_round_trip_and_absence() {
        let d = tempfile::tempdir().unwrap();
        assert!(read_status_file(d.path()).unwrap().is_none());
        let t = Telemetry::started(5, 77);
        let s = t.snapshot();
        write_status_file(d.path(), &s).unwrap();
        assert_eq!(read_status_file(d.path()).unwrap(), Some(s));
        std::fs::write(d.path().join(STATUS_FILE), b"{torn").unwrap();
        let e = format!("{:#}", read_status_file(d.path()).unwrap_err());
        assert!(e.contains("status.json"), "{e}");
    }

    #[test]
    fn liveness_of_pids() {
        assert!(!process_alive(0));
        assert!(!process_alive(u32::MAX));
        // This test binary is not called xidwatch... unless it is (xidwatch-<hash>).
        let me = std::process::id();
        let comm = std::fs::read_to_string(format!("/proc/{me}/comm")).unwrap_or_default();
        assert_eq!(process_alive(me), comm.trim().starts_with("xidwatch"));
    }

    #[tokio::test]
    async fn refuses_to_clobber_a_file_that_is_not_a_socket() {
        let d = tempfile::tempdir().unwrap();
        let p = socket_path(d.path());
        std::fs::write(&p, b"precious").unwrap();
        let e = bind_status_socket(&p).unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"precious");
    }
}
