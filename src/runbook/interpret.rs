//! Notes on what step output means, for the on-call (pure).
//!
//! A note is one sentence attached to a step: "a row remap is pending", "the kernel module and the
//! user-space driver differ". Notes read program output only to explain it; nothing here feeds a
//! command line.

use crate::model::{PciAddress, StepResult};

/// Notes on the output of one program.
pub fn program_notes(program: &str, output: &str) -> Vec<String> {
    let mut notes = driver_state_notes(output);
    match program {
        "nvidia-smi" => notes.extend(nvidia_smi_notes(output)),
        "lspci" => notes.extend(lspci_notes(output)),
        "lsmod" => {
            let listed = output.lines().any(|l| l.starts_with("Module"));
            if listed && !output.lines().any(|l| l.starts_with("nvidia ")) {
                notes.push("the nvidia kernel module is not loaded".into());
            }
        }
        _ => {}
    }
    notes
}

/// Notes on the answer of an NVML query step (`key: value` lines): the same findings as from
/// nvidia-smi, so a pending row remap read through NVML is not a silent "done".
pub fn nvml_notes(output: &str) -> Vec<String> {
    let value = |k: &str| {
        output
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(key, _)| key.trim() == k)
            .map(|(_, v)| v.trim().to_ascii_lowercase())
    };
    let yes = |k: &str| value(k).is_some_and(|v| v == "true" || v == "yes" || v == "1");
    let mut notes = Vec::new();
    if yes("pending") {
        notes.push(
            "a row remap is pending: it takes effect at the next GPU reset; drain the GPU's \
             jobs and schedule a reset (xidwatch never resets anything)"
                .into(),
        );
    }
    if yes("failure") {
        notes.push(
            "row remapping failed: a memory bank has no spare rows left; the GPU needs \
             replacing (RMA, contact support)"
                .into(),
        );
    }
    if yes("pending_retirement") {
        notes.push(
            "a page retirement is pending: it takes effect when the GPU is reset or the \
             driver reloaded"
                .into(),
        );
    }
    notes
}

/// What nvidia-smi (or NVML through it) says when it cannot reach the GPU or the driver.
fn driver_state_notes(output: &str) -> Vec<String> {
    const SIGNS: &[(&str, &str)] = &[
        (
            "couldn't communicate with the NVIDIA driver",
            "nvidia-smi cannot reach the driver: the kernel module is not loaded, failed to \
             initialise, or every GPU is gone",
        ),
        (
            "Driver/library version mismatch",
            "the loaded kernel module and the user-space driver are different versions: the \
             driver was upgraded without a reboot or module reload",
        ),
        ("No devices were found", "the driver sees no GPU at all"),
        (
            "Unable to determine the device handle",
            "the driver has lost this GPU: it no longer answers; recovering it takes a GPU \
             reset or a reboot, decided by a person",
        ),
        (
            "GPU requires reset",
            "the driver reports that this GPU needs a reset before it can be used again",
        ),
    ];
    SIGNS
        .iter()
        .filter(|(sign, _)| output.contains(sign))
        .map(|(_, note)| note.to_string())
        .collect()
}

/// `nvidia-smi -q` output as (section path, key, value), from its indentation.
fn nvsmi_fields(output: &str) -> Vec<(Vec<&str>, &str, &str)> {
    let mut stack: Vec<(usize, &str)> = Vec::new();
    let mut out = Vec::new();
    for line in output.lines() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        match t
            .split_once(" : ")
            .or_else(|| t.strip_suffix(" :").map(|k| (k, "")))
        {
            Some((k, v)) => {
                let path = stack.iter().map(|(_, s)| *s).collect();
                out.push((path, k.trim(), v.trim()));
            }
            None => stack.push((indent, t)),
        }
    }
    out
}

fn leading_number(v: &str) -> Option<f64> {
    v.split_whitespace().next()?.parse().ok()
}

fn nvidia_smi_notes(output: &str) -> Vec<String> {
    let fields = nvsmi_fields(output);
    let mut notes = Vec::new();
    let under = |path: &[&str], section: &str| path.contains(&section);
    let mut uncorrectable = Vec::new();
    let mut throttles = Vec::new();
    let (mut temp, mut slowdown, mut draw, mut limit) = (None, None, None, None);
    for (path, key, value) in &fields {
        let path = path.as_slice();
        if under(path, "Remapped Rows") && *key == "Pending" && *value == "Yes" {
            notes.push(
                "a row remap is pending: it takes effect at the next GPU reset; drain the GPU's \
                 jobs and schedule a reset (xidwatch never resets anything)"
                    .into(),
            );
        }
        if under(path, "Remapped Rows") && *key == "Remapping Failure Occurred" && *value == "Yes" {
            notes.push(
                "row remapping failed: a memory bank has no spare rows left; the GPU needs \
                 replacing (RMA, contact support)"
                    .into(),
            );
        }
        if under(path, "Retired Pages") && key.starts_with("Pending") && *value == "Yes" {
            notes.push(
                "a page retirement is pending: it takes effect when the GPU is reset or the \
                 driver reloaded"
                    .into(),
            );
        }
        if under(path, "ECC Errors")
            && under(path, "Volatile")
            && key.contains("Uncorrectable")
            && leading_number(value).is_some_and(|n| n > 0.0)
        {
            uncorrectable.push(format!("{key} {value}"));
        }
        if (under(path, "Clocks Event Reasons") || under(path, "Clocks Throttle Reasons"))
            && *value == "Active"
            && *key != "Idle"
            && *key != "Applications Clocks Setting"
        {
            throttles.push(*key);
        }
        if *key == "GPU Recovery Action" && !value.is_empty() && *value != "None" && *value != "N/A"
        {
            notes.push(format!(
                "the driver asks for: {value}; do it by hand after draining (xidwatch never does)"
            ));
        }
        match *key {
            "GPU Current Temp" => temp = leading_number(value),
            "GPU Slowdown Temp" => slowdown = leading_number(value),
            "Power Draw" | "Average Power Draw" | "Instantaneous Power Draw" if draw.is_none() => {
                draw = leading_number(value)
            }
            "Current Power Limit" | "Power Limit" if limit.is_none() => {
                limit = leading_number(value)
            }
            _ => {}
        }
    }
    if !uncorrectable.is_empty() {
        notes.push(format!(
            "uncorrectable ECC errors since the driver loaded: {}; jobs on this GPU have likely \
             failed and the GPU needs a reset (and a look at remapped rows)",
            uncorrectable.join(", ")
        ));
    }
    if !throttles.is_empty() {
        notes.push(format!("clocks are held down by: {}", throttles.join(", ")));
    }
    if let (Some(t), Some(s)) = (temp, slowdown) {
        if t >= s {
            notes.push(format!(
                "GPU at {t} C, at or above its slowdown temperature of {s} C: check cooling \
                 (fans, airflow, inlet temperature)"
            ));
        }
    }
    if let (Some(d), Some(l)) = (draw, limit) {
        if l > 0.0 && d >= 0.98 * l {
            notes.push(format!(
                "power draw {d} W is at the limit of {l} W: clocks are capped to stay under it"
            ));
        }
    }
    notes
}

/// lspci: devices whose configuration space reads as all ones, links running below their
/// capability. Each note names the device (the last header line seen).
fn lspci_notes(output: &str) -> Vec<String> {
    let mut gone: Vec<&str> = Vec::new();
    let mut downgraded: Vec<&str> = Vec::new();
    let mut device = "";
    for line in output.lines() {
        if !line.starts_with(char::is_whitespace) {
            device = line.split_whitespace().next().unwrap_or("");
        }
        if (line.contains("(rev ff)") || line.contains("Unknown header type 7f"))
            && !gone.contains(&device)
        {
            gone.push(device);
        }
        if line.contains("LnkSta:") && line.contains("downgraded") && !downgraded.contains(&device)
        {
            downgraded.push(device);
        }
    }
    let mut notes: Vec<String> = gone
        .iter()
        .map(|d| {
            format!(
                "{d}: configuration space reads return all ones: the device has fallen off the bus"
            )
        })
        .collect();
    notes.extend(
        downgraded
            .iter()
            .map(|d| format!("{d}: lspci reports its link as downgraded from what it supports")),
    );
    notes
}

/// A driver version such as `550.54.14` among the first few words after `marker`.
fn version_after(text: &str, marker: &str) -> Option<String> {
    let i = text.find(marker)?;
    text[i + marker.len()..]
        .split_whitespace()
        .take(4)
        .map(|w| w.trim_matches(|c: char| c == ',' || c == ':'))
        .find(|w| is_version(w))
        .map(str::to_string)
}

fn is_version(w: &str) -> bool {
    w.contains('.')
        && w.split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Same version, allowing one to be a shortened form of the other (`550.54` and `550.54.14`).
fn same_version(a: &str, b: &str) -> bool {
    a.split('.').zip(b.split('.')).all(|(x, y)| x == y)
}

fn ends_with(target: &[String], suffix: &str) -> bool {
    target.iter().any(|t| t.ends_with(suffix))
}

fn program(s: &StepResult) -> Option<&str> {
    (s.kind == "run")
        .then(|| s.target.first().map(String::as_str))
        .flatten()
}

/// Notes that need several steps: versions of the driver's parts, GPUs on the bus against GPUs
/// the driver has. Returns `(index of the step to attach to, note)`.
pub fn cross_notes(steps: &[StepResult]) -> Vec<(usize, String)> {
    let mut notes = Vec::new();
    let mut loaded = None;
    let mut userspace = None;
    let mut on_disk = None;
    let mut bus = None;
    let mut driver = None;
    for (i, s) in steps.iter().enumerate() {
        let out = s.output.as_str();
        if s.kind == "read" && ends_with(&s.target, "/proc/driver/nvidia/version") {
            if let Some(v) = version_after(out, "Kernel Module") {
                loaded = Some((i, v));
            }
        }
        if s.kind == "read"
            && ends_with(&s.target, "/sys/module/nvidia/version")
            && loaded.is_none()
        {
            let v = out.trim();
            if is_version(v) {
                loaded = Some((i, v.to_string()));
            }
        }
        if s.kind == "read"
            && s.target.len() == 1
            && ends_with(&s.target, "/proc/driver/nvidia/gpus")
        {
            let n = out
                .lines()
                .filter(|l| PciAddress::parse(l.trim()).is_ok())
                .count();
            driver = Some((i, n));
        }
        match program(s) {
            Some("nvidia-smi") => {
                let v = version_after(out, "NVIDIA-SMI version")
                    .or_else(|| version_after(out, "NVML library version"))
                    .or_else(|| version_after(out, "NVIDIA-SMI"));
                if let Some(v) = v {
                    userspace = Some((i, v));
                }
                if s.target.iter().any(|a| a == "-L" || a == "--list-gpus") && driver.is_none() {
                    let n = out.lines().filter(|l| l.starts_with("GPU ")).count();
                    if n > 0 || out.contains("No devices were found") {
                        driver = Some((i, n));
                    }
                }
            }
            Some("modinfo") => {
                let v = out
                    .lines()
                    .find_map(|l| l.strip_prefix("version:"))
                    .map(|v| v.trim().to_string())
                    .or_else(|| Some(out.trim().to_string()))
                    .filter(|v| is_version(v));
                if let Some(v) = v {
                    on_disk = Some((i, v));
                }
            }
            Some("lspci") => {
                let n = out
                    .lines()
                    .filter(|l| {
                        (l.contains("3D controller") || l.contains("VGA compatible controller"))
                            && (l.contains("NVIDIA") || l.contains("10de:"))
                    })
                    .count();
                if n > 0 && !s.target.iter().any(|a| a == "-s") {
                    bus = Some((i, n));
                }
            }
            _ => {}
        }
    }
    if let (Some((_, l)), Some((i, u))) = (&loaded, &userspace) {
        if !same_version(l, u) {
            notes.push((
                *i,
                format!(
                    "kernel module {l} is loaded but the user-space driver is {u}: they must \
                     match; reboot (or reload the module) after a driver upgrade"
                ),
            ));
        }
    }
    if let (Some((_, l)), Some((i, d))) = (&loaded, &on_disk) {
        if !same_version(l, d) {
            notes.push((
                *i,
                format!(
                    "the module on disk is {d} but {l} is loaded: the driver was upgraded and \
                     the machine not rebooted since"
                ),
            ));
        }
    }
    if let (Some((_, b)), Some((i, d))) = (bus, driver) {
        if b != d {
            notes.push((
                i,
                format!(
                    "{b} NVIDIA GPU(s) on the PCI bus but the driver has {d}: the missing ones \
                     failed to initialise or fell off the bus"
                ),
            ));
        }
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_nvml_pending_row_remap_is_a_finding() {
        let notes = nvml_notes("correctable: 0\nuncorrectable: 1\npending: true\nfailure: false\n");
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("row remap is pending"));
        assert!(nvml_notes("correctable: 0\npending: false\nfailure: false\n").is_empty());
        assert!(nvml_notes("pending_retirement: true\n")[0].contains("page retirement"));
    }
    use crate::model::StepStatus;

    const REMAP: &str = "\
==============NVSMI LOG==============

GPU 00000000:17:00.0
    Remapped Rows
        Correctable Error                 : 0
        Uncorrectable Error               : 2
        Pending                           : Yes
        Remapping Failure Occurred        : No
    ECC Errors
        Volatile
            SRAM Correctable              : 0
            DRAM Uncorrectable            : 2
        Aggregate
            DRAM Uncorrectable            : 7
    Clocks Event Reasons
        Idle                              : Not Active
        HW Thermal Slowdown               : Active
    Temperature
        GPU Current Temp                  : 91 C
        GPU Slowdown Temp                 : 87 C
";

    #[test]
    fn reads_nvidia_smi_sections() {
        let notes = program_notes("nvidia-smi", REMAP);
        assert!(
            notes.iter().any(|n| n.contains("row remap is pending")),
            "{notes:?}"
        );
        assert!(
            notes
                .iter()
                .any(|n| n.contains("DRAM Uncorrectable 2") && !n.contains('7')),
            "{notes:?}"
        );
        assert!(
            notes.iter().any(|n| n.contains("HW Thermal Slowdown")),
            "{notes:?}"
        );
        assert!(notes.iter().any(|n| n.contains("91 C")), "{notes:?}");
        assert!(!notes.iter().any(|n| n.contains("Remapping failed")));
    }

    #[test]
    fn driver_unreachable_and_lsmod() {
        let n = program_notes(
            "nvidia-smi",
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n",
        );
        assert_eq!(n.len(), 1);
        let n = program_notes("lsmod", "Module                  Size  Used by\nxfs 1 0\n");
        assert_eq!(
            n,
            vec!["the nvidia kernel module is not loaded".to_string()]
        );
        assert!(program_notes("lsmod", "Module  Size  Used by\nnvidia 1 0\n").is_empty());
        assert_eq!(
            program_notes(
                "lspci",
                "0000:17:00.0 3D controller: NVIDIA (rev a1)\n\tLnkSta:\tSpeed 2.5GT/s (downgraded)\n0000:18:00.0 3D controller: NVIDIA (rev ff)\n"
            ),
            vec![
                "0000:18:00.0: configuration space reads return all ones: the device has fallen off the bus".to_string(),
                "0000:17:00.0: lspci reports its link as downgraded from what it supports".to_string(),
            ]
        );
    }

    fn step(kind: &str, target: &[&str], output: &str) -> StepResult {
        StepResult {
            name: String::new(),
            kind: kind.into(),
            target: target.iter().map(|s| s.to_string()).collect(),
            status: StepStatus::Done { exit_code: Some(0) },
            output: output.into(),
            bytes_dropped: 0,
            duration_ms: 0,
            notes: vec![],
        }
    }

    #[test]
    fn versions_and_counts_across_steps() {
        let steps = vec![
            step(
                "read",
                &["/proc/driver/nvidia/version"],
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.14  Release Build\n",
            ),
            step("run", &["nvidia-smi", "--version"], "NVIDIA-SMI version  : 550.90.07\n"),
            step("run", &["modinfo", "-F", "version", "nvidia"], "550.90.07\n"),
            step(
                "run",
                &["lspci", "-D", "-d", "10de:"],
                "0000:17:00.0 3D controller: NVIDIA Corporation GH100 [10de:2330]\n0000:18:00.0 3D controller: NVIDIA Corporation GH100\n",
            ),
            step("read", &["/proc/driver/nvidia/gpus"], "0000:17:00.0\n"),
        ];
        let notes = cross_notes(&steps);
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(notes[0]
            .1
            .contains("kernel module 550.54.14 is loaded but the user-space driver is 550.90.07"));
        assert_eq!(notes[1].0, 2);
        assert!(notes[2]
            .1
            .starts_with("2 NVIDIA GPU(s) on the PCI bus but the driver has 1"));
        assert!(same_version("550.54", "550.54.14"));
    }
}
