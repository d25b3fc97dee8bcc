//! What a lost-GPU probe round saw, as evidence for ending incidents: a value the probe (a
//! source) sends and the incident stage reads, so it lives below both.

use super::PciAddress;

/// What NVML sees on one PCI address in a probe round: who answers there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reached {
    pub pci: PciAddress,
    pub uuid: Option<String>,
    pub serial: Option<String>,
}

/// One probe round as evidence for ending lost-GPU incidents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    /// Monotonic time the round started: a finding after it is not answered by it.
    pub at_mono_ms: u64,
    /// NVIDIA GPUs on the PCI bus (sysfs).
    pub on_bus: Vec<PciAddress>,
    /// GPUs NVML reached in that round, with who they said they are.
    pub reached: Vec<Reached>,
}
