//! The sender's side of the durability receipts: every alert handed over comes back with an
//! acknowledgement once the outbox has it on disk.

use std::time::Duration;

use super::Ack;

/// Acknowledgements of alerts handed to the alert stage and not yet durable. The kernel log
/// position (and the incident snapshot saved with it) is written only when none is missing, so
/// the saved state never runs ahead of an alert that exists only in memory.
#[derive(Default)]
pub struct Acks {
    waiting: Vec<tokio::sync::oneshot::Receiver<Ack>>,
    /// An alert was handed over since the last save: save promptly.
    pub since_save: bool,
}

/// How long the loop waits for the alert stage to make a batch's alerts durable before it goes
/// on reading (the position then simply stays where it is until they are).
pub const ACK_WAIT: Duration = Duration::from_secs(2);

impl Acks {
    pub fn submitted(
        &mut self,
        r: Result<tokio::sync::oneshot::Receiver<Ack>, crate::alert::SendError>,
    ) {
        match r {
            Ok(rx) => {
                self.waiting.push(rx);
                self.since_save = true;
            }
            // Only at shutdown: the alert stage is gone, so the position must not move.
            Err(e) => {
                tracing::error!("alert stage: {e}");
                self.waiting.push(tokio::sync::oneshot::channel().1);
            }
        }
    }

    /// Waits (bounded) for the outstanding acknowledgements; true when none is missing.
    pub async fn settle(&mut self, limit: Duration) -> bool {
        if self.waiting.is_empty() {
            return true;
        }
        let deadline = tokio::time::Instant::now() + limit;
        let mut left = Vec::new();
        for mut rx in std::mem::take(&mut self.waiting) {
            match tokio::time::timeout_at(deadline, &mut rx).await {
                Ok(Ok(_)) => {}
                // The stage dropped it without an answer: never durable.
                Ok(Err(_)) => left.push(tokio::sync::oneshot::channel().1),
                Err(_) => left.push(rx),
            }
        }
        self.waiting = left;
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn acknowledgements_gate_the_save() {
        use crate::alert::dispatch::Ack;
        let mut acks = Acks::default();
        assert!(acks.settle(Duration::ZERO).await, "nothing handed over");
        let (tx, rx) = tokio::sync::oneshot::channel();
        acks.submitted(Ok(rx));
        assert!(acks.since_save);
        assert!(
            !acks.settle(Duration::from_millis(10)).await,
            "not durable yet"
        );
        tx.send(Ack::Durable).unwrap();
        assert!(acks.settle(Duration::from_millis(10)).await);
        // An acknowledgement dropped unanswered never counts as durable.
        let (tx, rx) = tokio::sync::oneshot::channel::<Ack>();
        acks.submitted(Ok(rx));
        drop(tx);
        assert!(!acks.settle(Duration::from_millis(10)).await);
        assert!(
            !acks.settle(Duration::from_millis(10)).await,
            "and stays so"
        );
    }
}
