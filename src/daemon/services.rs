//! The daemon's side of the service watch ([`crate::source::services`]): starts its task and
//! turns its events into state incidents for the host, the way health findings become
//! incidents: a down unit is a finding pushed to the engine (paged once; repeats fold in), and
//! "verified active" ends that incident with a resolved notice.

use tokio::sync::mpsc;

use crate::clock::Now;
use crate::config::Config;
use crate::incident::Origin;
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
        .unwrap_or_else(|| super::runbook_env(cfg).search_path);
    tokio::spawn(watch_loop(
        svc.clone(),
        search,
        cfg.nvml.sysfs_root.clone(),
        tx,
    ));
    (rx, None)
}

/// One event from the watch into the pipeline.
pub(super) fn apply(p: &mut super::pipeline::Pipeline, ev: ServiceEvent) {
    match ev {
        ServiceEvent::Down(f) => {
            tracing::warn!("service watch: {}", f.title);
            p.feed(f, Origin::Probe, Now::read(), false);
        }
        ServiceEvent::Active(f) => {
            tracing::info!("service watch: {} (verified active)", f.title);
            p.engine.resolve_state(&f, Now::read(), &mut p.out_buf);
        }
        ServiceEvent::Note { warn: true, text } => tracing::warn!("{text}"),
        ServiceEvent::Note { warn: false, text } => tracing::info!("{text}"),
    }
}
