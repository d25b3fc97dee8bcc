//! `[metrics]`: the optional Prometheus endpoint's settings. Here, with the rest of the
//! configuration, so the config does not depend on the daemon that serves them.

use crate::model::ConfigIssue;
use std::net::SocketAddr;

use serde::Deserialize;

/// Default address of the endpoint: loopback, the port registered for xidwatch's examples.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9448";

/// `[metrics]`
///
/// The endpoint is served when `enabled = true`, or when `enabled` is left out and `listen` is
/// set (so `[metrics]` + `listen = "0.0.0.0:9448"`, as the shipped config and the DaemonSet write
/// it, turns it on). `enabled = false` turns it off whatever `listen` says.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    pub enabled: Option<bool>,
    /// `host:port` to listen on; [`DEFAULT_LISTEN`] when unset.
    pub listen: Option<String>,
}

/// A checked `[metrics]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsSettings {
    /// Where to serve, or `None` when the endpoint is off.
    pub listen: Option<SocketAddr>,
    /// Things worth a warning in the log and in `xidwatch check`.
    pub warnings: Vec<String>,
}

impl MetricsConfig {
    /// Whether the endpoint is to be served.
    pub fn is_enabled(&self) -> bool {
        self.enabled.unwrap_or(self.listen.is_some())
    }

    /// Checks the table: the address must be an IP address and a port (names would need a
    /// resolver at start-up). Errors name the key (`metrics.listen: ...`). Warns when the
    /// address is not loopback: the metrics tell anyone who can reach them about this machine's
    /// GPUs and faults.
    pub fn validate(&self) -> Result<MetricsSettings, ConfigIssue> {
        let text = self.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
        let addr: SocketAddr = text.trim().parse().map_err(|_| {
            ConfigIssue::new(
                "metrics.listen",
                format!("expected an IP address and a port such as \"{DEFAULT_LISTEN}\" or \"0.0.0.0:9448\""),
            )
        })?;
        if !self.is_enabled() {
            return Ok(MetricsSettings {
                listen: None,
                warnings: Vec::new(),
            });
        }
        let mut warnings = Vec::new();
        if !addr.ip().is_loopback() {
            warnings.push(format!(
                "metrics.listen = \"{addr}\" is reachable from other machines: anyone who can connect sees this machine's GPUs and faults (no authentication); firewall the port or keep it on 127.0.0.1"
            ));
        }
        Ok(MetricsSettings {
            listen: Some(addr),
            warnings,
        })
    }
}
