//! Kernel call traces, crash reports and hung tasks: which frames and tasks are NVIDIA's.

use super::*;

/// The NVIDIA module named by a trailing `[module]` (or `[module]]`) of a frame or RIP line.
pub fn frame_module(line: &str) -> Option<&'static str> {
    let t = line.trim_end();
    let inner = match t.rfind('[') {
        Some(open) => t[open + 1..].trim_end_matches(']'),
        None => bare_module(t)?,
    };
    NVIDIA_MODULES.iter().copied().find(|m| *m == inner)
}

/// The module of a frame or instruction pointer line whose paste lost the brackets
/// (`...isFECSupportedEv+0x4/0x10 nvidia_modeset`): the word after the symbol's
/// `+offset/length`, when it is a name.
fn bare_module(t: &str) -> Option<&str> {
    let (sym, name) = t.rsplit_once(' ')?;
    let (head, len) = sym.rsplit_once("/0x")?;
    let sized =
        head.contains("+0x") && !len.is_empty() && len.bytes().all(|b| b.is_ascii_hexdigit());
    let named = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    (sized && named).then_some(name)
}

/// The NVIDIA module a line names in brackets anywhere in it (`... provided by
/// nvidia_frontend_exit_module [nvidia]. Use ...`), as a line of a crash report does that is not a
/// frame.
pub fn named_module(line: &str) -> Option<&'static str> {
    let mut rest = line;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        let close = after.find(']')?;
        if let Some(m) = NVIDIA_MODULES
            .iter()
            .copied()
            .find(|m| *m == &after[..close])
        {
            return Some(m);
        }
        rest = &after[close + 1..];
    }
    None
}

/// Whether a line is a call-trace frame (`sym+0x1f/0x40 [mod]`, with `? ` and `[<addr>] `), or a
/// frame in a module whose paste lost its offsets (`nvkms_ioctl_from_kapi_try_pmlock
/// [nvidia_modeset]`: a reporter's cleanup; without a module, a bare symbol is no frame, the
/// word alone saying nothing).
pub fn is_frame(line: &str) -> bool {
    let t = frame_text(line);
    let Some(plus) = t.find("+0x") else {
        return bare_frame_symbol(t).is_some();
    };
    let sym = &t[..plus];
    !sym.is_empty()
        && !sym.contains(' ')
        && t[plus..].contains("/0x")
        && sym
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'$'))
}

/// Whether `msg` is a kernel symbol alone (` __schedule`, ` schedule_timeout`, indented under a
/// report's `Call Trace:`): a frame of a trace pasted without offsets, when a report is open.
pub fn is_bare_symbol(msg: &str) -> bool {
    let sym = msg.trim();
    sym.len() > 1
        && sym
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.'))
        && sym.bytes().any(|b| b.is_ascii_alphabetic())
}

/// The symbol of a frame without offsets, `symbol [module]` and nothing else.
pub(crate) fn bare_frame_symbol(t: &str) -> Option<&str> {
    let (sym, module) = t.trim_end().split_once(" [")?;
    let module = module.strip_suffix(']')?;
    let ident = |s: &str, extra: &[u8]| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || extra.contains(&b))
    };
    (ident(sym, b".$") && ident(module, b"-")).then_some(sym)
}

/// A frame line without its leading `[<address>]`, `? ` and spaces.
pub(super) fn frame_text(line: &str) -> &str {
    let mut t = line.trim_start();
    if t.starts_with("[<") {
        if let Some(end) = t.find(">]") {
            t = t[end + 2..].trim_start();
        }
    }
    t.strip_prefix("? ").unwrap_or(t).trim_start()
}

/// A module that cannot load because of NVIDIA's symbols: `nvidia: disagrees about version of
/// symbol X`, `nv_peer_mem: Unknown symbol nvidia_p2p_get_pages (err -22)`, `nvidia_fs: module
/// using GPL-only symbols uses symbols nvidia_p2p_get_pages from proprietary module nvidia.`.
/// Either the module or the symbol is NVIDIA's; other modules' symbol trouble is not ours.
pub(super) fn module_symbol(m: &str) -> Option<Shape> {
    // Both wordings say "symbol"; the regexes run only on lines that do (not on every frame).
    if !m.contains(" symbol") {
        return None;
    }
    let (module, what, nvidia) = if let Some(c) = re_module_sym().captures(m) {
        let what = format!("{} {}", &c[2], &c[3]);
        (c[1].to_string(), what, is_nvidia_name(&c[3]))
    } else if let Some(c) = re_gpl_only().captures(m) {
        // Newer kernels name the symbol, older ones only the module that owns it: `nvidia_fs:
        // module using GPL-only symbols uses symbols from proprietary module nvidia.`
        let owner = &c[3];
        let what = match c.get(2) {
            Some(sym) => format!(
                "may not use the GPL-only symbols of {owner}: {}",
                sym.as_str()
            ),
            None => format!("may not use the GPL-only symbols of {owner}"),
        };
        let nvidia = is_nvidia_name(owner) || c.get(2).is_some_and(|s| is_nvidia_name(s.as_str()));
        (c[1].to_string(), what, nvidia)
    } else {
        return None;
    };
    if !(nvidia || is_nvidia_name(&module)) {
        return None;
    }
    Some(Shape::InitFailure {
        id: crate::classify::shape_id::INIT_MODULE_SYMBOL,
        pci: None,
        what: format!("module {module}: {what}"),
        module: Some(module),
        code: None,
        folds: false,
    })
}

/// One module loader's words for a module it could not load.
pub(super) struct Loader {
    /// The words just before the module's name.
    phrase: &'static str,
    /// The character that ends the name.
    end: char,
    /// Whether the rest of the line, after the name, says the load failed (a loader whose words
    /// also report other things checks them; most say nothing else).
    failed: fn(&str) -> bool,
}

/// Any rest of the line: the phrase itself says the load failed.
fn always(_: &str) -> bool {
    true
}

/// What module loaders print when they cannot load a module: `systemd-modules-load[1054]: Failed
/// to insert module 'nvidia_uvm': Cannot allocate memory`, `modprobe: ERROR: could not insert
/// 'nvidia': No such device`, `modprobe: ERROR: ... could not find module by
/// name='nvidia_331_uvm'`, `modprobe: FATAL: Module nvidia-uvm not found.`, the old loader's
/// `FATAL: Error inserting nvidia (...): No such device`. The kernel often logs nothing of its
/// own for these. A name given as a file (`.../nvidia.ko`) is the module's.
pub(super) const MODULE_LOADER: &[Loader] = &[
    Loader {
        phrase: "Failed to insert module '",
        end: '\'',
        failed: always,
    },
    // systemd-modules-load for a module the running kernel does not have (`Failed to find module
    // 'nvidia-uvm'`: not built or not installed for it).
    Loader {
        phrase: "Failed to find module '",
        end: '\'',
        failed: always,
    },
    Loader {
        phrase: "could not insert '",
        end: '\'',
        failed: always,
    },
    Loader {
        phrase: "could not find module by name='",
        end: '\'',
        failed: always,
    },
    Loader {
        phrase: "FATAL: Module ",
        end: ' ',
        failed: always,
    },
    // module-init-tools, before kmod: `FATAL: Error inserting nvidia (/lib/modules/.../nvidia.ko):
    // No such device`.
    Loader {
        phrase: "FATAL: Error inserting ",
        end: ' ',
        failed: always,
    },
    // insmod naming the module's file: `insmod: ERROR: could not insert module
    // /lib/modules/.../nvidia.ko: Unknown symbol in module`.
    Loader {
        phrase: "could not insert module ",
        end: ':',
        failed: always,
    },
    // A module tool that finds none by that name: `modinfo: ERROR: Module nvidia not found.`
    // (rmmod's `ERROR: Module nvidia is in use` is no failure).
    Loader {
        phrase: "ERROR: Module ",
        end: ' ',
        failed: |rest| rest.starts_with("not found"),
    },
    // modprobe running a distribution's install command for the module, which failed: `Error
    // running install command 'modprobe -i nvidia-legacy-304xx ' for module nvidia: retcode 127`
    // (modprobe's `could not find option '...' for module nvidia: ignored` is no failure).
    Loader {
        phrase: "' for module ",
        end: ':',
        failed: |rest| rest.trim_start().starts_with("retcode"),
    },
    // FreeBSD's kernel linker: `KLD nvidia.ko: depends on kernel - not available or version
    // mismatch` (the port built for another kernel), `KLD nvidia-modeset.ko: depends on nvidia`;
    // it also says when it loaded one, so only an error counts.
    Loader {
        phrase: "KLD ",
        end: ':',
        failed: super::words::has_error_signal,
    },
];

/// Where a module loader's failure for an NVIDIA module starts in `line` (at the phrase), with
/// the module and the rest of the line.
pub fn module_loader_failure(line: &str) -> Option<(usize, &str, &str)> {
    MODULE_LOADER.iter().find_map(|l| {
        let at = line.find(l.phrase)?;
        let after = &line[at + l.phrase.len()..];
        let (name, rest) = after.split_once(l.end)?;
        let file = name.rsplit('/').next().unwrap_or(name);
        let module = file.strip_suffix(".ko").unwrap_or(file);
        (is_nvidia_name(module) && (l.failed)(rest)).then_some((at, module, rest))
    })
}

/// A module loader that could not load an NVIDIA module (see [`MODULE_LOADER`]).
pub(super) fn module_insert(m: &str) -> Option<Shape> {
    let (_, module, rest) = module_loader_failure(m)?;
    // The old loader names the file in parentheses before the reason.
    let rest = match rest.strip_prefix('(') {
        Some(r) => r.split_once("):").map_or(rest, |(_, after)| after),
        None => rest,
    };
    let reason = rest.trim_start_matches(':').trim().trim_end_matches('.');
    let what = if reason.is_empty() || reason == "not found" {
        format!("module {module} could not be loaded (not found)")
    } else {
        format!("module {module} could not be loaded ({reason})")
    };
    Some(Shape::InitFailure {
        id: crate::classify::shape_id::INIT_MODULE_LOAD,
        pci: None,
        module: Some(module.to_string()),
        what,
        code: None,
        folds: false,
    })
}

/// The power-management core reporting that an NVIDIA callback failed: `PM: pci_pm_suspend():
/// nv_pmops_suspend+0x0/0x40 [nvidia] returns -5` (suspend or resume of the GPU failed).
pub fn pm_callback_module(m: &str) -> Option<&'static str> {
    let rest = m.strip_prefix("PM: ")?;
    let i = rest.find(" returns -")?;
    frame_module(&rest[..i])
}

pub(super) fn pm_callback(m: &str) -> Option<Shape> {
    let module = pm_callback_module(m)?;
    Some(Shape::ModuleError {
        module,
        pci: None,
        text: m.trim_end().to_string(),
    })
}

/// NVIDIA's kernel modules and exported symbols: `nvidia`, `nvidia_uvm`, `nvidia-drm`,
/// `nv_peer_mem`, `nvidia_p2p_get_pages`.
pub(super) fn is_nvidia_name(name: &str) -> bool {
    name.starts_with("nvidia") || name.starts_with("nv_peer_mem")
}

/// Hung-task reports, call-trace headers and frames.
pub(super) fn parse_trace(msg: &str) -> Option<Shape> {
    let t = msg.trim_start();
    if let Some(rest) = t.strip_prefix("INFO: task ") {
        // `INFO: task NAME:PID blocked for more than N seconds.`, or (newer kernels) `INFO: task
        // NAME:PID blocked on a mutex|semaphore likely last held by task OTHER:PID`.
        let i = hung_wording(rest)?;
        let name = rest[..i].rsplit_once(':').map_or(&rest[..i], |(n, _)| n);
        return Some(Shape::TraceStart {
            task: Some(name.to_string()),
            hung: true,
            module: task_module(name),
            by_task: true,
            text: t.trim_end().to_string(),
        });
    }
    if let Some(rest) = t.strip_prefix("task:") {
        // `task:NAME state:D stack:0 pid:...` (newer kernels, after the INFO line).
        let i = rest.find(" state:")?;
        let name = rest[..i].trim();
        let hung = rest[i..].starts_with(" state:D");
        return Some(Shape::TraceStart {
            task: Some(name.to_string()),
            hung,
            module: if hung { task_module(name) } else { None },
            by_task: true,
            text: t.trim_end().to_string(),
        });
    }
    // Kernel crash and warning headers (`BUG: unable to handle page fault for address: ...`,
    // `BUG: kernel NULL pointer dereference`, `BUG: soft lockup - CPU#1 stuck for 26s!`,
    // `general protection fault ...`, `kernel BUG at ...`, `WARNING: CPU: 5 PID: 22400 at
    // .../nvidia/nv.c:4405 nv_restore_user_channels+0x57/0x200 [nvidia]`). Whose crash it is
    // comes from what follows (the task, the RIP, the frames): one outside NVIDIA's modules
    // stays silent.
    if let Some(h) = crash_header(t) {
        let task = header_task(h);
        let named = frame_module(h).or_else(|| source_module(h));
        return Some(Shape::TraceStart {
            task: task.map(str::to_string),
            hung: false,
            module: named.or_else(|| task.and_then(task_module)),
            by_task: named.is_none(),
            text: h.trim_end().to_string(),
        });
    }
    // `CPU: 5 PID: 9577 Comm: nvidia-smi Tainted: P O 5.19.17 #2`: the task a crash dump was
    // taken in. An NVIDIA tool or kernel thread crashing is a crash in the driver.
    if let Some(name) = crash_task(t) {
        return Some(Shape::TraceStart {
            task: Some(name.to_string()),
            hung: false,
            module: task_module(name),
            by_task: true,
            text: t.trim_end().to_string(),
        });
    }
    if t.starts_with("Call Trace:") || t.starts_with("Call trace:") {
        return Some(Shape::TraceStart {
            task: None,
            hung: false,
            module: None,
            by_task: false,
            text: t.trim_end().to_string(),
        });
    }
    if t.starts_with("RIP: ") || t.starts_with("pc : ") {
        return Some(Shape::TraceStart {
            task: None,
            hung: false,
            module: frame_module(t),
            by_task: false,
            text: t.trim_end().to_string(),
        });
    }
    if t.contains("usercopy") && t.contains("'nvidia") {
        return Some(Shape::TraceStart {
            task: None,
            hung: false,
            module: Some("nvidia"),
            by_task: false,
            text: t.trim_end().to_string(),
        });
    }
    if is_frame(t) {
        return Some(Shape::TraceFrame {
            module: frame_module(t),
        });
    }
    None
}

/// Kernel crash and warning headers, as they start a message.
pub const CRASH_HEADERS: &[&str] = &[
    "BUG: ",
    "general protection fault",
    "kernel BUG at ",
    "WARNING: CPU: ",
    // arm64's page-fault oops (Grace, Jetson, a board with a PCIe card): `Unable to handle kernel
    // NULL pointer dereference at virtual address ...`, then `Internal error: Oops: ...`, the
    // modules, `pc : symbol+0x1c/0x40 [nvidia]` and the call trace.
    "Unable to handle kernel ",
];

/// The undefined-behaviour sanitizer's report header (`UBSAN: array-index-out-of-bounds in
/// build/nvidia/535.171.04/build/nvidia-uvm/uvm_pmm_gpu.c:2038:44`): a crash header only where its
/// source path is in an NVIDIA module, so that the `nvidia` literal finds every one that counts
/// and the first stage needs no search of its own for it.
pub fn is_nvidia_sanitizer_report(t: &str) -> bool {
    t.strip_prefix("UBSAN: ")
        .is_some_and(|r| r.contains(" in ") && source_module(r).is_some())
}

/// The literal of an oops's die line: the first oops of a boot (`[#1]`). Later ones follow it,
/// and a kernel tainted by the first (`D`) says little new.
pub const DIE_LITERAL: &str = "[#1]";

/// Where the die line of an oops starts in `line`: `Oops: 0000 [#1] PREEMPT SMP NOPTI`, `divide
/// error: 0000 [#1] SMP`, `invalid opcode: 0000 [#1] ...` (the kernel's `die()`: what happened,
/// the error code in hex, the oops count). Under a `BUG:` header it is a line of that report;
/// where the paste cut the header off, or the oops has none (a divide error), it is the header,
/// and the instruction pointer and frames below say whose crash it is.
///
/// Any oops count is read (`[#2]` inside an open report is a line of it); the first stage finds
/// only [`DIE_LITERAL`]. Each ` [#` of the line is tried, so a bracket earlier in the line does
/// not hide the die line after it.
pub fn die_start(line: &str) -> Option<usize> {
    memchr::memmem::find_iter(line.as_bytes(), b" [#").find_map(|at| die_at(line, at))
}

/// [`die_start`] for the ` [#` at byte `at`.
fn die_at(line: &str, at: usize) -> Option<usize> {
    let head = &line[..at];
    // The error code: hex digits after `: `.
    let colon = head.rfind(": ")?;
    let code = &head[colon + 2..];
    if !(4..=16).contains(&code.len()) || !code.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    // What happened: words of letters before the colon (`Oops`, `divide error`, `stack segment`).
    // Searched by bytes, so one past the last other byte is a character boundary (one past a
    // wide character's start, which a `char` search gives, is inside it).
    let words = &head[..colon];
    let what = words
        .bytes()
        .rposition(|c| !(c.is_ascii_alphabetic() || c == b' '))
        .map_or(words, |i| &words[i + 1..])
        .trim_start();
    let start = words.len() - what.len();
    let count = line[at + 3..].split(']').next()?;
    (!what.is_empty()
        && what.split(' ').all(|w| !w.is_empty())
        && !count.is_empty()
        && count.bytes().all(|b| b.is_ascii_digit()))
    .then_some(start)
}

/// Where a kernel crash or warning header starts in `line`, if it holds one.
pub fn crash_start(line: &str) -> Option<usize> {
    CRASH_HEADERS
        .iter()
        .filter_map(|h| line.find(h))
        .chain(
            line.find("UBSAN: ")
                .filter(|&i| is_nvidia_sanitizer_report(&line[i..])),
        )
        .chain(die_start(line))
        .min()
        .or_else(|| {
            line.find("WARNING")
                .filter(|&i| warning_at_source(&line[i..]))
        })
}

/// Whether `t` starts with a crash header (a hung task's report is not one).
pub fn is_crash_header(t: &str) -> bool {
    crash_header(t).is_some()
}

/// Whether `m` is one of NVIDIA's kernel modules, as the kernel names them.
pub fn is_nvidia_module(m: &str) -> bool {
    NVIDIA_MODULES.contains(&m)
}

/// A crash report's `Modules linked in:` line: whether it names out-of-tree modules (a flag
/// group with `O`, `nvidia(POE)`) and all of them are NVIDIA's. `None` for any other line.
pub fn modules_linked_in(line: &str) -> Option<bool> {
    const HEAD: &str = "Modules linked in:";
    let i = line.find(HEAD)?;
    let mut any = false;
    for word in line[i + HEAD.len()..].split_whitespace() {
        let Some((name, flags)) = word.split_once('(') else {
            continue;
        };
        if flags.contains('O') {
            if !is_nvidia_module(name) {
                return Some(false);
            }
            any = true;
        }
    }
    Some(any)
}

/// An instruction-pointer line of a crash report (`RIP: 0010:ext4_readdir+0x3c/0x9a0 [ext4]`,
/// `IP: [<ffffffffc01cc246>] amdgpu_bo_list_set+0x196/0x3d0 [amdgpu]`, arm64's `pc : ...`): the
/// module the fault is in, or `None` inside for core kernel code. Not such a line, or a user-space
/// address (`RIP: 0033:0x7f...`, the task's own code): `None`.
pub fn ip_line_module(t: &str) -> Option<Option<&str>> {
    let t = t.trim_start();
    let rest = t
        .strip_prefix("RIP: ")
        .or_else(|| t.strip_prefix("IP: "))
        .or_else(|| t.strip_prefix("pc : "))?;
    if rest.starts_with("0033:") {
        return None;
    }
    let r = rest.trim_end();
    if let Some(inner) = r.strip_suffix(']') {
        if let Some(open) = inner.rfind('[') {
            let name = &inner[open + 1..];
            if !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Some(Some(name));
            }
        }
    }
    // A paste that lost the brackets: the word after the symbol's `+offset/length`.
    if let Some(name) = bare_module(r) {
        return Some(Some(name));
    }
    Some(None)
}

/// The crash header `t` starts with, from the header on (`watchdog: BUG: soft lockup` included).
pub(super) fn crash_header(t: &str) -> Option<&str> {
    let t = t.strip_prefix("watchdog: ").unwrap_or(t);
    let t = t.strip_prefix("NMI watchdog: ").unwrap_or(t);
    (CRASH_HEADERS.iter().any(|h| t.starts_with(h))
        || warning_at_source(t)
        || is_nvidia_sanitizer_report(t)
        || die_start(t) == Some(0))
    .then_some(t)
}

/// The task a lockup header names at its end: `BUG: soft lockup - CPU#2 stuck for 104s!
/// [nvidia-modeset/:1314]` is the `nvidia-modeset/` kernel thread, pid 1314.
pub(super) fn header_task(h: &str) -> Option<&str> {
    if !h.contains(" stuck for ") {
        return None;
    }
    let inner = h.trim_end().strip_suffix(']')?;
    let (_, inner) = inner.rsplit_once('[')?;
    let (name, pid) = inner.rsplit_once(':')?;
    (!name.is_empty() && !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())).then_some(name)
}

/// A kernel warning that names its source line without `CPU:` first: newer kernels print
/// `WARNING: drivers/x/y.c:123 at func+0x1/0x2, CPU#3: comm/42`, and people shorten it to
/// `WARNING at nvidia-drm/nvidia-drm-drv.c:1221 func+0x327/0x340`. The source path must end in
/// `:LINE`, which keeps other programs' "WARNING: ..." sentences out.
pub fn warning_at_source(t: &str) -> bool {
    let rest = t
        .strip_prefix("WARNING: ")
        .or_else(|| t.strip_prefix("WARNING at "));
    let Some(path) = rest.and_then(|r| r.split_whitespace().next()) else {
        return false;
    };
    path.contains('/')
        && path
            .rsplit_once(':')
            .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The NVIDIA module a kernel warning's source path is in (`.../nvidia-drm/nvidia-drm-drv.c:1221`
/// is nvidia_drm), when the line names no module in brackets. The last part of the path that names
/// one: a DKMS build tree holds the module's folder under the package's
/// (`build/nvidia/535.171.04/build/nvidia-uvm/uvm_pmm_gpu.c` is nvidia_uvm, not nvidia).
pub fn source_module(h: &str) -> Option<&'static str> {
    h.split_whitespace()
        .filter(|w| w.contains('/'))
        .flat_map(|w| w.split('/'))
        .rev()
        .find_map(task_module)
}

/// The task named by a crash dump's `CPU: N PID: N Comm: NAME ...` line (`UID: N` may come
/// between, as newer kernels print it).
pub fn crash_task(t: &str) -> Option<&str> {
    let rest = t.strip_prefix("CPU: ")?;
    let i = rest.find(" Comm: ")?;
    if !rest[..i].contains("PID: ") {
        return None;
    }
    rest[i + " Comm: ".len()..].split_whitespace().next()
}

/// Where a hung-task line's wording starts, in any kernel's words: `blocked for more than N
/// seconds`, or `blocked on a mutex|semaphore|rw-semaphore likely last held by task ...`.
pub fn hung_wording(rest: &str) -> Option<usize> {
    rest.find(" blocked for more than")
        .or_else(|| rest.find(" blocked on a"))
}

/// The NVIDIA module a kernel thread or NVIDIA tool belongs to, by its task name: a hang of
/// `nvidia-modeset/0` or of `nvidia-smi` is a hang in the driver even when no frame is logged.
pub(super) fn task_module(name: &str) -> Option<&'static str> {
    let mut n = name.to_ascii_lowercase();
    // A threaded interrupt handler is named after its device's driver: `irq/181-nvidia`.
    if let Some((_, driver)) = n
        .strip_prefix("irq/")
        .and_then(|r| r.split_once('-'))
        .filter(|(num, _)| num.bytes().all(|b| b.is_ascii_digit()))
    {
        n = driver.to_string();
    }
    if n.starts_with("nvidia-modeset") || n.starts_with("nvidia_modeset") {
        Some("nvidia_modeset")
    } else if n.starts_with("nvidia-drm") || n.starts_with("nvidia_drm") {
        Some("nvidia_drm")
    } else if n.starts_with("nvidia-uvm") || n.starts_with("nvidia_uvm") || n.starts_with("uvm ") {
        Some("nvidia_uvm")
    } else if n.starts_with("nvidia") || n.starts_with("nv_queue") || n.starts_with("nvc:[") {
        // `nvc:[driver]` is the container library's helper that holds the driver open for
        // nvidia-container-cli; hung, it waits inside the driver.
        Some("nvidia")
    } else {
        None
    }
}
