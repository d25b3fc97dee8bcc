//! Prometheus Alertmanager: `POST /api/v2/alerts` to one or more instances.
//!
//! Labels identify the problem (alertname, host, gpu, pci, xid, severity, kind, category) and
//! never carry sequence numbers, ids or timestamps, so a digest of the same incident updates the
//! same Alertmanager alert instead of opening another. Annotations carry the words: summary,
//! description, action, and a bounded evidence excerpt. `endsAt` is set `resolve_after_secs`
//! after the send, since xidwatch does not re-send while a fault persists (an incident that
//! ends only when verified, a lost GPU or a failing check, is kept firing until its resolved
//! notice instead); the incident's
//! resolved notice (after its quiet period) posts the same labels with `endsAt` = now, which
//! resolves the alert at once. A host page posts one alert per GPU, and a resolved notice also
//! ends the alerts of the incidents it superseded ([`postables`]).

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use std::path::PathBuf;

use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use serde::{Deserialize, Serialize};

use crate::alert::document::{rfc3339, AlertDocument};
use crate::alert::error::ConfigIssue;
use crate::alert::http::{
    check_headers, check_http_url, header_map, http_client, post, read_pem_certs,
};
use crate::alert::retry::{DeliveryError, FailureKind};
use crate::alert::secret::Secret;
use crate::alert::sink::{
    check_rate, check_timeout, default_http_timeout, default_rate_count, default_rate_window,
    rate_limit, Accepted, ChannelCommon, ChannelConfig, ChannelKind, Delivery, Sink,
};
use crate::model::Severity;

/// `[[alerts.alertmanager]]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AlertmanagerConfig {
    pub name: String,
    /// Base URLs (`http://am-1:9093`); `/api/v2/alerts` is appended. Every URL is posted to; the
    /// alert counts as delivered when at least one accepted it (an HA cluster shares it).
    pub urls: Vec<String>,
    /// Extra labels added to every alert (e.g. `cluster = "a"`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// `endsAt` is set this long after the send; Alertmanager resolves the alert then.
    #[serde(default = "default_resolve_after")]
    pub resolve_after_secs: u64,
    /// Extra headers (e.g. `Authorization`); values are secrets.
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Link put in `generatorURL` (e.g. a dashboard for the host).
    #[serde(default)]
    pub generator_url: Option<String>,
    /// Whether this channel is told when an incident resolves (quiet for `incidents.quiet_secs`).
    #[serde(default)]
    pub send_resolved: Option<bool>,
    #[serde(default)]
    pub min_severity: Option<Severity>,
    #[serde(default = "default_rate_count")]
    pub rate_limit_count: u32,
    #[serde(default = "default_rate_window")]
    pub rate_limit_window_secs: u64,
    #[serde(default = "default_http_timeout")]
    pub timeout_secs: u64,
}

fn default_resolve_after() -> u64 {
    24 * 3600
}

fn is_label_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

impl ChannelConfig for AlertmanagerConfig {
    fn table(&self) -> &'static str {
        "alertmanager"
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> ChannelKind {
        ChannelKind::Alertmanager
    }

    fn common(&self, min_severity: Severity) -> ChannelCommon {
        ChannelCommon {
            name: self.name.clone(),
            kind: ChannelKind::Alertmanager,
            min_severity: self.min_severity.unwrap_or(min_severity),
            rate_limit: rate_limit(self.rate_limit_count, self.rate_limit_window_secs),
            send_resolved: self.send_resolved.unwrap_or(true),
        }
    }

    fn validate(&self, key: &str, errs: &mut Vec<ConfigIssue>) {
        let a = self;
        if a.urls.is_empty() {
            errs.push(ConfigIssue::new(
                format!("{key}.urls"),
                "at least one URL is needed",
            ));
        }
        for (j, u) in a.urls.iter().enumerate() {
            match check_http_url(u) {
                Err(msg) => errs.push(ConfigIssue::new(
                    format!("{key}.urls[{j}]"),
                    msg.to_string(),
                )),
                // URLs are not secrets (they appear in logs and Debug): no credentials in them.
                Ok(url) if !url.username().is_empty() || url.password().is_some() => {
                    errs.push(ConfigIssue::new(
                        format!("{key}.urls[{j}]"),
                        "credentials in the URL are refused; put them in `headers` (a secret)",
                    ))
                }
                Ok(_) => {}
            }
        }
        for name in a.labels.keys() {
            if !is_label_name(name) {
                errs.push(ConfigIssue::new(
                    format!("{key}.labels"),
                    format!("{name:?} is not a valid label name"),
                ));
            } else if RESERVED_LABELS.contains(&name.as_str()) {
                errs.push(ConfigIssue::new(
                    format!("{key}.labels"),
                    format!("{name:?} is set by xidwatch itself"),
                ));
            }
        }
        if a.resolve_after_secs < 60 {
            errs.push(ConfigIssue::new(
                format!("{key}.resolve_after_secs"),
                "must be at least 60",
            ));
        }
        if let Some(g) = &a.generator_url {
            if let Err(msg) = check_http_url(g) {
                errs.push(ConfigIssue::new(
                    format!("{key}.generator_url"),
                    msg.to_string(),
                ));
            }
        }
        check_headers(key, &a.headers, errs);
        if let Some(p) = &a.ca_file {
            if let Err(msg) = read_pem_certs(p) {
                errs.push(ConfigIssue::new(format!("{key}.ca_file"), msg.to_string()));
            }
        }
        check_rate(key, a.rate_limit_count, a.rate_limit_window_secs, errs);
        check_timeout(key, a.timeout_secs, errs);
    }

    fn secrets(&self) -> Vec<(String, &Secret)> {
        self.headers
            .iter()
            .map(|(h, s)| (format!("headers.{h}"), s))
            .collect()
    }

    /// A URL with a password in its userinfo (refused by validation, but never echoed either).
    fn secret_shapes(&self) -> Vec<String> {
        self.urls
            .iter()
            .filter(|u| reqwest::Url::parse(u).is_ok_and(|u| u.password().is_some()))
            .cloned()
            .collect()
    }

    fn urls(&self) -> Vec<(String, String)> {
        self.urls
            .iter()
            .enumerate()
            .map(|(j, u)| (format!("urls[{j}]"), u.clone()))
            .collect()
    }

    fn build(&self) -> Result<Box<dyn Sink>, String> {
        Ok(Box::new(AlertmanagerChannel::build(self)?))
    }
}

/// `endsAt` for an alert that only its resolved notice ends (see [`ends_verified`]).
///
/// [`ends_verified`]: crate::incident::ends_verified
const UNTIL_RESOLVED_MS: u64 = 10 * 365 * 24 * 3600 * 1000;

/// Labels xidwatch sets itself; configured extra labels may not use these names.
pub const RESERVED_LABELS: &[&str] = &[
    "alertname",
    "host",
    "instance",
    "gpu",
    "pci",
    "xid",
    "severity",
    "kind",
    "category",
    "uuid",
    "test",
];

const EVIDENCE_MAX: usize = 2000;
const ANNOTATION_MAX: usize = 4000;

/// One alert in the v2 API's `postableAlerts` array.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PostableAlert {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    #[serde(rename = "startsAt")]
    pub starts_at: String,
    #[serde(rename = "endsAt")]
    pub ends_at: String,
    #[serde(rename = "generatorURL", skip_serializing_if = "Option::is_none")]
    pub generator_url: Option<String>,
}

/// `XidwatchXid`, `XidwatchFallenOffBus`, ...: CamelCase of the finding kind.
pub fn alertname(kind: &str) -> String {
    let mut s = String::from("Xidwatch");
    for part in kind.split('_') {
        let mut c = part.chars();
        if let Some(f) = c.next() {
            s.extend(f.to_uppercase());
            s.push_str(c.as_str());
        }
    }
    s
}

fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut o: String = s.chars().take(max.saturating_sub(1)).collect();
        o.push('…');
        o
    }
}

/// Builds the alert for `doc`; `now_ms` is the send time (for `endsAt`).
pub fn postable(
    doc: &AlertDocument,
    extra_labels: &BTreeMap<String, String>,
    resolve_after_secs: u64,
    generator_url: Option<&str>,
    now_ms: u64,
) -> PostableAlert {
    let mut labels = BTreeMap::new();
    for (k, v) in extra_labels {
        labels.insert(k.clone(), v.clone());
    }
    labels.insert("alertname".into(), alertname(&doc.kind));
    labels.insert("host".into(), doc.host.clone());
    labels.insert("severity".into(), doc.severity.as_str().into());
    labels.insert("kind".into(), doc.kind.clone());
    labels.insert("category".into(), doc.category.as_str().into());
    if let Some(x) = doc.xid {
        labels.insert("xid".into(), x.to_string());
    }
    if let Some(g) = &doc.gpu {
        if let Some(i) = g.index {
            labels.insert("gpu".into(), i.to_string());
        }
        if let Some(p) = &g.pci {
            labels.insert("pci".into(), p.clone());
        }
        if let Some(u) = &g.uuid {
            labels.insert("uuid".into(), u.clone());
        }
    }
    if doc.test {
        labels.insert("test".into(), "true".into());
    }

    let mut ann = BTreeMap::new();
    ann.insert("summary".into(), cut(&doc.headline, ANNOTATION_MAX));
    ann.insert("description".into(), cut(&doc.meaning, ANNOTATION_MAX));
    ann.insert("action".into(), cut(&doc.next_steps, ANNOTATION_MAX));
    ann.insert("incident_id".into(), doc.id.clone());
    ann.insert("count".into(), doc.count.to_string());
    ann.insert("first_seen".into(), doc.first_seen.clone());
    if let Some(g) = &doc.gpu {
        if let Some(s) = &g.serial {
            ann.insert("serial".into(), s.clone());
        }
        if let Some(n) = &g.name {
            ann.insert("gpu_name".into(), n.clone());
        }
    }
    if let Some(c) = &doc.catalog {
        if !c.mnemonic.is_empty() {
            ann.insert("mnemonic".into(), c.mnemonic.clone());
        }
        if let Some(w) = c.action_words() {
            ann.insert("nvidia_action".into(), cut(&w, ANNOTATION_MAX));
        }
    }
    if let Some(p) = &doc.report_path {
        ann.insert("report_path".into(), p.clone());
    }
    if let Some(st) = &doc.gpu_state {
        // An annotation, not a label: a label that changes would start another alert.
        ann.insert("gpu_state".into(), cut(&st.words(), ANNOTATION_MAX));
    }
    if let Some(h) = &doc.host_page {
        ann.insert("host_page".into(), h.clone());
    }
    if let Some(h) = doc.handoff.as_ref().filter(|h| !h.commands.is_empty()) {
        ann.insert(
            "handoff".into(),
            cut(&h.commands.join("\n"), ANNOTATION_MAX),
        );
    }
    if doc.dropped_alerts_before > 0 {
        ann.insert(
            "dropped_alerts_before".into(),
            doc.dropped_alerts_before.to_string(),
        );
    }
    let mut excerpt = String::new();
    for (step, note) in doc.notes() {
        excerpt.push_str(&format!("{note} ({step})\n"));
    }
    for l in doc.kernel_lines() {
        excerpt.push_str(&l);
        excerpt.push('\n');
    }
    if !excerpt.is_empty() {
        ann.insert("evidence".into(), cut(excerpt.trim_end(), EVIDENCE_MAX));
    }

    // A resolved notice ends the alert now; otherwise it ends on its own after
    // `resolve_after_secs`, should the resolved notice never come (a restart in between).
    // An incident that ends only when verified (a lost GPU, a failing check) must not end on a
    // timer here: xidwatch does not re-send while it holds, so its alert fires until the
    // resolved notice posts `endsAt` = now. Ten years stands for "until resolved".
    let verified_end = crate::model::FindingKind::parse(&doc.kind)
        .is_some_and(|k| crate::incident::ends_verified(k, doc.xid));
    let ends_ms = if doc.phase == crate::alert::document::Phase::Resolved {
        now_ms
    } else if verified_end {
        now_ms.saturating_add(UNTIL_RESOLVED_MS)
    } else {
        now_ms
            .max(doc.last_seen_ms)
            .saturating_add(resolve_after_secs.saturating_mul(1000))
    };
    PostableAlert {
        labels,
        annotations: ann,
        starts_at: rfc3339(doc.first_seen_ms),
        ends_at: rfc3339(ends_ms),
        generator_url: generator_url.map(str::to_string),
    }
}

/// Every alert `doc` stands for in Alertmanager, which keeps one alert per problem:
/// - the incident's own ([`postable`]);
/// - on a host page, one per other GPU of the group, under that GPU's labels and its own
///   incident id: each GPU's later notices (digest, resolved) then update and end its own
///   alert, so the host page's alert does not clear while another GPU of it is still down;
/// - once a worse finding raised the incident, its alerts under the severities it was paged
///   under before ([`AlertDocument::paged_as`]), ended: the GPU is shown once, as it is now;
/// - on a resolved notice, the alerts of the incidents it superseded after they were paged (an
///   NVML `gpu_missing` explained by the later Xid 79): they got no resolved notice of their own,
///   as the GPU was no better, and end now, with it.
pub fn postables(
    doc: &AlertDocument,
    extra_labels: &BTreeMap<String, String>,
    resolve_after_secs: u64,
    generator_url: Option<&str>,
    now_ms: u64,
) -> Vec<PostableAlert> {
    let own = postable(doc, extra_labels, resolve_after_secs, generator_url, now_ms);
    let mut out = Vec::new();
    let set_gpu = |a: &mut PostableAlert, g: Option<&crate::alert::document::GpuDoc>| {
        for k in ["gpu", "pci", "uuid"] {
            a.labels.remove(k);
        }
        if let Some(g) = g {
            if let Some(i) = g.index {
                a.labels.insert("gpu".into(), i.to_string());
            }
            if let Some(p) = &g.pci {
                a.labels.insert("pci".into(), p.clone());
            }
            if let Some(u) = &g.uuid {
                a.labels.insert("uuid".into(), u.clone());
            }
        }
    };
    if let Some(group) = doc
        .host_group
        .as_ref()
        .filter(|_| doc.phase != crate::alert::document::Phase::Resolved)
    {
        for g in group.gpus.iter().filter(|g| g.incident_id != doc.id) {
            let mut a = own.clone();
            set_gpu(&mut a, Some(&g.gpu));
            a.annotations
                .insert("incident_id".into(), g.incident_id.clone());
            a.annotations.insert("host_page".into(), doc.id.clone());
            out.push(a);
        }
    }
    // The alerts this incident went out under before a worse finding raised it: their labels
    // differ in `severity`, so they are other alerts to Alertmanager, and end now.
    let raised: Vec<PostableAlert> = doc
        .paged_as
        .iter()
        .filter(|s| **s != doc.severity)
        .flat_map(|s| {
            std::iter::once(&own).chain(out.iter()).map(move |a| {
                let mut e = a.clone();
                e.labels.insert("severity".into(), s.as_str().into());
                e.annotations
                    .insert("raised_to".into(), doc.severity.as_str().into());
                e.ends_at = rfc3339(now_ms);
                e
            })
        })
        .collect();
    out.extend(raised);
    if doc.phase == crate::alert::document::Phase::Resolved {
        for s in &doc.supersedes {
            let mut a = own.clone();
            a.labels.insert("alertname".into(), alertname(&s.kind));
            a.labels.insert("kind".into(), s.kind.clone());
            a.labels
                .insert("severity".into(), s.severity.as_str().into());
            a.labels
                .insert("category".into(), s.category.as_str().into());
            match s.xid {
                Some(x) => a.labels.insert("xid".into(), x.to_string()),
                None => a.labels.remove("xid"),
            };
            set_gpu(&mut a, s.gpu.as_ref());
            a.annotations.insert("incident_id".into(), s.id.clone());
            a.annotations.insert("superseded_by".into(), doc.id.clone());
            out.push(a);
        }
    }
    out.insert(0, own);
    out
}

/// A configured Alertmanager channel.
#[derive(Debug)]
pub struct AlertmanagerChannel {
    name: String,
    endpoints: Vec<String>,
    labels: BTreeMap<String, String>,
    resolve_after_secs: u64,
    generator_url: Option<String>,
    headers: HeaderMap,
    client: reqwest::Client,
}

impl AlertmanagerChannel {
    pub fn build(cfg: &AlertmanagerConfig) -> Result<Self, String> {
        let mut endpoints = Vec::new();
        for (i, u) in cfg.urls.iter().enumerate() {
            let mut url = check_http_url(u).map_err(|e| format!("urls[{i}]: {e}"))?;
            let path = url.path().trim_end_matches('/').to_string();
            url.set_path(&format!("{path}/api/v2/alerts"));
            endpoints.push(url.to_string());
        }
        if endpoints.is_empty() {
            return Err("urls: at least one URL is needed".to_string());
        }
        Ok(AlertmanagerChannel {
            name: cfg.name.clone(),
            endpoints,
            labels: cfg.labels.clone(),
            resolve_after_secs: cfg.resolve_after_secs,
            generator_url: cfg.generator_url.clone(),
            headers: header_map(&cfg.headers)?,
            client: http_client(cfg.timeout_secs, cfg.ca_file.as_deref())?,
        })
    }

    /// Posts to every instance; delivered when at least one accepted, and then the errors of
    /// those that did not are returned for a warning (the caller redacts them before logging).
    /// Otherwise the failure is temporary if any instance failed temporarily.
    pub async fn send(
        &self,
        doc: &AlertDocument,
    ) -> Result<Vec<(usize, DeliveryError)>, DeliveryError> {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let alerts = postables(
            doc,
            &self.labels,
            self.resolve_after_secs,
            self.generator_url.as_deref(),
            now_ms,
        );
        let body = serde_json::to_vec(&alerts).unwrap_or_default();
        let mut headers = self.headers.clone();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let sends = self.endpoints.iter().map(|url| {
            let headers = headers.clone();
            let body = body.clone();
            async move { post(&self.client, url, headers, body).await }
        });
        let results = futures_util::future::join_all(sends).await;
        let mut errors = Vec::new();
        let mut any_ok = false;
        for (i, r) in results.into_iter().enumerate() {
            match r {
                Ok(_) => any_ok = true,
                Err(e) => errors.push((i, e)),
            }
        }
        if any_ok {
            return Ok(errors);
        }
        let transient = errors.iter().any(|(_, e)| e.kind == FailureKind::Transient);
        let retry_after = errors.iter().filter_map(|(_, e)| e.retry_after).max();
        let message = errors
            .iter()
            .map(|(i, e)| format!("urls[{i}]: {e}"))
            .collect::<Vec<_>>()
            .join("; ");
        Err(DeliveryError {
            kind: if transient {
                FailureKind::Transient
            } else {
                FailureKind::Permanent
            },
            message,
            retry_after,
        })
    }
}

impl Sink for AlertmanagerChannel {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> ChannelKind {
        ChannelKind::Alertmanager
    }

    fn deliver<'a>(&'a self, doc: &'a AlertDocument) -> Delivery<'a> {
        Box::pin(async move {
            Ok(Accepted {
                refused: self.send(doc).await?,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::alert::document::{HostGpu, HostGroup, Phase};
    use crate::model::{FindingKind, PciAddress, Severity, Superseded};

    fn labels_of(a: &PostableAlert) -> (String, Option<String>, Option<String>) {
        (
            a.labels["kind"].clone(),
            a.labels.get("xid").cloned(),
            a.labels.get("pci").cloned(),
        )
    }

    /// A host page is one alert per GPU, each under its GPU's labels and incident id; the
    /// resolved notice of one GPU's incident ends only that GPU's alert.
    #[test]
    fn a_host_page_posts_one_alert_per_gpu() {
        let mut alert = crate::alert::synthetic_alert("node-1", 1_764_404_043_123, Vec::new());
        alert.incident.test = false;
        alert.incident.pci = PciAddress::parse("0000:19:00.0").ok();
        let lead = alert.incident.id.clone();
        let mut doc = AlertDocument::build(&alert);
        let gpu = |pci: &str, i| crate::alert::document::GpuDoc {
            index: Some(i),
            pci: Some(pci.to_string()),
            ..Default::default()
        };
        doc.apply_host_group(HostGroup {
            gpus: vec![
                HostGpu {
                    incident_id: lead.clone(),
                    gpu: gpu("0000:19:00.0", 0),
                    title: "a".into(),
                },
                HostGpu {
                    incident_id: "b".into(),
                    gpu: gpu("0000:1a:00.0", 1),
                    title: "b".into(),
                },
            ],
            shared_ports: Vec::new(),
            shared: "the host".into(),
        });
        let all = postables(&doc, &BTreeMap::new(), 300, None, 1_764_404_050_000);
        assert_eq!(all.len(), 2, "{all:#?}");
        assert_eq!(all[0].annotations["incident_id"], lead);
        assert_eq!(all[1].annotations["incident_id"], "b");
        assert_eq!(all[1].annotations["host_page"], lead);
        assert_eq!(all[1].labels["pci"], "0000:1a:00.0");
        assert_eq!(all[1].labels["gpu"], "1");
        assert_eq!(all[0].labels["xid"], all[1].labels["xid"]);
        assert_ne!(all[0].labels, all[1].labels, "two alerts, not one twice");
        // The lead's own resolved notice carries no group: it ends only its own alert.
        let mut resolved = alert.clone();
        resolved.incident.phase = crate::model::IncidentPhase::Resolved;
        let one = postables(
            &AlertDocument::build(&resolved),
            &BTreeMap::new(),
            300,
            None,
            1_764_404_060_000,
        );
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].labels, all[0].labels);
    }

    /// An incident raised after it was paged (a warning, then a critical echo) ends the alert
    /// it was paged under: Alertmanager shows it once, at its present severity, for every GPU of
    /// a host page alike.
    #[test]
    fn a_raised_incident_ends_the_alert_of_its_earlier_severity() {
        let mut alert = crate::alert::synthetic_alert("node-1", 1_764_404_043_123, Vec::new());
        alert.incident.test = false;
        alert.incident.pci = PciAddress::parse("0000:17:00.0").ok();
        alert.incident.phase = crate::model::IncidentPhase::Digest;
        alert.incident.severity = Severity::Critical;
        alert.incident.paged_as = vec![Severity::Warning];
        let now = 1_764_404_050_000;
        let all = postables(
            &AlertDocument::build(&alert),
            &BTreeMap::new(),
            300,
            None,
            now,
        );
        assert_eq!(all.len(), 2, "{all:#?}");
        assert_eq!(all[0].labels["severity"], "critical");
        assert_ne!(all[0].ends_at, rfc3339(now), "the present one fires");
        assert_eq!(all[1].labels["severity"], "warning");
        assert_eq!(all[1].ends_at, rfc3339(now), "the earlier one ends now");
        let mut same = all[1].labels.clone();
        same.insert("severity".into(), "critical".into());
        assert_eq!(same, all[0].labels, "the same alert but for its severity");
        // Paged as what it is now: nothing to end.
        alert.incident.paged_as = vec![Severity::Critical];
        let one = postables(
            &AlertDocument::build(&alert),
            &BTreeMap::new(),
            300,
            None,
            now,
        );
        assert_eq!(one.len(), 1);
    }

    /// The alerts of incidents superseded after they were paged stay firing while the
    /// successor holds (its opening and digests do not end them) and end with its resolved
    /// notice, under the labels they were sent with.
    #[test]
    fn a_resolved_notice_ends_the_alerts_it_superseded() {
        let mut alert = crate::alert::synthetic_alert("node-1", 1_764_404_043_123, Vec::new());
        alert.incident.test = false;
        let pci = PciAddress::parse("0000:17:00.0").ok();
        alert.incident.pci = pci;
        alert.incident.supersedes = vec![Superseded {
            id: "missing-1".into(),
            kind: FindingKind::GpuMissing,
            xid: None,
            severity: Severity::Critical,
            category: crate::model::Category::Pcie,
            gpu: crate::model::GpuIdentity {
                index: Some(0),
                uuid: Some("GPU-a".into()),
                ..Default::default()
            },
        }];
        let now = 1_764_404_050_000;
        let open = postables(
            &AlertDocument::build(&alert),
            &BTreeMap::new(),
            300,
            None,
            now,
        );
        assert_eq!(open.len(), 1, "the opening does not end it: {open:#?}");
        alert.incident.phase = crate::model::IncidentPhase::Resolved;
        let doc = AlertDocument::build(&alert);
        assert_eq!(doc.phase, Phase::Resolved);
        let all = postables(&doc, &BTreeMap::new(), 300, None, now);
        assert_eq!(all.len(), 2, "{all:#?}");
        assert_eq!(
            labels_of(&all[0]),
            ("xid".into(), Some("79".into()), Some("0000:17:00.0".into()))
        );
        assert_eq!(
            labels_of(&all[1]),
            ("gpu_missing".into(), None, Some("0000:17:00.0".into()))
        );
        assert_eq!(all[1].labels["alertname"], "XidwatchGpuMissing");
        assert_eq!(all[1].labels["uuid"], "GPU-a");
        assert_eq!(all[1].labels["gpu"], "0");
        assert_eq!(all[1].ends_at, rfc3339(now), "ended now");
        assert_eq!(all[1].annotations["superseded_by"], doc.id);
    }

    #[test]
    fn alertnames() {
        assert_eq!(alertname("xid"), "XidwatchXid");
        assert_eq!(alertname("fallen_off_bus"), "XidwatchFallenOffBus");
    }
}
