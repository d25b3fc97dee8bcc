//! The literal prefilter: which lines can be ours at all.
//!
//! Every line the classifier reads contains one of [`CANDIDATE_LITERALS`]. `scan` searches whole
//! buffers for them (Teddy/Aho-Corasick, as grep tools do) and never looks at a line without
//! one; the daemon asks the same question before the costlier message-start search, so both
//! read exactly the same lines.

use aho_corasick::{AhoCorasick, Input, MatchKind};

/// Literals at least one of which every line we classify contains: the driver tags, and for the
/// lines that carry none, the GSP crash report, nvidia-smi/NVML texts, hung-task reports, the X
/// server NVIDIA driver's errors, the Xid events the Kubernetes device plugin logs and the API
/// mismatch as NVIDIA's user-space components report it.
pub const CANDIDATE_LITERALS: &[&str] = &[
    "NVRM",
    "SXid",
    "nvidia",
    "AER:",
    "PCIe Bus Error",
    "GSP task",
    "NVIDIA-SMI",
    "NVML",
    "Unable to det",
    "nvmlDevice",
    "No devices were found",
    "blocked for more than",
    "state:D",
    "Call Trace",
    "Call trace",
    "(EE)",
    "XidCriticalError",
    "API mismatch",
    "API Mismatch",
    // Mellanox's GPUDirect RDMA module, whose load failures name no NVIDIA tag.
    "nv_peer_mem",
    // Kernel crash headers: the task and frames after them say whether the crash is NVIDIA's.
    "BUG:",
    "general protection fault",
    // Tegra's (Jetson's) integrated GPU driver, whose lines carry no NVRM or nvidia tag.
    "nvgpu: ",
    // nvidia-smi's "couldn't communicate with the NVIDIA driver" as management tools reword it.
    "communicate with the NVIDIA driver",
    // A field nvidia-smi could not read, padded as its GPU table prints it (npm's `ERR! ` has one
    // space). Not with the leading spaces: a literal starting with two spaces matches the start of
    // every padded timestamp and slowed the whole scan by a tenth.
    "ERR!  ",
    // The fabric manager daemon (`nv-fabricmanager[pid]:`), which names no nvidia tag.
    "fabricmanager",
    // Fabric Manager's own log file, whose records name no daemon: `[stamp] [ERROR] [tid N] ...`.
    // Only the two levels that can be findings.
    "] [ERROR] ",
    "] [WARNING] ",
];

/// The literal prefilter.
pub struct Prefilter {
    ac: AhoCorasick,
}

impl Default for Prefilter {
    fn default() -> Self {
        Self::new()
    }
}

impl Prefilter {
    pub fn new() -> Self {
        // Leftmost-first lets the searcher use its SIMD (Teddy) path; which literal matched does
        // not matter, only where.
        let ac = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostFirst)
            .build(CANDIDATE_LITERALS)
            .expect("built-in literals");
        Prefilter { ac }
    }

    /// One prefilter for the whole process, built on first use.
    pub fn shared() -> &'static Prefilter {
        static P: std::sync::OnceLock<Prefilter> = std::sync::OnceLock::new();
        P.get_or_init(Prefilter::new)
    }

    /// Whether a line (or any buffer) holds a candidate literal.
    pub fn is_candidate(&self, hay: &[u8]) -> bool {
        self.ac.is_match(hay)
    }

    /// Where the first candidate literal at or after `from` starts.
    pub fn find_from(&self, hay: &[u8], from: usize) -> Option<usize> {
        self.ac
            .find(Input::new(hay).span(from..hay.len()))
            .map(|m| m.start())
    }
}
