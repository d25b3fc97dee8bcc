//! The accept loop shared by the status socket and the metrics endpoint: bounded connections
//! (a full server closes new ones at once rather than queueing them), a time limit per
//! connection, accept errors logged and retried after a pause, and an end on shutdown.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Semaphore};

/// Limits of one server.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// What the logs call it ("status socket", "metrics").
    pub name: &'static str,
    pub max_connections: usize,
    pub per_connection: Duration,
}

/// Accepts with `accept` and hands each connection to `handle` until `shutdown` turns `true` (or
/// its sender is dropped).
pub async fn accept_loop<S, A, AF, H, HF>(
    limits: Limits,
    mut accept: A,
    mut shutdown: watch::Receiver<bool>,
    handle: H,
) where
    S: Send + 'static,
    A: FnMut() -> AF,
    AF: Future<Output = io::Result<S>>,
    H: Fn(S) -> HF,
    HF: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        if *shutdown.borrow() {
            break;
        }
        tokio::select! {
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    break;
                }
            }
            accepted = accept() => match accepted {
                Ok(stream) => {
                    let Ok(permit) = slots.clone().try_acquire_owned() else {
                        // Full: close at once rather than queue without bound.
                        drop(stream);
                        continue;
                    };
                    let work = handle(stream);
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(limits.per_connection, work).await;
                        drop(permit);
                    });
                }
                Err(e) => {
                    tracing::warn!("{}: accept failed: {e}", limits.name);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            },
        }
    }
}
