//! The optional Prometheus endpoint (`[metrics]`): `GET /metrics` renders a fresh
//! [`StatusSnapshot`] in the OpenMetrics text format on every scrape.
//!
//! The HTTP side is deliberately tiny (one request per connection, `Connection: close`): a
//! bounded request head, a per-connection deadline and a cap on connections served at once, so a
//! stuck or hostile client costs a few kilobytes and a few seconds, never the daemon. Anything but
//! `GET`/`HEAD /metrics`, `/healthz` and `/verdict` gets a 404 (or 405), and nothing the
//! client sends is echoed back.
//!
//! `GET /verdict` is the GPU state for machines: the `xidwatch.verdict/v1` document
//! ([`crate::verdict`], docs/verdict.schema.json), always 200, the state in the body.
//!
//! `GET /healthz` is the liveness check (the DaemonSet's `livenessProbe`): 200 while the
//! daemon's main loop keeps going round, 503 once it has not for [`HEALTH_STALE`]. A TCP check
//! cannot see that: this server runs on its own task and keeps accepting while the pipeline that
//! reads the kernel log is stuck.
//!
//! Metric names are a contract (deploy/prometheus/xidwatch.rules.yml and users' dashboards
//! depend on them): rename nothing, only add.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::telemetry::{StatusSnapshot, Telemetry, RUNBOOK_BUCKETS};
use crate::model::Severity;

/// The content type of what `/metrics` returns.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Largest request head read; a longer one gets 431 and the connection is closed.
const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// Whole-connection deadline: read the request, render, write the answer.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; more wait in the kernel's accept queue, then are refused.
const MAX_CONNECTIONS: usize = 16;
/// The liveness rule lives with the verdict, which judges a status document by it too.
pub use crate::verdict::status::{health, HEALTH_STALE};

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Every severity and incident phase, so `xidwatch_incidents_total` has all its series at 0
/// from the first scrape: a rule over `increase()` cannot see a series' first value.
const SEVERITIES: [Severity; 3] = [Severity::Info, Severity::Warning, Severity::Critical];
const PHASES: [&str; 3] = ["opened", "digest", "resolved"];

pub use crate::config::metrics::{MetricsConfig, MetricsSettings, DEFAULT_LISTEN};

/// Renders a snapshot as an OpenMetrics text exposition (ending in `# EOF`).
pub fn render(snapshot: &StatusSnapshot) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SnapshotCollector(snapshot.clone())));
    let mut out = String::with_capacity(4096);
    // Writing into a String cannot fail, and every name below is static and valid.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// A [`Collector`] over one snapshot: each scrape builds one from a fresh snapshot.
#[derive(Debug)]
struct SnapshotCollector(StatusSnapshot);

type Labels<'a> = Vec<(&'static str, &'a str)>;

/// One metric family: name (counters without `_total`, the encoder adds it), help, type.
fn family<'e>(
    enc: &'e mut DescriptorEncoder<'_>,
    name: &'static str,
    help: &'static str,
    ty: MetricType,
) -> Result<prometheus_client::encoding::MetricEncoder<'e>, std::fmt::Error> {
    enc.encode_descriptor(name, help, None, ty)
}

fn gauge(
    enc: &mut DescriptorEncoder<'_>,
    name: &'static str,
    help: &'static str,
    v: impl EncodeGaugeValue,
) -> Result<(), std::fmt::Error> {
    family(enc, name, help, MetricType::Gauge)?.encode_gauge(&v)
}

fn counter(
    enc: &mut DescriptorEncoder<'_>,
    name: &'static str,
    help: &'static str,
    v: u64,
) -> Result<(), std::fmt::Error> {
    family(enc, name, help, MetricType::Counter)?.encode_counter::<NoLabelSet, _, f64>(&v, None)
}

fn counter_family<'a>(
    enc: &mut DescriptorEncoder<'_>,
    name: &'static str,
    help: &'static str,
    series: impl IntoIterator<Item = (Labels<'a>, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut m = family(enc, name, help, MetricType::Counter)?;
    for (labels, v) in series {
        m.encode_family(&labels)?
            .encode_counter::<NoLabelSet, _, f64>(&v, None)?;
    }
    Ok(())
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = &self.0;
        let e = &mut enc;
        gauge(
            e,
            "xidwatch_up",
            "1 while the xidwatch daemon is running.",
            1i64,
        )?;
        gauge(
            e,
            "xidwatch_start_time_seconds",
            "When the daemon started, in seconds since the Unix epoch.",
            s.started_ms as f64 / 1000.0,
        )?;
        {
            let mut m = family(
                e,
                "xidwatch_build_info",
                "The running xidwatch version (value 1).",
                MetricType::Gauge,
            )?;
            let labels: Labels = vec![("version", &s.version)];
            m.encode_family(&labels)?.encode_gauge(&1i64)?;
        }

        counter_family(
            e,
            "xidwatch_findings",
            "Findings (Xids, NVML events, driver errors, ...) by kind, Xid, GPU PCI address and severity. pci=\"other\" holds findings past the series cap.",
            s.findings.iter().map(|f| {
                let labels: Labels = vec![
                    ("kind", &f.kind),
                    ("xid", &f.xid),
                    ("pci", &f.pci),
                    ("severity", f.severity.as_str()),
                ];
                (labels, f.count)
            }),
        )?;
        counter_family(
            e,
            "xidwatch_incidents",
            "Incidents handed to the alert stage, by severity and phase (opened: first alert; digest: counts after the window; resolved: quiet for the quiet period). Every series exists from the start, at 0.",
            SEVERITIES.iter().flat_map(|sev| {
                PHASES.iter().map(move |phase| {
                    let count = s
                        .incidents
                        .iter()
                        .filter(|i| i.severity == *sev && i.phase == *phase)
                        .map(|i| i.count)
                        .sum();
                    let labels: Labels = vec![("severity", sev.as_str()), ("phase", phase)];
                    (labels, count)
                })
            }),
        )?;
        gauge(
            e,
            "xidwatch_open_incidents",
            "Incidents open now.",
            s.open_incidents_total,
        )?;

        counter(
            e,
            "xidwatch_kmsg_records",
            "Kernel log records read.",
            s.kmsg.records,
        )?;
        counter(
            e,
            "xidwatch_kmsg_lost_records",
            "Kernel log records overwritten before xidwatch read them.",
            s.kmsg.lost,
        )?;
        counter(
            e,
            "xidwatch_kmsg_malformed",
            "Kernel log records skipped as malformed.",
            s.kmsg.malformed,
        )?;
        counter(
            e,
            "xidwatch_kmsg_out_of_sequence",
            "Kernel log sequence jumps: records whose sequence number went backwards or jumped further ahead than the ring can have lost (still read, not counted as lost).",
            s.kmsg.out_of_sequence,
        )?;
        counter(
            e,
            "xidwatch_kmsg_unread_lines",
            "Kernel log lines a reader failed on (a defect in xidwatch): skipped, the watch went on.",
            s.kmsg.unread,
        )?;
        counter(
            e,
            "xidwatch_kmsg_userspace_ignored",
            "Kernel log records written by user space and ignored.",
            s.kmsg.userspace_ignored,
        )?;
        gauge(
            e,
            "xidwatch_nvml_up",
            "1 when NVML is loaded and answering, 0 otherwise.",
            i64::from(s.nvml.up),
        )?;
        gauge(
            e,
            "xidwatch_gpus",
            "GPUs reported by NVML.",
            s.gpus.len() as u64,
        )?;
        if let (Some(expected), Some(present)) = (s.health.expected_gpus, s.health.present_gpus) {
            gauge(
                e,
                "xidwatch_gpus_expected",
                "GPUs this machine should have ([inventory] expected_gpus, or the previous boot's count).",
                expected,
            )?;
            gauge(
                e,
                "xidwatch_gpus_present",
                "GPUs present at the last health round (NVML's view, or the PCI bus without NVML).",
                present,
            )?;
        }
        {
            let mut m = family(
                e,
                "xidwatch_health_check_failing",
                "1 for each health check whose condition holds now on a GPU (the finding was raised and has not cleared).",
                MetricType::Gauge,
            )?;
            for (check, pci) in &s.health.failing {
                let labels: Labels = vec![("check", check), ("pci", pci)];
                m.encode_family(&labels)?.encode_gauge(&1i64)?;
            }
        }
        // The one state (crate::verdict), every state a series so `== 1` selects and a change
        // of state never leaves a stale series at 1.
        let verdict = crate::verdict::of_live(s, s.taken_ms);
        {
            let mut m = family(
                e,
                "xidwatch_gpu_state",
                "1 for the state each GPU is in (healthy, degraded, unknown, failed), 0 for the others; the state GET /verdict explains.",
                MetricType::Gauge,
            )?;
            for g in &verdict.gpus {
                let pci = g.pci.to_string();
                for st in crate::verdict::GpuState::ALL {
                    let labels: Labels = vec![("pci", &pci), ("state", st.as_str())];
                    m.encode_family(&labels)?
                        .encode_gauge(&i64::from(g.judged.state == st))?;
                }
            }
        }
        {
            let mut m = family(
                e,
                "xidwatch_host_state",
                "1 for the state the host is in (the worst of its GPUs and its host-level incidents), 0 for the others.",
                MetricType::Gauge,
            )?;
            for st in crate::verdict::GpuState::ALL {
                let labels: Labels = vec![("state", st.as_str())];
                m.encode_family(&labels)?
                    .encode_gauge(&i64::from(verdict.host.state == st))?;
            }
        }

        counter_family(
            e,
            "xidwatch_runbook_runs",
            "Runbook runs by runbook and result (ok, failed).",
            s.runbooks.iter().flat_map(|r| {
                let ok: Labels = vec![("runbook", &r.name), ("result", "ok")];
                let failed: Labels = vec![("runbook", &r.name), ("result", "failed")];
                [(ok, r.ok), (failed, r.failed)]
            }),
        )?;
        {
            let mut m = family(
                e,
                "xidwatch_runbook_duration_seconds",
                "How long runbook runs took.",
                MetricType::Histogram,
            )?;
            for r in &s.runbooks {
                let labels: Labels = vec![("runbook", &r.name)];
                let buckets: Vec<(f64, u64)> = RUNBOOK_BUCKETS
                    .iter()
                    .copied()
                    .chain([f64::INFINITY])
                    .zip(r.buckets.iter().copied().chain(std::iter::repeat(0)))
                    .collect();
                m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
                    r.duration_sum_secs,
                    r.ok + r.failed,
                    &buckets,
                    None,
                )?;
            }
        }

        let channels = s
            .alerts
            .as_ref()
            .map(|a| a.channels.as_slice())
            .unwrap_or(&[]);
        counter_family(
            e,
            "xidwatch_alerts_sent",
            "Alerts delivered, by channel.",
            channels.iter().map(|c| {
                let labels: Labels = vec![("channel", &c.name)];
                (labels, c.delivered_total)
            }),
        )?;
        counter_family(
            e,
            "xidwatch_alerts_failed",
            "Alerts given up for a channel (permanent failure, too many attempts, too old), by channel.",
            channels.iter().map(|c| {
                let labels: Labels = vec![("channel", &c.name)];
                (labels, c.failed_total)
            }),
        )?;
        counter_family(
            e,
            "xidwatch_alert_retries",
            "Temporary delivery failures that were retried, by channel.",
            channels.iter().map(|c| {
                let labels: Labels = vec![("channel", &c.name)];
                (labels, c.retries_total)
            }),
        )?;
        {
            let mut m = family(
                e,
                "xidwatch_alerts_queued",
                "Alerts in the outbox still waiting for a channel, by channel.",
                MetricType::Gauge,
            )?;
            for c in channels {
                let labels: Labels = vec![("channel", &c.name)];
                m.encode_family(&labels)?.encode_gauge(&(c.queued as u64))?;
            }
        }
        gauge(
            e,
            "xidwatch_outbox_alerts",
            "Alerts in the on-disk outbox (waiting for at least one channel).",
            s.alerts.as_ref().map_or(0, |a| a.outbox_count as u64),
        )?;
        counter(
            e,
            "xidwatch_alerts_dropped",
            "Alerts dropped from a full outbox.",
            s.alerts.as_ref().map_or(0, |a| a.dropped_total),
        )?;

        counter(
            e,
            "xidwatch_state_write_failures",
            "State writes (position, checkpoint, outbox, status) that failed.",
            s.state_write_failures,
        )?;
        counter(
            e,
            "xidwatch_config_reloads",
            "Config reloads that took effect.",
            s.config.reloads_ok,
        )?;
        counter(
            e,
            "xidwatch_config_reload_failures",
            "Config reloads refused because the new config was invalid (the old one stays).",
            s.config.reload_failures,
        )?;
        Ok(())
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown` turns `true` (or its sender is dropped).
/// Accept errors (too many open files, ...) are logged and retried after a pause; they never end
/// the server.
pub async fn serve(
    listener: TcpListener,
    telemetry: Arc<Telemetry>,
    shutdown: watch::Receiver<bool>,
) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!("metrics: serving http://{addr}/metrics");
    }
    let limits = super::serve::Limits {
        name: "metrics",
        max_connections: MAX_CONNECTIONS,
        per_connection: CONNECTION_TIMEOUT,
    };
    let l = &listener;
    super::serve::accept_loop(
        limits,
        move || async move { l.accept().await.map(|(stream, _)| stream) },
        shutdown,
        |stream| {
            let t = telemetry.clone();
            async move {
                let _ = handle(stream, &t).await;
            }
        },
    )
    .await;
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics { head: bool },
    Verdict { head: bool },
    Health { head: bool },
    NotFound,
    MethodNotAllowed,
    BadRequest,
}

/// Routes on the request line only; headers are read (bounded) and ignored.
fn route(head: &[u8]) -> Route {
    let line_end = head
        .windows(2)
        .position(|w| w == b"\r\n")
        .unwrap_or(head.len());
    let Ok(line) = std::str::from_utf8(&head[..line_end]) else {
        return Route::BadRequest;
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Route::BadRequest;
    };
    if !version.starts_with("HTTP/1.") {
        return Route::BadRequest;
    }
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => Route::Metrics { head: false },
        ("HEAD", "/metrics") => Route::Metrics { head: true },
        ("GET", "/healthz") => Route::Health { head: false },
        ("HEAD", "/healthz") => Route::Health { head: true },
        ("GET", "/verdict") => Route::Verdict { head: false },
        ("HEAD", "/verdict") => Route::Verdict { head: true },
        (_, "/metrics" | "/healthz" | "/verdict") => Route::MethodNotAllowed,
        _ => Route::NotFound,
    }
}

async fn handle(mut stream: TcpStream, telemetry: &Telemetry) -> std::io::Result<()> {
    let mut buf = vec![0u8; MAX_REQUEST_BYTES];
    let mut len = 0;
    let complete = loop {
        if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
            break true;
        }
        if len == buf.len() {
            break false;
        }
        let n = stream.read(&mut buf[len..]).await?;
        if n == 0 {
            // The client closed early; answer what we have if the request line is there.
            break buf[..len].windows(2).any(|w| w == b"\r\n");
        }
        len += n;
    };
    let (status, ctype, body, head_only) = if !complete && len == buf.len() {
        (
            "431 Request Header Fields Too Large",
            "text/plain; charset=utf-8",
            "request too large\n".to_string(),
            false,
        )
    } else {
        match route(&buf[..len]) {
            Route::Metrics { head } => {
                ("200 OK", CONTENT_TYPE, render(&telemetry.snapshot()), head)
            }
            Route::Verdict { head } => {
                // 200 whatever the state: the document says it; a failed GPU is not a failed
                // request.
                let v = crate::verdict::of_live(&telemetry.snapshot(), now_ms());
                let body = serde_json::to_string_pretty(&v).unwrap_or_default() + "\n";
                ("200 OK", "application/json", body, head)
            }
            Route::Health { head } => {
                let (ok, line) = health(telemetry.heartbeat_ms(), now_ms());
                let status = if ok {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                };
                (status, "text/plain; charset=utf-8", line + "\n", head)
            }
            Route::NotFound => (
                "404 Not Found",
                "text/plain; charset=utf-8",
                "not found; metrics are at /metrics, liveness at /healthz, the GPU state at /verdict\n".to_string(),
                false,
            ),
            Route::MethodNotAllowed => (
                "405 Method Not Allowed",
                "text/plain; charset=utf-8",
                "only GET and HEAD\n".to_string(),
                false,
            ),
            Route::BadRequest => (
                "400 Bad Request",
                "text/plain; charset=utf-8",
                "bad request\n".to_string(),
                false,
            ),
        }
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n{}\r\n",
        body.len(),
        if status.starts_with("405") { "Allow: GET, HEAD\r\n" } else { "" }
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    stream.write_all(&out).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alert::{AlertStatus, ChannelKind, ChannelStatus};
    use crate::model::{Category, Finding, FindingKind, PciAddress, Severity};

    #[test]
    fn config_defaults_validation_and_warnings() {
        let off = MetricsConfig::default();
        assert!(!off.is_enabled());
        assert_eq!(off.validate().unwrap().listen, None);

        let on: MetricsConfig = toml::from_str("enabled = true").unwrap();
        let s = on.validate().unwrap();
        assert_eq!(s.listen, Some(DEFAULT_LISTEN.parse().unwrap()));
        assert!(s.warnings.is_empty());

        // The shipped config and the DaemonSet set only `listen`.
        let fleet: MetricsConfig = toml::from_str("listen = \"0.0.0.0:9448\"").unwrap();
        let s = fleet.validate().unwrap();
        assert_eq!(s.listen, Some("0.0.0.0:9448".parse().unwrap()));
        assert!(s.warnings[0].contains("metrics.listen"), "{:?}", s.warnings);

        let forced_off: MetricsConfig =
            toml::from_str("enabled = false\nlisten = \"[::1]:9448\"").unwrap();
        assert_eq!(forced_off.validate().unwrap().listen, None);

        let bad: MetricsConfig = toml::from_str("listen = \"localhost:9448\"").unwrap();
        let e = bad.validate().unwrap_err();
        assert_eq!(e.key, "metrics.listen", "{e}");
        let e = MetricsConfig {
            enabled: Some(false),
            listen: Some("nope".into()),
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            e.key, "metrics.listen",
            "a typo is an error even when off: {e}"
        );

        assert!(toml::from_str::<MetricsConfig>("port = 1").is_err());
    }

    #[test]
    fn routes() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Metrics { head: false }
        );
        assert_eq!(
            route(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Route::Metrics { head: false }
        );
        assert_eq!(
            route(b"HEAD /metrics HTTP/1.1\r\n\r\n"),
            Route::Metrics { head: true }
        );
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Route::MethodNotAllowed
        );
        assert_eq!(
            route(b"GET /healthz HTTP/1.1\r\n\r\n"),
            Route::Health { head: false }
        );
        assert_eq!(
            route(b"POST /healthz HTTP/1.1\r\n\r\n"),
            Route::MethodNotAllowed
        );
        assert_eq!(
            route(b"GET /verdict HTTP/1.1\r\n\r\n"),
            Route::Verdict { head: false }
        );
        assert_eq!(
            route(b"DELETE /verdict HTTP/1.1\r\n\r\n"),
            Route::MethodNotAllowed
        );
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(route(b"GET /metrics/x HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(route(b"garbage\r\n\r\n"), Route::BadRequest);
        assert_eq!(route(b"GET /metrics SPDY/3\r\n\r\n"), Route::BadRequest);
        assert_eq!(
            route(b"\xff\xfe /metrics HTTP/1.1\r\n\r\n"),
            Route::BadRequest
        );
    }

    fn fed() -> Telemetry {
        let t = Telemetry::started(1_700_000_000_000, 1);
        let mut f = Finding::new(FindingKind::Xid, Severity::Critical, Category::Pcie, "x");
        f.xid = Some(79);
        f.pci = PciAddress::parse("0000:3b:00.0").ok();
        t.record_finding(&f);
        t.runbook_run("xid79", Duration::from_millis(700), true);
        t.set_alert_status(Some(AlertStatus {
            updated_ms: 0,
            channels: vec![ChannelStatus {
                name: "slack".into(),
                kind: ChannelKind::Webhook,
                queued: 1,
                delivered_total: 4,
                failed_total: 2,
                retries_total: 3,
                last_success_ms: None,
                last_failure_ms: None,
                last_error: None,
            }],
            outbox_count: 1,
            outbox_bytes: 10,
            dropped_total: 0,
            accepted_total: 5,
        }));
        t
    }

    #[test]
    fn gpu_and_host_state_gauges_follow_the_verdict() {
        let t = Telemetry::started(1_700_000_000_000, 1);
        let inc = crate::status::telemetry::IncidentSummary {
            id: "i79".into(),
            title: "GPU 0 fell off the bus".into(),
            severity: Severity::Critical,
            first_seen_ms: 1,
            last_seen_ms: 2,
            count: 1,
            kind: "fallen_off_bus".into(),
            pci: PciAddress::parse("0000:3b:00.0").ok(),
            state: false,
        };
        t.set_open_incidents(vec![inc]);
        t.heartbeat();
        let text = render(&t.snapshot());
        for line in [
            "xidwatch_gpu_state{pci=\"0000:3b:00.0\",state=\"failed\"} 1",
            "xidwatch_gpu_state{pci=\"0000:3b:00.0\",state=\"healthy\"} 0",
            "xidwatch_host_state{state=\"failed\"} 1",
            "xidwatch_host_state{state=\"unknown\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line} in:\n{text}"
            );
        }
    }

    #[test]
    fn health_fails_once_the_heartbeat_is_old() {
        let beat = 1_700_000_000_000;
        let (ok, line) = health(beat, beat + 5_000);
        assert!(ok, "{line}");
        assert_eq!(line, "ok: pipeline went round 5s ago");
        let (ok, line) = health(beat, beat + HEALTH_STALE.as_millis() as u64 + 1_000);
        assert!(!ok, "{line}");
        assert_eq!(
            line,
            "stalled: the pipeline has not gone round for 61s (limit 60s)"
        );
    }

    #[test]
    fn incident_series_exist_at_zero_before_the_first_incident() {
        let text = render(&Telemetry::started(1_700_000_000_000, 1).snapshot());
        for sev in ["info", "warning", "critical"] {
            for phase in ["opened", "digest", "resolved"] {
                let line =
                    format!("xidwatch_incidents_total{{severity=\"{sev}\",phase=\"{phase}\"}} 0");
                assert!(
                    text.lines().any(|l| l == line),
                    "missing {line} in:\n{text}"
                );
            }
        }
    }

    #[test]
    fn health_gauges_are_only_the_count_and_the_failing_checks() {
        let t = Telemetry::started(1_700_000_000_000, 1);
        t.set_health(crate::status::telemetry::HealthGauges {
            expected_gpus: Some(8),
            present_gpus: Some(7),
            failing: vec![("gpu_temperature".into(), "0000:2a:00.0".into())],
        });
        let text = render(&t.snapshot());
        for line in [
            "xidwatch_gpus_expected 8",
            "xidwatch_gpus_present 7",
            "xidwatch_health_check_failing{check=\"gpu_temperature\",pci=\"0000:2a:00.0\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(!text.contains("celsius"), "no readings: {text}");
    }

    #[test]
    fn render_names_labels_and_histogram() {
        let text = render(&fed().snapshot());
        for line in [
            "xidwatch_up 1",
            "xidwatch_start_time_seconds 1700000000.0",
            "# TYPE xidwatch_findings counter",
            "xidwatch_findings_total{kind=\"xid\",xid=\"79\",pci=\"0000:3b:00.0\",severity=\"critical\"} 1",
            "xidwatch_open_incidents 0",
            "xidwatch_kmsg_records_total 0",
            "xidwatch_kmsg_lost_records_total 0",
            "xidwatch_kmsg_malformed_total 0",
            "xidwatch_kmsg_out_of_sequence_total 0",
            "xidwatch_kmsg_unread_lines_total 0",
            "xidwatch_nvml_up 0",
            "xidwatch_gpus 0",
            "xidwatch_runbook_runs_total{runbook=\"xid79\",result=\"ok\"} 1",
            "xidwatch_runbook_runs_total{runbook=\"xid79\",result=\"failed\"} 0",
            "# TYPE xidwatch_runbook_duration_seconds histogram",
            "xidwatch_runbook_duration_seconds_bucket{le=\"0.5\",runbook=\"xid79\"} 0",
            "xidwatch_runbook_duration_seconds_bucket{le=\"1.0\",runbook=\"xid79\"} 1",
            "xidwatch_runbook_duration_seconds_bucket{le=\"+Inf\",runbook=\"xid79\"} 1",
            "xidwatch_runbook_duration_seconds_count{runbook=\"xid79\"} 1",
            "xidwatch_runbook_duration_seconds_sum{runbook=\"xid79\"} 0.7",
            "xidwatch_alerts_sent_total{channel=\"slack\"} 4",
            "xidwatch_alerts_failed_total{channel=\"slack\"} 2",
            "xidwatch_outbox_alerts 1",
            "xidwatch_alerts_dropped_total 0",
            "xidwatch_config_reload_failures_total 0",
            "# EOF",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
    }
}
