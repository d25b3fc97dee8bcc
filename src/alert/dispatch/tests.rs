//! The dispatcher in process, on paused time: backoffs, holds and rate limits that take minutes
//! run in milliseconds, and what they wait for is checked to the second.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{AlertSender, Dispatcher};
use crate::alert::channel::{BuiltChannels, Channel};
use crate::alert::config::AlertConfig;
use crate::alert::document::AlertDocument;
use crate::alert::input::Alert;
use crate::alert::retry::DeliveryError;
use crate::alert::sink::{Accepted, ChannelKind, Delivery, Sink};
use crate::runbook::Redactor;

/// A receiver that answers `503` with `Retry-After` for its first `fails` requests.
#[derive(Debug)]
struct Flaky {
    fails: u32,
    retry_after: Option<Duration>,
    calls: Arc<AtomicU32>,
}

impl Sink for Flaky {
    fn name(&self) -> &str {
        "hook"
    }

    fn kind(&self) -> ChannelKind {
        ChannelKind::Webhook
    }

    fn deliver<'a>(&'a self, _doc: &'a AlertDocument) -> Delivery<'a> {
        Box::pin(async move {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            if n < self.fails {
                Err(DeliveryError {
                    retry_after: self.retry_after,
                    ..DeliveryError::transient("HTTP 503")
                })
            } else {
                Ok(Accepted::default())
            }
        })
    }
}

/// `[alerts]` with one webhook called `hook` (its filter and rate limit are what the dispatcher
/// reads; the sink itself is [`Flaky`]) and nothing on standard output.
fn config(extra: &str) -> AlertConfig {
    #[derive(serde::Deserialize)]
    struct Root {
        alerts: AlertConfig,
    }
    let text = format!(
        "[alerts.stdout]\nenabled = false\n[[alerts.webhook]]\nname = \"hook\"\nurl = \"http://127.0.0.1:9/\"\nformat = \"json\"\n{extra}"
    );
    toml::from_str::<Root>(&text).unwrap().alerts
}

struct Running {
    sender: AlertSender,
    calls: Arc<AtomicU32>,
    stop: watch::Sender<bool>,
    handle: tokio::task::JoinHandle<()>,
    _state: tempfile::TempDir,
}

fn start(cfg: &AlertConfig, fails: u32, retry_after: Option<Duration>) -> Running {
    let calls = Arc::new(AtomicU32::new(0));
    let sink = Flaky {
        fails,
        retry_after,
        calls: calls.clone(),
    };
    let built = BuiltChannels(Arc::new(vec![Arc::new(Channel::new(
        Box::new(sink),
        &Redactor::default(),
    ))]));
    let state = tempfile::tempdir().unwrap();
    let (stop, shutdown) = watch::channel(false);
    let (sender, handle) = Dispatcher::start_built(cfg, &built, state.path(), shutdown).unwrap();
    Running {
        sender,
        calls,
        stop,
        handle,
        _state: state,
    }
}

impl Running {
    fn delivered(&self) -> u64 {
        let st = self.sender.status();
        st.channels
            .iter()
            .find(|c| c.name == "hook")
            .map_or(0, |c| c.delivered_total)
    }

    /// Waits (on tokio's clock) until `n` alerts were delivered; the time it took.
    async fn until_delivered(&self, n: u64, limit: Duration) -> Duration {
        let start = Instant::now();
        while self.delivered() < n {
            assert!(
                start.elapsed() < limit,
                "not delivered within {limit:?}: {:?}",
                self.sender.status()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        start.elapsed()
    }

    async fn stop(self) {
        self.stop.send(true).unwrap();
        self.handle.await.unwrap();
    }
}

fn alert(id: &str) -> Alert {
    let mut a = crate::alert::synthetic_alert("node-1", 1_764_404_043_123, Vec::new());
    a.incident.id = id.to_string();
    a
}

/// Three `503`s, each asking for a minute: the alert is tried four times and delivered once,
/// after the three minutes the receiver asked for, not sooner.
#[tokio::test(start_paused = true)]
async fn a_receiver_that_asks_to_wait_is_waited_for_and_then_delivered() {
    let run = start(&config(""), 3, Some(Duration::from_secs(60)));
    let ack = run.sender.submit(alert("a"), None, None).await.unwrap();
    assert_eq!(ack.await.unwrap(), super::Ack::Durable);
    let took = run.until_delivered(1, Duration::from_secs(3600)).await;
    assert!(took >= Duration::from_secs(180), "{took:?}");
    assert!(took < Duration::from_secs(200), "{took:?}");
    assert_eq!(run.calls.load(Ordering::SeqCst), 4);
    let st = run.sender.status();
    let hook = st.channels.iter().find(|c| c.name == "hook").unwrap();
    assert_eq!((hook.retries_total, hook.failed_total), (3, 0));
    assert_eq!(st.outbox_count, 0, "removed once delivered");
    run.stop().await;
}

/// An alert held for evidence that never comes goes out when its hold ends, not before.
#[tokio::test(start_paused = true)]
async fn a_held_alert_goes_out_when_its_hold_ends() {
    let run = start(&config(""), 0, None);
    let ack = run
        .sender
        .submit(alert("held"), Some(Duration::from_secs(300)), None)
        .await
        .unwrap();
    assert_eq!(ack.await.unwrap(), super::Ack::Durable);
    tokio::time::sleep(Duration::from_secs(290)).await;
    assert_eq!(run.calls.load(Ordering::SeqCst), 0, "still held");
    let took = run.until_delivered(1, Duration::from_secs(60)).await;
    assert!(took <= Duration::from_secs(15), "{took:?}");
    run.stop().await;
}

/// Over the rate limit, alerts wait for the window; none is dropped.
#[tokio::test(start_paused = true)]
async fn alerts_over_the_rate_limit_wait_for_the_window() {
    let cfg = config("rate_limit_count = 1\nrate_limit_window_secs = 120\n");
    let run = start(&cfg, 0, None);
    for id in ["r1", "r2", "r3"] {
        let ack = run.sender.submit(alert(id), None, None).await.unwrap();
        assert_eq!(ack.await.unwrap(), super::Ack::Durable);
    }
    run.until_delivered(1, Duration::from_secs(10)).await;
    let took = run.until_delivered(3, Duration::from_secs(600)).await;
    assert!(took >= Duration::from_secs(239), "{took:?}");
    assert!(took < Duration::from_secs(260), "{took:?}");
    assert_eq!(run.calls.load(Ordering::SeqCst), 3);
    run.stop().await;
}
