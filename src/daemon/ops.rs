//! The operations side: the Prometheus endpoint (when configured) and the status socket. Both
//! read the shared telemetry and run until [`Ops::stop`], which the daemon calls late in its
//! shutdown so that `status` answers until the last alert is handed over.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

use crate::config::Config;
use crate::status::telemetry::Telemetry;
use crate::status::{control, metrics};

/// The running endpoints.
pub(super) struct Ops {
    shutdown: tokio::sync::watch::Sender<bool>,
    /// The status socket's path when this daemon bound it, for the stop to remove.
    socket: Option<PathBuf>,
}

impl Ops {
    /// Starts the metrics endpoint and the status socket. A metrics address that cannot be
    /// bound is an error (it was asked for); a status socket that cannot be is said, and
    /// `status` reads status.json instead.
    pub(super) async fn start(cfg: &Config, tel: &Arc<Telemetry>) -> anyhow::Result<Ops> {
        let (shutdown, rx) = tokio::sync::watch::channel(false);
        let settings = &cfg.metrics_settings;
        for w in &settings.warnings {
            tracing::warn!("{w}");
        }
        if let Some(addr) = settings.listen {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("metrics: listening on {addr}"))?;
            tracing::info!("metrics on http://{addr}/metrics");
            tokio::spawn(metrics::serve(l, tel.clone(), rx.clone()));
        }
        let path = control::socket_path(&cfg.state_dir);
        let socket = match control::bind_status_socket(&path) {
            Ok(sock) => {
                tokio::spawn(control::serve_status_on(sock, tel.clone(), rx));
                Some(path)
            }
            Err(e) => {
                tracing::warn!(
                    "status socket unavailable ({e:#}); `xidwatch status` reads status.json"
                );
                None
            }
        };
        Ok(Ops { shutdown, socket })
    }

    /// Ends both. The socket this daemon bound goes with it: a clean stop leaves no file that
    /// `status` would have to tell from a crash's.
    pub(super) fn stop(self) {
        let _ = self.shutdown.send(true);
        if let Some(path) = self.socket {
            if let Err(e) = std::fs::remove_file(&path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!("cannot remove the status socket {}: {e}", path.display());
                }
            }
        }
    }
}
