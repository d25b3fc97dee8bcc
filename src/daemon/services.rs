//! The daemon's side of the service watch ([`crate::source::services`]): starts its task. Its
//! events become state incidents for the host in the pipeline
//! (`Pipeline::apply_service`), the way health findings become incidents.

use tokio::sync::mpsc;

use crate::config::Config;
use crate::source::services::{watch_loop, ServiceEvent};

/// Starts the watch when `[services] enabled`; without it the receiver never yields (its
/// sender is kept in the returned pair).
pub(super) fn start(
    cfg: &Config,
) -> (
    mpsc::Receiver<ServiceEvent>,
    Option<mpsc::Sender<ServiceEvent>>,
) {
    let (tx, rx) = mpsc::channel(64);
    let svc = &cfg.services;
    if !svc.enabled || svc.units.is_empty() {
        tracing::info!("service watch: disabled ([services] enabled = false or no units)");
        return (rx, Some(tx));
    }
    let search = svc
        .search_path
        .clone()
        .unwrap_or_else(|| super::handover::runbook_env(cfg).search_path);
    tokio::spawn(watch_loop(
        svc.clone(),
        search,
        cfg.nvml.sysfs_root.clone(),
        tx,
    ));
    (rx, None)
}
