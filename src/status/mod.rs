//! The running daemon's status side, for whoever asks from outside the loop: the counters it
//! records into ([`telemetry`]), `status.json` and the status socket ([`control`]), the
//! Prometheus endpoint and `GET /verdict` ([`metrics`]), and the bounded listener both serve on
//! ([`serve`]). A room of its own between the verdict (which it serves) and the daemon (which
//! records into it): `xidwatch status`, `npd-check` and `health-check` read it without the
//! daemon's pipeline.

pub mod control;
pub mod metrics;
pub(crate) mod serve;
pub mod telemetry;
