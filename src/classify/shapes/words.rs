//! The words that make a driver line an error or a known-harmless notice, and sentence edges.

use std::sync::OnceLock;

use aho_corasick::AhoCorasick;

/// Error signals in a driver line, lower-case. Conservative on purpose: each was seen in a real
/// NVIDIA error line and in none of the harmless ones.
pub(super) const ERROR_WORDS: &[&str] = &[
    "error",
    "fail",
    "timeout",
    "timed out",
    // `_issueRpcAndWait: rpcRecvPoll timedout for fn 76`: the GSP RPC poll gave up.
    "timedout",
    "fatal",
    "assert",
    "halted",
    "inaccessible",
    "invalid",
    "cannot",
    "can't",
    "unable",
    "not responding",
    "lost",
    "exceeded",
    "missing",
    "mismatch",
    "panic",
    "watchdog",
    "stuck",
    "hung",
    "os_schedule",
    "kgsphealthcheck",
    "bad state",
    "not supported",
    // Self-tests that read back nonsense: `kbusVerifyBar2_GM107: MMUTest BAR0 window offset
    // 0x70f000 returned garbage 0x0`.
    "garbage",
    // A GPU removed from the bus while still in use (surprise removal, a lost eGPU).
    "non-zero usage count",
    // `System Power Management attempted without driver procfs suspend interface`: suspend
    // will fail with PreserveVideoMemoryAllocations set.
    "attempted without",
    // The GPU's DMA faulting in the IOMMU, as the IOMMU driver prints it on the GPU's own name
    // (`nvidia 0000:41:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=... address=...]`): a
    // peer-to-peer or DMA mapping the IOMMU does not hold; P2P jobs hang or fail on it.
    "io_page_fault",
    // The driver's own words for a mapping the GPU cannot make (`memdescMapIommu: ... is not
    // addressable by GPU`, `_kbusCreateStaticBar1IOMMUMapping: The peer DMA address ... is not
    // aligned at ...`), and for a call that broke its locking rules (`RMAPI_GPU_LOCK_INTERNAL
    // alloc requested without holding the RMAPI lock`).
    "not addressable",
    "not aligned",
    "without holding",
    // A GPU or a mapping the driver cannot use as it is (`This NVIDIA driver is not compatible
    // with this NVIDIA GPU`, the unsupported-GPU message's other wording; `dmaAllocMapping_GM107:
    // Virtual address ... is not compatible with page size ...`).
    "not compatible",
    // The PCI core refusing the GPU's power-state change under the driver's name (`nvidia
    // 0000:03:00.0: Refused to change power state, currently in D3`): the card stays asleep and
    // the driver's probe fails on it. Under another driver's name the line is not this reader's.
    "refused to change power state",
];

/// Notices from the NVIDIA modules that mention an error word but report nothing wrong.
pub(super) const HARMLESS: &[&str] = &[
    "loading NVIDIA UNIX",
    "Persistence mode",
    "nvidia-persistenced",
    "RmInitAdapter succeeded",
    "ACPI",
    "failed to open /proc/driver/nvidia/params", // user tools probing before load
    "module verification failed",
    "taints kernel",
    "tainting kernel",
    "inheriting taint",
    "vgaarb:",
    "mapping multiple BARs",
    "Loaded the UVM driver",
    "[drm] ",
    "skipping",
    "Unloading",
    // The PCI core's legacy-interrupt routing notices for the GPU ("can't derive routing for PCI
    // INT A", "PCI INT A: no GSI"): the driver uses MSI, and a VM without INTx routing prints them
    // on every boot.
    "PCI INT ",
    // `free_os_event: failed to find OS event`: a client freed an event handle the driver no
    // longer knows (monitoring agents do this on healthy GPUs); nothing about the GPU.
    "free_os_event",
    // The optional GSP firmware for firmware logging (`gsp_log_ga10x.bin`), asked for only
    // when firmware logs are enabled and missing from most installs: the driver says so itself
    // (`Failed to load gsp_log_*.bin, no GSP-RM logs will be printed (non-fatal)`) and runs on.
    "gsp_log_",
];

/// A probe of what the GPU or the platform can do, or a lookup, answered "no", that the driver
/// handles by carrying on without it:
/// - an RM status check (`nvCheckOkFailedNoLog: Check failed: ...`) answered
///   `NV_ERR_NOT_SUPPORTED` or `NV_ERR_OBJECT_NOT_FOUND` (monitoring agents on MIG nodes ask
///   for a GPU-instance subscription their client does not have, every few seconds). Checks,
///   unlike assertions, mark failures the code handles; a check with any other status (invalid
///   data, no resources) stays an error.
/// - the PCIe chipset setup at load (`objClInitPcieChipset: *** Chipset Setup Function Error!`):
///   on a chipset it has no setup for, the driver keeps generic PCIe settings and the GPU works.
pub(super) fn is_capability_probe(text: &str) -> bool {
    (text.contains("Check failed")
        && (text.contains("[NV_ERR_NOT_SUPPORTED]") || text.contains("[NV_ERR_OBJECT_NOT_FOUND]")))
        || (text.contains("objClInitPcieChipset") && text.contains("Chipset Setup Function"))
}

pub(super) fn has_error_signal(text: &str) -> bool {
    // Lower-case only the first 256 bytes: the signal is in the words, not in register dumps.
    let mut buf = [0u8; 256];
    let n = text.len().min(buf.len());
    for (d, s) in buf.iter_mut().zip(text.as_bytes()) {
        *d = s.to_ascii_lowercase();
    }
    let lower = &buf[..n];
    error_words()
        .find_overlapping_iter(lower)
        .any(|m| !in_member_path(lower, m.start()))
}

/// [`ERROR_WORDS`] as one automaton, built at the first line that asks: every occurrence of
/// every word in one pass. A search per word built a searcher per word per line (34 of them on
/// every module line and quiet `NVRM:` line), most of what reading such a line cost.
fn error_words() -> &'static AhoCorasick {
    static A: OnceLock<AhoCorasick> = OnceLock::new();
    A.get_or_init(|| words(ERROR_WORDS))
}

/// [`HARMLESS`] as one automaton, for the same reason.
fn harmless_words() -> &'static AhoCorasick {
    static A: OnceLock<AhoCorasick> = OnceLock::new();
    A.get_or_init(|| words(HARMLESS))
}

/// A contiguous NFA, not the DFA the default builds for a few dozen words: it searches the first
/// 256 bytes of a line, where the two run alike, and the DFA's construction (1.8 M instructions)
/// was a tenth of what scanning a 2 MB log cost.
fn words(list: &[&str]) -> AhoCorasick {
    AhoCorasick::builder()
        .kind(Some(aho_corasick::AhoCorasickKind::ContiguousNFA))
        .build(list)
        .expect("built-in words")
}

/// Whether the word at `i` is a member of a dotted field path (`threadStateDatabase.timeout.flags`)
/// rather than a word of the sentence: debug prints name fields, and a field called "timeout" or
/// "error" says nothing went wrong.
pub(super) fn in_member_path(lower: &[u8], i: usize) -> bool {
    i >= 2 && lower[i - 1] == b'.' && lower[i - 2].is_ascii_alphanumeric()
}

pub(super) fn is_harmless(text: &str) -> bool {
    harmless_words().is_match(text) || is_identity_line(text)
}

/// `NVRM: GPU at PCI:0000:9b:00: GPU-...` identity lines, also those without a UUID we could
/// parse. Only as the start of the message: the same words inside a sentence name the GPU an
/// error is about (`Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00 ... The GPU
/// likely needs to be reset.`).
pub(super) fn is_identity_line(text: &str) -> bool {
    let t = text.trim_start();
    let t = t.strip_prefix("NVRM:").map_or(t, str::trim_start);
    t.starts_with("GPU at PCI:")
}

/// Whether an `NVRM: ` message body carries on the sentence of the line before it: the driver
/// prints a long notice as several lines, and a tail line ("corruption and stability problems, and
/// is not supported.") means nothing on its own. It starts with a lower-case word that is not a
/// function name (`nvAssertFailedNoLog:`, `os_schedule:`) and not itself an error word ("failed
/// to ...", which starts a message of its own).
pub fn continues_sentence(body: &str) -> bool {
    let first = body.split(' ').next().unwrap_or("");
    first.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && !first.contains([':', '_', '(', '='])
        && !ERROR_WORDS.iter().any(|w| {
            // Case-blind, without a lower-cased copy of the word per error word.
            first
                .as_bytes()
                .get(..w.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(w.as_bytes()))
        })
}

/// Whether an `NVRM: ` message body ends its sentence (so the next line starts a new message).
pub fn ends_sentence(body: &str) -> bool {
    body.trim_end().ends_with(['.', '!', '?'])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The automata answer as one search per word did, on every line of the corpus and the
    /// unseen rounds and on made-up lines (words at the edges, in member paths, repeated).
    #[test]
    fn the_word_automata_answer_as_a_search_per_word() {
        let per_word_signal = |text: &str| {
            let lower = text.as_bytes()[..text.len().min(256)].to_ascii_lowercase();
            ERROR_WORDS.iter().any(|w| {
                memchr::memmem::find_iter(&lower, w.as_bytes()).any(|i| !in_member_path(&lower, i))
            })
        };
        let per_word_harmless =
            |text: &str| HARMLESS.iter().any(|h| text.contains(h)) || is_identity_line(text);
        let mut lines: Vec<String> = [
            "error",
            "x.error",
            "a.error then error",
            "state.timeout.flags",
            "TIMEOUT",
            "timeoutimeout",
            "Loaded the UVM driver",
            "NVRM: GPU at PCI:0000:01:00: GPU-1",
            "vgaarb: changed",
            "",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        lines.extend(crate::classify::testing::fixture_lines());
        for l in &lines {
            assert_eq!(has_error_signal(l), per_word_signal(l), "{l}");
            assert_eq!(is_harmless(l), per_word_harmless(l), "{l}");
        }
    }
}
