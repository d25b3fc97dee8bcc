//! Verified ends: a state's source saying it is gone ([`Engine::resolve_state`]) and the
//! lost-GPU probe's rounds ([`Engine::verify_lost`]).

use super::*;

impl Engine {
    /// Ends the state incident `f` belongs to (same key: a service's unit, a health check's
    /// kind and GPU) because its source verified the state is gone: a resolved notice at once,
    /// no digest and no quiet period. A key with no open incident is nothing to do (the source
    /// says "active" at every start), and so is a kind that is no state ([`is_state`]): an
    /// event ends by its quiet period, whatever a source says.
    pub fn resolve_state(&mut self, f: &Finding, now: impl Into<Now>, out: &mut Vec<Incident>) {
        // A host-wide GPU shortfall (`gpu_missing` naming no address) is verified gone by the
        // count check seeing the expected count again; one naming a GPU, only by the probe.
        let count_back = f.kind == FindingKind::GpuMissing && f.pci.is_none();
        if !is_state(f.kind) && !count_back {
            return;
        }
        self.end_verified(Key::of(f), now.into().wall_ms, out, |_, _| {
            count_back.then(|| format!("verified: {}", f.title))
        });
    }

    /// Ends the lost-GPU incidents ([`is_lost`]) a probe round verifies back: their GPU is on
    /// the bus, NVML reaches it, and it is the same board (same UUID, or serial). A round that
    /// started before the incident's last finding answers nothing about it. Another board at
    /// the address is no recovery of this one: it is said once (a digest), and the incident
    /// stays open. A new boot gets no pass: it counts only through these same checks.
    pub fn verify_lost(&mut self, v: &Verification, now: impl Into<Now>, out: &mut Vec<Incident>) {
        let now = now.into();
        let mut ended = Vec::new();
        let mut driver_ok = Vec::new();
        for o in self.open.values_mut() {
            if o.key.kind == FindingKind::DriverInitFailure && v.at_mono_ms >= o.last_mono_ms {
                // The driver initialised: NVML reaches the GPU the failure named, or any GPU
                // for a failure that named none.
                let ok = match o.key.pci {
                    Some(pci) => v.reached.iter().any(|r| r.pci == pci),
                    None => !v.reached.is_empty(),
                };
                if ok {
                    driver_ok.push(o.key);
                }
                continue;
            }
            let (Some(pci), true) = (o.key.pci, is_lost(o.key.kind, o.key.xid)) else {
                continue;
            };
            if v.at_mono_ms < o.last_mono_ms || !v.on_bus.contains(&pci) {
                continue;
            }
            let Some(seen) = v.reached.iter().find(|r| r.pci == pci) else {
                continue;
            };
            let name = |g: &Option<String>, s: &Option<String>| {
                g.clone()
                    .or_else(|| s.as_ref().map(|s| format!("serial {s}")))
                    .unwrap_or_else(|| "an unidentified GPU".to_string())
            };
            match same_board(&o.inc.gpu, seen) {
                Some(true) => ended.push(o.key),
                Some(false) => {
                    let other = name(&seen.uuid, &seen.serial);
                    if o.told_other.as_deref() == Some(other.as_str()) || !o.emitted {
                        continue;
                    }
                    o.told_other = Some(other.clone());
                    o.told_mono_ms = now.mono_ms;
                    let mut inc = o.inc.clone();
                    inc.phase = IncidentPhase::Digest;
                    inc.note = Some(format!(
                        "not recovered: {pci} now answers as {other}, a different board; {} has not come back",
                        name(&o.inc.gpu.uuid, &o.inc.gpu.serial)
                    ));
                    self.stats.digests += 1;
                    out.push(inc);
                }
                // Never identified: there is no telling whether this is the same board.
                None => {}
            }
        }
        ended.sort();
        for k in ended {
            self.end_verified(k, now.wall_ms, out, |inc, carried| {
                let who = inc
                    .gpu
                    .uuid
                    .clone()
                    .or_else(|| inc.gpu.serial.as_ref().map(|s| format!("serial {s}")))
                    .unwrap_or_default();
                Some(format!(
                    "recovered{}: {who} reachable again (same board)",
                    after_reboot(carried)
                ))
            });
        }
        driver_ok.sort();
        for k in driver_ok {
            let what = match k.pci {
                Some(pci) => format!("NVML reaches {pci}"),
                None => format!("NVML reaches {} GPU(s)", v.reached.len()),
            };
            self.end_verified(k, now.wall_ms, out, |_, carried| {
                Some(format!(
                    "verified{}: the driver is loaded and {what}",
                    after_reboot(carried)
                ))
            });
        }
    }

    /// Ends the incident under `k` because its source verified it: its resolved notice (when it
    /// was paged at all) with `note`'s words for what was verified, when it has some.
    fn end_verified(
        &mut self,
        k: Key,
        now_wall_ms: u64,
        out: &mut Vec<Incident>,
        note: impl FnOnce(&Incident, bool) -> Option<String>,
    ) {
        let Some(o) = self.open.remove(&k) else {
            return;
        };
        self.changes += 1;
        if !o.emitted {
            return;
        }
        let mut inc = o.inc;
        inc.phase = IncidentPhase::Resolved;
        inc.last_seen_ms = now_wall_ms;
        if let Some(n) = note(&inc, o.carried) {
            inc.note = Some(n);
        }
        self.stats.resolved += 1;
        out.push(inc);
    }
}

/// " after the reboot" for an incident carried over from the previous boot.
fn after_reboot(carried: bool) -> &'static str {
    if carried {
        " after the reboot"
    } else {
        ""
    }
}

/// Whether `seen` is the board `inc` was opened on: the same UUID, or where either UUID is
/// unknown, the same serial. `None`: nothing to compare (the board was never identified).
fn same_board(inc: &GpuIdentity, seen: &Reached) -> Option<bool> {
    if let (Some(a), Some(b)) = (&inc.uuid, &seen.uuid) {
        return Some(a == b);
    }
    match (&inc.serial, &seen.serial) {
        (Some(a), Some(b)) => Some(a == b),
        _ => None,
    }
}
