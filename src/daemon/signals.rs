//! Signals, installed once before anything else is set up: SIGTERM and SIGINT become the one
//! [`Shutdown`] token the daemon's loop watches; SIGHUP is a [`Hangup`], a reload request.
//!
//! Installed first so that a stop requested while the rest is set up (NVML can take seconds to
//! open) waits for the loop and is a clean shutdown with the checkpoint saved, not a death by
//! the signal's default action.

use anyhow::Context;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::watch;

/// The one stop request: cheap to clone, and once requested it stays requested.
#[derive(Debug, Clone)]
pub struct Shutdown(watch::Receiver<bool>);

/// What requests the stop: a signal, or a test.
#[derive(Debug)]
pub struct StopHandle(watch::Sender<bool>);

impl Shutdown {
    /// A token and the handle that requests it.
    pub fn new() -> (StopHandle, Shutdown) {
        let (tx, rx) = watch::channel(false);
        (StopHandle(tx), Shutdown(rx))
    }

    /// Whether the stop has been requested.
    pub fn is_requested(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits until the stop is requested. A handle that is gone never requests it: the wait
    /// then lasts forever rather than stop a daemon nobody asked to stop.
    pub async fn requested(&mut self) {
        if self.0.wait_for(|stop| *stop).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl StopHandle {
    /// Requests the stop.
    pub fn stop(&self) {
        self.0.send_replace(true);
    }
}

/// SIGHUP: a reload request.
pub struct Hangup(Option<Signal>);

impl Hangup {
    /// A hangup that never comes (tests, and runs without signals).
    pub fn never() -> Hangup {
        Hangup(None)
    }

    /// The next SIGHUP.
    pub async fn recv(&mut self) {
        match &mut self.0 {
            Some(s) => {
                if s.recv().await.is_none() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
        }
    }
}

/// Installs the handlers: SIGTERM and SIGINT request the returned [`Shutdown`], SIGHUP arrives
/// through the [`Hangup`]. Call it on the runtime, before anything slow is set up.
pub fn install() -> anyhow::Result<(Shutdown, Hangup)> {
    let install = |kind| signal(kind).context("installing the signal handlers");
    let (mut term, mut int, hup) = (
        install(SignalKind::terminate())?,
        install(SignalKind::interrupt())?,
        install(SignalKind::hangup())?,
    );
    let (handle, shutdown) = Shutdown::new();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        handle.stop();
    });
    Ok((shutdown, Hangup(Some(hup))))
}
