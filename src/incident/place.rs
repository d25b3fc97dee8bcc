//! Where a finding goes: a repeat, an echo of its GPU's incident, a cause that supersedes one,
//! or a new incident; and the timing of first alerts (settle, host pages).

use super::*;

impl Engine {
    pub(super) fn place(
        &mut self,
        f: Finding,
        now: Now,
        at_startup: bool,
        runbook: Option<String>,
        out: &mut Vec<Incident>,
    ) {
        let key = Key::of(&f);
        let (family, rank) = family_rank(&f);
        // A recent fault must page even where an old one (recorded, not paged) is still open
        // for the same GPU: the old one closes first rather than swallow it as a repeat.
        if self.maybe_before_lookback && !self.before_lookback(&f, at_startup) {
            let mut any = false;
            let old: Vec<Key> = self
                .open
                .values()
                .filter(|o| o.inc.before_lookback)
                .inspect(|_| any = true)
                .filter(|o| o.key == key || (f.pci.is_some() && o.key.pci == f.pci))
                .map(|o| o.key)
                .collect();
            self.maybe_before_lookback = any;
            for k in old {
                if let Some(o) = self.open.remove(&k) {
                    self.close(o, out);
                }
            }
        }
        // A fault of this boot on the key of one carried over from the previous boot: the GPU
        // came back with the boot (a driver logs an Xid only from a GPU it initialised) and
        // failed again. That is news, and its own incident and page (the repeat-offender count
        // sees it); the carried one is superseded by it, not resolved, since the GPU is no
        // better.
        if self.open.get(&key).is_some_and(|o| o.carried) {
            if let Some(old) = self.open.remove(&key) {
                let told = out.len();
                self.open_new(f, key, family, rank, now, at_startup, runbook, out);
                let mut sup = old.inc.supersedes.clone();
                if old.emitted {
                    sup.insert(0, Superseded::of(&old.inc));
                }
                if let Some(n) = self.open.get_mut(&key) {
                    n.inc.supersedes.extend(sup.iter().cloned());
                    let id = n.inc.id.clone();
                    // Sent at once (no settle delay): the page already out says so too.
                    for sent in out[told..].iter_mut().filter(|i| i.id == id) {
                        sent.supersedes.extend(sup.iter().cloned());
                    }
                }
            }
            return;
        }
        let seen_ms = f.logged_ms.unwrap_or(now.wall_ms);
        // 1. A repeat of an open incident.
        if let Some(o) = self.open.get_mut(&key) {
            o.inc.count += 1;
            o.inc.last_seen_ms = o.inc.last_seen_ms.max(seen_ms);
            o.last_mono_ms = now.mono_ms;
            push_sample(&mut o.inc, f);
            if !o.emitted && o.inc.count >= o.min_count && now.mono_ms >= o.settle_until_ms {
                release(o, &mut self.stats, out);
            }
            return;
        }
        // A state incident stands alone: folded into another incident as an echo it could not
        // end when verified, and an event folded into it would wait for the state's end.
        if is_state(f.kind) {
            self.open_new(f, key, family, rank, now, at_startup, runbook, out);
            return;
        }
        // 2. Within a new incident's settle delay, anything for the same GPU joins its first
        // alert: the strongest cause leads, the rest are echoes.
        if let Some(pci) = f.pci {
            let held = self
                .open
                .values()
                .filter(|o| !is_state(o.key.kind))
                .filter(|o| o.key.pci == Some(pci) && o.held() && now.mono_ms < o.settle_until_ms)
                .min_by_key(|o| o.opened_mono_ms)
                .map(|o| {
                    let lead = o.inc.findings.first().map(|c| lead_score(c, o.rank));
                    (o.key, lead)
                });
            if let Some((hk, lead)) = held {
                self.stats.settled += 1;
                if lead.is_some_and(|l| lead_score(&f, rank) > l) {
                    if let Some(old) = self.open.remove(&hk) {
                        let settle_until = old.settle_until_ms;
                        self.open_new(f, key, family, rank, now, at_startup, runbook, out);
                        if let Some(n) = self.open.get_mut(&key) {
                            // The first finding's settle delay still holds: the page is not
                            // pushed back by each new arrival.
                            n.settle_until_ms = n.settle_until_ms.min(settle_until);
                            absorb(n, old);
                        }
                    }
                    return;
                }
                if let Some(o) = self.open.get_mut(&hk) {
                    o.echo_total += 1;
                    o.inc.last_seen_ms = o.inc.last_seen_ms.max(seen_ms);
                    o.last_mono_ms = now.mono_ms;
                    bump_echo(&mut o.inc, &f);
                    raise(&mut o.inc, o.emitted, f.severity);
                    push_sample(&mut o.inc, f);
                }
                return;
            }
        }
        // 3. An echo (or a higher-ranked cause) on the same GPU.
        if f.pci.is_some() {
            let is_echo_kind = f.caused_by.is_some()
                || (f.kind == FindingKind::Xid && matches!(f.xid, Some(45 | 154)));
            let target = self
                .open
                .values()
                .filter(|o| o.key.pci == f.pci && !is_state(o.key.kind))
                .filter(|o| {
                    (f.caused_by.is_some() && f.caused_by == o.key.xid)
                        || (is_echo_kind && f.caused_by.is_none())
                        || (family != Family::None && o.family == family)
                })
                .max_by_key(|o| {
                    (
                        f.caused_by.is_some() && f.caused_by == o.key.xid,
                        o.last_mono_ms,
                    )
                })
                .map(|o| (o.key, o.family, o.rank));
            if let Some((tk, tfamily, trank)) = target {
                if family != Family::None && tfamily == family && rank > trank {
                    // Supersede: the new cause opens the incident; the old one becomes its echo.
                    if let Some(old) = self.open.remove(&tk) {
                        let settle_until = old.held().then_some(old.settle_until_ms);
                        self.open_new(f, key, family, rank, now, at_startup, runbook, out);
                        if let Some(n) = self.open.get_mut(&key) {
                            if let Some(s) = settle_until {
                                n.settle_until_ms = n.settle_until_ms.min(s);
                            }
                            absorb(n, old);
                        }
                    }
                    return;
                }
                let Some(o) = self.open.get_mut(&tk) else {
                    return;
                };
                o.echo_total += 1;
                o.inc.last_seen_ms = o.inc.last_seen_ms.max(seen_ms);
                o.last_mono_ms = now.mono_ms;
                bump_echo(&mut o.inc, &f);
                if !o.emitted {
                    o.inc.severity = o.inc.severity.max(f.severity);
                }
                if f.severity > o.inc.severity && o.emitted {
                    // Never hide a worse signal inside a digest: raise it now.
                    raise(&mut o.inc, true, f.severity);
                    push_sample(&mut o.inc, f);
                    let mut inc = o.inc.clone();
                    inc.phase = IncidentPhase::Digest;
                    o.told_count = o.inc.count;
                    o.told_echoes = o.echo_total;
                    self.stats.digests += 1;
                    out.push(inc);
                    return;
                }
                push_sample(&mut o.inc, f);
                return;
            }
        }
        self.open_new(f, key, family, rank, now, at_startup, runbook, out);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn open_new(
        &mut self,
        f: Finding,
        key: Key,
        family: Family,
        rank: u8,
        now: Now,
        at_startup: bool,
        runbook: Option<String>,
        out: &mut Vec<Incident>,
    ) {
        if self.open.len() >= self.cfg.max_open {
            // Full: close the oldest now, with its digest, rather than grow. "Oldest" by the
            // monotonic clock: the wall clock may have stepped since.
            let oldest = self
                .open
                .values()
                .min_by_key(|o| (o.opened_mono_ms, o.inc.id.clone()))
                .map(|o| o.key);
            if let Some(o) = oldest.and_then(|k| self.open.remove(&k)) {
                self.stats.evicted += 1;
                self.close(o, out);
            }
        }
        let ov = f.xid.and_then(|x| {
            if f.kind == FindingKind::Xid {
                self.cfg.overrides.get(x)
            } else {
                None
            }
        });
        let min_count = ov.and_then(|o| o.min_count).unwrap_or(1);
        // A state incident (a service down, a failing health check) has no window: it ends
        // when the state is verified gone
        // ([`Engine::resolve_state`]), however long that takes, and never on a timer.
        let window_ms = if is_state(f.kind) {
            NO_DEADLINE
        } else {
            ov.and_then(|o| o.window_secs)
                .map_or(self.cfg.window_ms, |s| s.saturating_mul(1000))
        };
        // A new incident on a key whose previous one is waiting out its quiet period: that GPU
        // is not quiet, so the previous one is not resolved (the new one will be, in its turn).
        self.quiet.remove(&key);
        let first_mark = f.origin.seq.unwrap_or(now.wall_ms);
        // Dated when the kernel logged it, where it came from the kernel log.
        let seen_ms = f.logged_ms.unwrap_or(now.wall_ms);
        let before_lookback = self.before_lookback(&f, at_startup);
        let id = incident_id(&self.cfg.boot_id, &key, first_mark);
        let inc = Incident {
            id,
            phase: IncidentPhase::Opened,
            host: self.cfg.host.clone(),
            boot_id: (!self.cfg.boot_id.is_empty()).then(|| self.cfg.boot_id.clone()),
            kind: f.kind,
            xid: f.xid,
            pci: f.pci,
            gpu: f.gpu.clone(),
            severity: f.severity,
            category: f.category,
            title: title(&f),
            note: (probe_verified(f.kind, f.xid) && !self.can_verify).then(|| no_nvml_note(f.kind)),
            first_seen_ms: seen_ms,
            last_seen_ms: seen_ms,
            count: 1,
            findings: vec![f],
            echoes: Vec::new(),
            found_at_startup: at_startup,
            before_lookback,
            runbook_override: runbook,
            dropped_alerts_before: 0,
            test: false,
            supersedes: Vec::new(),
            host_page: None,
            paged_as: Vec::new(),
        };
        // Host-level findings (no GPU) have nothing to wait for; GPU findings settle first.
        let settle = if f_has_gpu(&inc) {
            self.cfg.settle_ms
        } else {
            0
        };
        let emitted = min_count <= 1 && settle == 0;
        if emitted {
            self.stats.opened += 1;
            out.push(inc.clone());
        }
        self.insert_open(
            key,
            Open {
                inc,
                key,
                family,
                rank,
                deadline_ms: now.mono_ms.saturating_add(window_ms),
                opened_mono_ms: now.mono_ms,
                last_mono_ms: now.mono_ms,
                min_count,
                emitted,
                settle_until_ms: if settle > 0 {
                    now.mono_ms.saturating_add(settle)
                } else {
                    0
                },
                told_count: 1,
                told_echoes: 0,
                echo_total: 0,
                told_other: None,
                told_mono_ms: now.mono_ms,
                carried: false,
            },
        );
        self.align_host_settle(key);
    }

    /// A critical fault opening on a second GPU while the same fault's first alert is still held
    /// on another GPU (a PCIe switch, riser or power event takes several down at once) is
    /// released with it: the alert stage folds first alerts released together into one host
    /// page ([`crate::alert::document::HostGroup`]), which it can only do when they come out of
    /// the same tick. Only the timing changes: each GPU keeps its own incident.
    pub(super) fn align_host_settle(&mut self, key: Key) {
        let Some(new) = self.open.get(&key) else {
            return;
        };
        if !new.held() || new.inc.severity < Severity::Critical || new.inc.pci.is_none() {
            return;
        }
        let (kind, xid, pci, seen) = (
            new.inc.kind,
            new.inc.xid,
            new.inc.pci,
            new.inc.first_seen_ms,
        );
        let settle = self.cfg.settle_ms;
        let earliest = self
            .open
            .values()
            .filter(|o| o.key != key && o.held() && o.inc.pci.is_some() && o.inc.pci != pci)
            .filter(|o| o.inc.kind == kind && o.inc.xid == xid && o.inc.count >= o.min_count)
            .filter(|o| o.inc.first_seen_ms.abs_diff(seen) <= settle)
            .map(|o| o.settle_until_ms)
            .min();
        if let (Some(t), Some(n)) = (earliest, self.open.get_mut(&key)) {
            n.settle_until_ms = n.settle_until_ms.min(t);
        }
    }

    /// First alerts of the same critical (kind, Xid) on two or more GPUs released together
    /// ([`Engine::align_host_settle`]) are one host page: the first leads, and each other one
    /// records the lead's id ([`Incident::host_page`]) in the alert and in its open incident, so
    /// its later digests and resolved notice name the page it was shown in, across restarts.
    pub(super) fn mark_host_pages(&mut self, released: &mut [Incident]) {
        let mut lead_of: BTreeMap<(FindingKind, Option<u32>), (String, Vec<PciAddress>)> =
            BTreeMap::new();
        for inc in released.iter_mut() {
            if inc.phase != IncidentPhase::Opened
                || inc.test
                || inc.before_lookback
                || inc.severity < Severity::Critical
            {
                continue;
            }
            let Some(pci) = inc.pci else { continue };
            match lead_of.get_mut(&(inc.kind, inc.xid)) {
                None => {
                    lead_of.insert((inc.kind, inc.xid), (inc.id.clone(), vec![pci]));
                }
                Some((lead, seen)) if !seen.contains(&pci) => {
                    seen.push(pci);
                    inc.host_page = Some(lead.clone());
                    if let Some(o) = self.open.values_mut().find(|o| o.inc.id == inc.id) {
                        o.inc.host_page = Some(lead.clone());
                    }
                }
                Some(_) => {}
            }
        }
    }
}

/// Folds a superseded incident into its successor: its cause and counts become echoes. One
/// that was already paged is remembered by the successor ([`Incident::supersedes`]), which
/// ends it: it gets no resolved notice of its own, as the GPU is no better for the new cause.
pub(super) fn absorb(n: &mut Open, mut old: Open) {
    if old.emitted {
        n.inc.supersedes.push(Superseded::of(&old.inc));
    }
    n.inc.supersedes.append(&mut old.inc.supersedes);
    let mut merged: BTreeMap<(FindingKind, Option<u32>), u64> = BTreeMap::new();
    for e in n.inc.echoes.drain(..) {
        *merged.entry((e.kind, e.xid)).or_default() += e.count;
    }
    *merged.entry((old.inc.kind, old.inc.xid)).or_default() += old.inc.count;
    for e in &old.inc.echoes {
        *merged.entry((e.kind, e.xid)).or_default() += e.count;
    }
    n.echo_total += old.inc.count + old.echo_total;
    n.inc.echoes = merged
        .into_iter()
        .map(|((kind, xid), count)| EchoCount { kind, xid, count })
        .collect();
    n.inc.first_seen_ms = n.inc.first_seen_ms.min(old.inc.first_seen_ms);
    n.inc.found_at_startup |= old.inc.found_at_startup;
    for f in old.inc.findings {
        push_sample(&mut n.inc, f);
    }
    if n.inc.gpu.is_empty() {
        n.inc.gpu = old.inc.gpu;
    }
}

pub(super) fn bump_echo(inc: &mut Incident, f: &Finding) {
    match inc
        .echoes
        .iter_mut()
        .find(|e| e.kind == f.kind && e.xid == f.xid)
    {
        Some(e) => e.count += 1,
        None => inc.echoes.push(EchoCount {
            kind: f.kind,
            xid: f.xid,
            count: 1,
        }),
    }
}

pub(super) fn f_has_gpu(inc: &Incident) -> bool {
    inc.pci.is_some()
}

/// Raises `inc` to `to` when that is worse. An incident already paged remembers the severity
/// it was paged under ([`Incident::paged_as`]), so that alert can be ended.
fn raise(inc: &mut Incident, emitted: bool, to: Severity) {
    if to <= inc.severity {
        return;
    }
    if emitted && !inc.paged_as.contains(&inc.severity) {
        inc.paged_as.push(inc.severity);
    }
    inc.severity = to;
}
