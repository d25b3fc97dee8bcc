//! Classifier tests for the classes of line that the trackers of GPU cluster tooling (DCGM
//! exporter, NVSentinel, the container toolkit, health agents) and the kernel captures those
//! agents keep showed read badly: each feeds saved-log lines through the literal prefilter and
//! the prefix split, as `scan` does, with the harmless neighbours that must stay quiet.

use super::testing;
use crate::model::Finding;

fn loud(line: &str) -> Vec<Finding> {
    testing::loud_line(line, true)
}

#[test]
fn an_error_naming_its_gpu_as_gpu_at_pci_is_not_an_identity_line() {
    // After a run of Xid 119s the driver stops printing each GSP RPC error and says the GPU
    // needs a reset; the sentence names the GPU with the same words as the identity line.
    let l = "[Sun Feb 23 16:24:36 2025] NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00 (printing 1 of every 30).  The GPU likely needs to be reset.";
    assert!(!loud(l).is_empty(), "{l}");
    // The identity lines themselves stay quiet, with or without a UUID we can parse.
    for quiet in [
        "[Sun Feb 23 16:24:18 2025] NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-b600-ac93-3616-d754b23d636d",
        "[1084456.074554] NVRM: GPU at PCI:0000:09:00: GPU-26fba6b2-9e52-006e-68db-4ce18382a5ea",
        "[Mon Mar  6 21:09:45 2023] NVRM: GPU at PCI:0000:61:00: GPU-81f5d81e-7906-c145-3def-82e281d7b260",
    ] {
        let f = loud(quiet);
        assert!(f.is_empty(), "{quiet}: {f:?}");
    }
}
