//! Finding where the kernel message starts in a saved log line, whatever prefix the tool that
//! saved it put in front: raw kmsg headers, `dmesg` stamps in all their styles, syslog and journal
//! prefixes, other agents' re-emission prefixes. One file may mix them, so every line is looked at
//! on its own.
//!
//! Rather than enumerate prefix formats (there is always one more), we look for the first place
//! where a message we understand begins: an NVIDIA or PCIe tag at a word boundary, followed by the
//! exact shape that tag always has. A hostname such as `nvidia-node-7` fails that shape check.

/// What the prefix told us.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prefix {
    /// Kernel timestamp, microseconds since boot: from a kmsg header or a `[ 9512.238711]` stamp.
    pub ts_usec: Option<u64>,
    /// kmsg sequence number, for raw kmsg dumps.
    pub seq: Option<u64>,
    /// The prefix text, trimmed, for people (at most 80 characters).
    pub text: Option<String>,
}

/// A saved line split into its prefix and its message lines. A raw kmsg record, an rsyslog line
/// with `#012` or a forwarded record with the kernel's `\x0a` holds several message lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitLine {
    pub prefix: Prefix,
    pub messages: Vec<String>,
}

/// Splits one saved log line. `None` when no message we understand starts anywhere in it.
pub fn split(line: &str) -> Option<SplitLine> {
    let (prefix, messages) = split_borrowed(line)?;
    let messages = match messages {
        Messages::One(m) => vec![m.to_string()],
        Messages::Many(v) => v,
    };
    Some(SplitLine { prefix, messages })
}

/// The message lines of a saved line: usually one, borrowed from the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Messages<'a> {
    One(&'a str),
    /// A raw kmsg record, an rsyslog line with `#012` or a forwarded record with `\x0a` holds
    /// several.
    Many(Vec<String>),
}

impl Messages<'_> {
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        let (one, many) = match self {
            Messages::One(m) => (Some(*m), &[][..]),
            Messages::Many(v) => (None, &v[..]),
        };
        one.into_iter().chain(many.iter().map(String::as_str))
    }
}

/// [`split`] without copying the message in the common one-message case (the hot path of `scan`).
pub fn split_borrowed(line: &str) -> Option<(Prefix, Messages<'_>)> {
    split_borrowed_with(line, None)
}

/// [`split_borrowed`] that also knows the site's rows: a line in which no built-in message
/// starts is the site's when one of its rows' patterns matches in it, from where it matches.
pub fn split_borrowed_with<'a>(
    line: &'a str,
    site: Option<&crate::classify::table::Table>,
) -> Option<(Prefix, Messages<'a>)> {
    let (p, m) = split_ref_with(line, site)?;
    Some((
        Prefix {
            ts_usec: p.ts_usec,
            seq: p.seq,
            text: p.text.map(std::borrow::Cow::into_owned),
        },
        m,
    ))
}

/// A [`Prefix`] whose text is borrowed from the line where it can be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixRef<'a> {
    pub ts_usec: Option<u64>,
    pub seq: Option<u64>,
    pub text: Option<std::borrow::Cow<'a, str>>,
}

/// [`split_borrowed_with`] with the prefix text borrowed: `scan` copies it into one buffer it
/// keeps, where an owned text was an allocation (and a free) for every candidate line.
pub fn split_ref_with<'a>(
    line: &'a str,
    site: Option<&crate::classify::table::Table>,
) -> Option<(PrefixRef<'a>, Messages<'a>)> {
    if let Some(split) = split_kmsg(line) {
        let p = split.prefix;
        return Some((
            PrefixRef {
                ts_usec: p.ts_usec,
                seq: p.seq,
                text: p.text.map(std::borrow::Cow::Owned),
            },
            Messages::Many(split.messages),
        ));
    }
    // A line pasted as inline code (`` `[ 136.67] RIP: ... [nvidia_modeset]` ``) ends in backticks
    // that no kernel message has.
    // Most lines end in a visible ASCII byte, which neither trim would take: the char-wise trims
    // decoded the last characters of every line of a storm.
    let line = match line.as_bytes().last() {
        Some(c) if c.is_ascii_graphic() && *c != b'`' => line,
        _ => line.trim_end().trim_end_matches('`'),
    };
    let start = message_start(line).or_else(|| site?.message_start(line))?;
    let (head, msg) = line.split_at(start);
    let prefix = parse_prefix(head);
    let messages = match embedded_newlines(msg) {
        Some(lines) => Messages::Many(lines),
        None => Messages::One(crate::classify::trim::end(msg)),
    };
    Some((prefix, messages))
}

/// The message lines of a message that holds several, whatever prefix it came behind: rsyslog
/// writes a record's newlines as `#012`, and tools that forward `/dev/kmsg` text as they read it
/// (Talos's console, log shippers) keep the kernel's own escape, `\x0a`, with every other byte the
/// kernel escapes (`\x5c` for a backslash), which are undone here as the live source undoes them.
/// `None` for the usual one-line message, whose escapes are left as written: without a `\x0a`
/// there is no sign that the text is the kernel's escaped record rather than a message that
/// holds a backslash of its own. One pass for both marks: most messages hold neither `#`
/// nor `\`, and this runs on every candidate line of a scan.
fn embedded_newlines(msg: &str) -> Option<Vec<String>> {
    let b = msg.as_bytes();
    let (mut rsyslog, mut kmsg) = (false, false);
    for i in memchr::memchr2_iter(b'#', b'\\', b) {
        rsyslog |= b[i..].starts_with(b"#012");
        kmsg |= b[i..].starts_with(b"\\x0a");
        if rsyslog && kmsg {
            break;
        }
    }
    if !rsyslog && !kmsg {
        return None;
    }
    let text = if kmsg {
        std::borrow::Cow::Owned(crate::source::kmsg::record::unescape(b))
    } else {
        std::borrow::Cow::Borrowed(msg)
    };
    Some(
        text.split('\n')
            .flat_map(|l| l.split("#012"))
            .map(str::trim_end)
            .filter(|m| !m.is_empty())
            .map(str::to_string)
            .collect(),
    )
}

/// A raw `/dev/kmsg` dump line: `PRIO,SEQ,TS_USEC,FLAGS;MESSAGE` with `\xNN` escapes.
fn split_kmsg(line: &str) -> Option<SplitLine> {
    // The priority comes first and is digits: any other line is out before the search for `;`
    // (on a storm log every other line reaches here).
    if !line.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        return None;
    }
    // The record format is read in one place, where the live source reads `/dev/kmsg`.
    let rec = crate::source::kmsg::record::parse_record(line.as_bytes()).ok()?;
    let messages: Vec<String> = rec
        .message
        .split('\n')
        .map(str::trim_end)
        .filter(|m| !m.is_empty())
        .map(str::to_string)
        .collect();
    // Only lines that carry a message we understand are of interest.
    if !messages.iter().any(|m| message_start(m) == Some(0)) {
        return None;
    }
    Some(SplitLine {
        prefix: Prefix {
            ts_usec: Some(rec.ts_usec),
            seq: Some(rec.seq),
            text: Some(crate::source::kmsg::time::kernel_stamp(rec.ts_usec)),
        },
        messages,
    })
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// Byte offset where a message we understand starts, if any.
pub fn message_start(line: &str) -> Option<usize> {
    // Every message this reads holds a candidate literal (`scan` sees no other line), but for
    // the PCIe port driver's: its tag is in too many ordinary boot lines to be a literal, and old
    // kernels print AER's recovery lines (`device recovery failed`) without `AER:`. One SIMD
    // search rules out an ordinary line before the tag searches and a dozen anchor searches;
    // such a line is then searched for the port's tag alone (the three tag searches over every
    // ordinary record were a twentieth of the daemon's time). A line that starts with a literal
    // tag, the usual driver line, is a candidate already and skips that search (asked first, it
    // cost a storm of Xid lines a twentieth).
    let b = line.as_bytes();
    // After dmesg's `[  10.000226] ` stamp too: a storm's lines start so, and each skips the
    // search of its whole line (with the trim in `split_ref_with`, the storm log of
    // bench/scan.sh read in 0.90 of the user time, median of ten runs side by side). And after
    // syslog's and the journal's `... kernel: ` (with its stamp, if kept): on a GPU host's saved
    // journal every driver line starts so.
    let after_stamp = |at: usize| match b.get(at) {
        Some(b'[') => memchr::memchr(b']', &b[at..b.len().min(at + 40)]).map_or(at, |i| {
            let i = at + i + 1;
            i + b[i..].iter().take_while(|&&c| c == b' ').count()
        }),
        _ => at,
    };
    let lead = match b.first() {
        Some(b'[') => after_stamp(0),
        // Only where the line starts as syslog's or the journal's stamp does: the daemon asks
        // here about every kernel record, which has no such prefix, and a search for the tag in
        // each of them cost it a third of its rate.
        _ if syslog_like(b) => kernel_tag()
            .find(&b[..b.len().min(KERNEL_TAG_WITHIN)])
            .map_or(0, |i| after_stamp(i + kernel_tag().needle().len())),
        _ => 0,
    };
    if tag_finders()[..NON_LITERAL_TAGS]
        .iter()
        .any(|f| b[lead..].starts_with(f.needle()))
    {
        // Where no tag's first letter comes before this one, the search from the line's start
        // would come to this tag first: the checks it would make are made here, and the three
        // searches of the line are not (they were half of the prefix reader's time on a storm).
        // A plain loop: the stamp is short, and `memchr3` cost more than the search it saves.
        let [a, c, d] = tag_finders().each_ref().map(|f| f.needle()[0]);
        if !b[..lead].iter().any(|&x| x == a || x == c || x == d) && tag_at(line, lead) {
            return Some(lead);
        }
        return tag_start(line).or_else(|| other_start(line));
    }
    if !crate::classify::prefilter::Prefilter::shared().is_candidate(b) {
        return tag_start_among(line, &tag_finders()[NON_LITERAL_TAGS..]);
    }
    tag_start(line).or_else(|| other_start(line))
}

/// How far into a line syslog's and the journal's `kernel: ` tag is looked for (a host name and
/// a stamp come before it).
const KERNEL_TAG_WITHIN: usize = 96;

/// Whether `b` starts as a syslog or journal line does: a month's name (`Jan  5 ...`) or an ISO
/// date (`2024-01-05T...`). Other prefixes (other locales, `dmesg -T`) take the general path.
fn syslog_like(b: &[u8]) -> bool {
    let month = matches!(b, [m, o, n, b' ', ..]
        if m.is_ascii_uppercase() && o.is_ascii_lowercase() && n.is_ascii_lowercase());
    let iso = matches!(b, [y0, y1, y2, y3, b'-', ..]
        if [y0, y1, y2, y3].iter().all(|c| c.is_ascii_digit()));
    month || iso
}

/// The kernel's tag in syslog and journal lines, built once.
fn kernel_tag() -> &'static memchr::memmem::Finder<'static> {
    static F: std::sync::OnceLock<memchr::memmem::Finder<'static>> = std::sync::OnceLock::new();
    F.get_or_init(|| memchr::memmem::Finder::new(b" kernel: "))
}

/// Where the tags that are no candidate literal begin in [`tag_finders`].
const NON_LITERAL_TAGS: usize = 2;

/// The tag needles, built once: building a searcher per line cost more than the search. Those
/// before [`NON_LITERAL_TAGS`] are candidate literals (a test says so), which [`message_start`]
/// relies on.
fn tag_finders() -> &'static [memchr::memmem::Finder<'static>; 3] {
    static F: std::sync::OnceLock<[memchr::memmem::Finder<'static>; 3]> =
        std::sync::OnceLock::new();
    F.get_or_init(|| {
        [
            memchr::memmem::Finder::new(b"NVRM"),
            memchr::memmem::Finder::new(b"nvidia"),
            memchr::memmem::Finder::new(b"pcieport "),
        ]
    })
}

/// Where a driver tag (`NVRM`, `nvidia...`, `pcieport`) starts.
fn tag_start(line: &str) -> Option<usize> {
    tag_start_among(line, tag_finders())
}

/// [`tag_start`] for the tags of `finders` only.
fn tag_start_among(line: &str, finders: &[memchr::memmem::Finder<'static>]) -> Option<usize> {
    let b = line.as_bytes();
    let mut from = 0;
    while from < b.len() {
        // The tags all start with "NVRM", "nvidia" or "pcieport"; find the next such spot. Each
        // later needle is only looked for before the earliest hit so far: on an Xid line the
        // other two never scan the rest of the line.
        let mut at: Option<usize> = None;
        for finder in finders {
            let end = at.map_or(b.len(), |a| (a + finder.needle().len()).min(b.len()));
            if let Some(i) = finder.find(&b[from..end]) {
                at = Some(at.map_or(from + i, |a| a.min(from + i)));
            }
        }
        let at = at?;
        if tag_at(line, at) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// Whether the tag found at byte `at` starts a message: it starts a word, is no module named
/// inside a sentence (modprobe's install-command failure, `... for module nvidia: retcode 127`),
/// and has a tag's shape.
fn tag_at(line: &str, at: usize) -> bool {
    at_word_start(line.as_bytes(), at)
        && !line[..at].ends_with("module ")
        && tag_shape_ok(&line[at..])
}

/// Whether a tag at byte `at` starts a word: the line starts there, or the byte before is neither
/// part of a name (`libnvidia`, `x_NVRM`, `foo-nvidia`) nor of a path (`/lib/nvidia`,
/// `nvidia.ko`). Spaces and timestamps come before a tag, and so do the quotes, backticks,
/// markdown `>`, `<4>` priorities and `key=` or `"key":"` wrappers that pasted and re-emitted logs
/// put around the kernel's text; the tag's exact shape is checked after. So does an escaped
/// newline (`\n`) inside a quoted error string: a container runtime quotes its hook's stderr
/// whole (`stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: detection error: ...`).
fn at_word_start(b: &[u8], at: usize) -> bool {
    at == 0
        || !(b[at - 1].is_ascii_alphanumeric()
            || matches!(b[at - 1], b'_' | b'-' | b'.' | b'/' | b'\\'))
        || (at >= 2 && &b[at - 2..at] == b"\\n")
}

/// Messages that carry no driver tag: the X server NVIDIA driver's errors, NVML Xid events as the
/// Kubernetes device plugin logs them, the GSP crash report's first line, nvidia-drm's
/// `[drm:nv_drm_...]` errors, nvidia-smi and NVML error texts, hung-task reports and call-trace
/// lines (frames in NVIDIA modules; the headers, which decide nothing alone).
fn other_start(line: &str) -> Option<usize> {
    for a in anchors() {
        if let Some(at) = anchor_start(line, a) {
            return Some(at);
        }
    }
    // A crash header starts a message wherever it is (`watchdog: BUG: soft lockup`); whose crash
    // it is, the lines after it say.
    crate::classify::shapes::crash_start(line)
        .or_else(|| crate::classify::shapes::nvml_failure_start(line))
        .or_else(|| crate::classify::shapes::nvml_code(line).map(|(at, _)| at))
        .or_else(|| crate::classify::shapes::driver_unreachable_start(line))
        .or_else(|| frame_start(line))
        .or_else(|| symbol_start(line))
        .or_else(|| crate::classify::shapes::module_loader_failure(line).map(|(at, _, _)| at))
        .or_else(|| crate::classify::fabricmanager::record_start(line))
}

/// The message-start anchors, in the order they are tried: the hand parsers' before and after
/// the shape table's (rows with `anchor = true`), which are generated from the table so that a
/// row's lines are found wherever its literal is, and cannot drift from it.
fn anchors() -> &'static [&'static str] {
    static A: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    A.get_or_init(|| {
        let mut all = HAND_ANCHORS_FIRST.to_vec();
        all.extend(crate::classify::table::Table::builtin().anchors());
        all.extend_from_slice(HAND_ANCHORS_THEN);
        all
    })
}

/// The hand parsers' anchors tried before the table's.
const HAND_ANCHORS_FIRST: &[&str] = &[
    "(EE)",
    "XidCriticalError: Xid=",
    "XID ",
    "API mismatch",
    "API Mismatch",
    "GSP task ",
    "[drm:",
    // FreeBSD's DRM prints the level before the function: `[drm ERROR :func] [nvidia-drm] ...`.
    "[drm ERROR :",
    "[drm] [nvidia-drm] ",
];

/// The hand parsers' anchors tried after the table's.
const HAND_ANCHORS_THEN: &[&str] = &[
    "INFO: task ",
    "task:",
    "Call Trace:",
    "Call trace:",
    "RIP: ",
    " Comm: ",
    "Bad or missing usercopy",
    "PM: ",
    "nvgpu: ",
    // gdrcopy's kernel module (NVIDIA's GPUDirect copy driver), tagged without a space.
    "gdrdrv:",
    crate::classify::shapes::SMI_ERR_FIELD,
    "fabricmanager[",
    crate::classify::shapes::NVML_EXCEPTION,
    "[Hardware Error]: ",
];

/// Where the message that anchor `a` stands for starts in `line`, if it is there.
fn anchor_start(line: &str, a: &str) -> Option<usize> {
    let b = line.as_bytes();
    let i = crate::classify::find::find(b, a.as_bytes())?;
    let rest = &line[i..];
    let ok = match a {
        // The X server's NVIDIA driver: its message starts after the `(EE) ` marker.
        "(EE)" => {
            if let Some(at) = x_driver_tag(rest) {
                return Some(i + at);
            }
            // The X server's own loader failing on an NVIDIA module: from the marker.
            rest.strip_prefix("(EE) ")
                .is_some_and(crate::classify::shapes::x_module_load_failure)
        }
        "API mismatch" | "API Mismatch" => rest.contains("NVIDIA"),
        "XID " => crate::classify::shapes::agent_xid(rest).is_some(),
        "[drm:" | "[drm ERROR :" => crate::classify::shapes::is_nvidia_drm(rest),
        "INFO: task " => crate::classify::shapes::hung_wording(rest).is_some(),
        "PM: " => crate::classify::shapes::pm_callback_module(rest).is_some(),
        "task:" => (i == 0 || b[i - 1] == b' ') && rest.contains(" state:"),
        "RIP: " => crate::classify::shapes::frame_module(rest).is_some(),
        // `CPU: 5 PID: 9577 Comm: nvidia-smi ...`: the message starts at `CPU: `.
        " Comm: " => {
            if let Some(c) = line[..i].rfind("CPU: ") {
                if crate::classify::shapes::crash_task(&line[c..]).is_some() {
                    return Some(c);
                }
            }
            false
        }
        "Bad or missing usercopy" => rest.contains("'nvidia"),
        // Tegra's GPU driver tag and gdrcopy's module tag, each as a word of its own.
        "nvgpu: " | "gdrdrv:" => at_word_start(b, i),
        // A row of the nvidia-smi table: the message is the whole row.
        crate::classify::shapes::SMI_ERR_FIELD => {
            let t = line.trim_start();
            if crate::classify::shapes::is_smi_error_row(t) {
                return Some(line.len() - t.len());
            }
            false
        }
        // NVML's Python exception, from its module name when it is there.
        crate::classify::shapes::NVML_EXCEPTION => {
            if crate::classify::shapes::nvml_exception(rest).is_some() {
                // Back over the module path (`pynvml.nvml.`) to the qualified name's start.
                let path = line[..i]
                    .bytes()
                    .rev()
                    .take_while(|&b| crate::classify::shapes::is_module_path_byte(b))
                    .count();
                let start = if line[..i].ends_with('.') {
                    i - path
                } else {
                    i
                };
                if at_word_start(b, start) {
                    return Some(start);
                }
            }
            false
        }
        // An NVIDIA daemon's syslog tag (`nv-fabricmanager[29850]: `): from its name.
        "fabricmanager[" => {
            // By bytes: after a character of several bytes, `+ 1` of its start is inside it.
            let start = line.as_bytes()[..i]
                .iter()
                .rposition(|&c| !(c.is_ascii_lowercase() || c == b'-'))
                .map_or(0, |j| j + 1);
            if line[start..].starts_with("nv") && at_word_start(b, start) {
                return Some(start);
            }
            false
        }
        _ => true,
    };
    ok.then_some(i)
}

/// Where a module-loader line about NVIDIA's symbols starts when the module is not NVIDIA's own
/// (`nv_peer_mem: Unknown symbol nvidia_p2p_get_pages (err -22)`): at the module name.
fn symbol_start(line: &str) -> Option<usize> {
    const NEEDLES: &[&str] = &[
        ": disagrees about version of symbol nvidia",
        ": Unknown symbol nvidia",
        ": module using GPL-only symbols uses symbols nvidia",
        ": module using GPL-only symbols uses symbols from proprietary module nvidia",
    ];
    let i = NEEDLES
        .iter()
        .find_map(|n| crate::classify::find::find(line.as_bytes(), n.as_bytes()))?;
    let start = line[..i].rfind([' ', ']', '\t']).map_or(0, |j| j + 1);
    let name = &line[start..i];
    (!name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
    .then_some(start)
}

/// Where the X server NVIDIA driver's tag starts after an `(EE)` marker: right after it, or after
/// the `Mon DD HH:MM:SS` stamp older X servers put between the two.
fn x_driver_tag(marked: &str) -> Option<usize> {
    let after = marked.strip_prefix("(EE)")?;
    let mut at = 4 + after.len() - after.trim_start().len();
    let rest = &marked[at..];
    if !rest.starts_with("NVIDIA") {
        // `May 25 07:28:50 `: a month, a day and a time.
        let mut words = rest.split_whitespace();
        let (month, day, time) = (words.next()?, words.next()?, words.next()?);
        let stamp = month.len() == 3
            && month.bytes().all(|b| b.is_ascii_alphabetic())
            && day.len() <= 2
            && is_digits(day)
            && time.len() == 8
            && time.bytes().all(|b| b.is_ascii_digit() || b == b':');
        if !stamp {
            return None;
        }
        let t = rest.find(time)? + time.len();
        at += t + rest[t..].len() - rest[t..].trim_start().len();
    }
    crate::classify::shapes::xorg_tag_ok(&marked[at..]).then_some(at)
}

/// Where a call-trace frame in an NVIDIA module starts: the spaces, `[<address>]` and `? ` before
/// `symbol+0x1f/0x40 [nvidia_uvm]` belong to the message, the timestamp before them does not.
fn frame_start(line: &str) -> Option<usize> {
    crate::classify::shapes::frame_module(line)?;
    let Some(plus) = line.find("+0x") else {
        // A frame whose offsets the paste lost: from its symbol, the spaces before it.
        let open = line.rfind(" [")?;
        let mut start = line[..open].rfind([' ', '>', ']']).map_or(0, |i| i + 1);
        crate::classify::shapes::is_frame(&line[start..]).then_some(())?;
        while start > 0 && line.as_bytes()[start - 1] == b' ' {
            start -= 1;
        }
        return Some(start);
    };
    let mut start = line[..plus].rfind([' ', '>']).map_or(0, |i| i + 1);
    let head = &line[..start];
    let trimmed = head.trim_end();
    if trimmed.ends_with('?') {
        start = trimmed.len() - 1;
    }
    let t = line[..start].trim_end();
    if t.ends_with(">]") {
        if let Some(open) = t.rfind("[<") {
            start = open;
        }
    }
    while start > 0 && line.as_bytes()[start - 1] == b' ' {
        start -= 1;
    }
    crate::classify::shapes::is_frame(&line[start..]).then_some(start)
}

/// Whether `s` begins with a tag in the exact shape the kernel prints it.
fn tag_shape_ok(s: &str) -> bool {
    if s.starts_with("NVRM: ") || s == "NVRM:" {
        return true;
    }
    if crate::classify::shapes::retyped_nvrm(s).is_some() {
        return true;
    }
    if let Some(rest) = s.strip_prefix("NVRM ") {
        // Old drivers' Xid lines: `NVRM Xid (PCI:0000:0b:00) : 32, Channel ID 00000009 ...`.
        if rest.starts_with("Xid (") {
            return true;
        }
        // Older open-module builds: `NVRM funcName: text`.
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        return end > 0 && rest[end..].starts_with(": ");
    }
    if let Some(rest) = s.strip_prefix("pcieport ") {
        return device_then_colon(rest);
    }
    let Some(rest) = s.strip_prefix("nvidia") else {
        return false;
    };
    // `nvidia: ...`, `nvidia-nvswitch3: ...`, `nvidia-uvm: ...`, `nvidia_drm: ...`.
    let name_end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .unwrap_or(rest.len());
    let after = &rest[name_end..];
    if after.starts_with(": ") || after == ":" {
        return true;
    }
    // A distribution's wrapper renames the real binary (`nvidia-container-cli.real: ...`, which
    // a runtime then quotes in its hook's error).
    if name_end > 1 && after.starts_with(".real: ") {
        return true;
    }
    // systemd on an NVIDIA unit: `nvidia-persistenced.service: Failed with result 'exit-code'.`
    if name_end > 1 && after.starts_with(".service: ") {
        return true;
    }
    // The vGPU host module brackets its tag: `[nvidia-vgpu-vfio] <uuid>: text`.
    if &rest[..name_end] == "-vgpu-vfio" && after.starts_with("] ") {
        return true;
    }
    // `nvidia-peermem nv_get_p2p_free_callback:127 ERROR ...`: an NVIDIA module (by name, so
    // that a host name such as `nvidia-node-7` is not one), then `function:line `.
    const MODULES: &[&str] = &["peermem", "fs", "uvm", "drm", "modeset", "nvlink"];
    let module = rest[..name_end].trim_start_matches(['-', '_']);
    if name_end > 0 && MODULES.contains(&module) {
        if let Some(func) = after.strip_prefix(' ') {
            if let Some((f, rest)) = func.split_once(':') {
                let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
                if !f.is_empty()
                    && f.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                    && digits > 0
                    && rest[digits..].starts_with(' ')
                {
                    return true;
                }
            }
        }
    }
    // `nvidia 0000:17:00.0: ...` (the PCI driver core naming the device).
    name_end == 0 && after.strip_prefix(' ').is_some_and(device_then_colon)
}

fn device_then_colon(s: &str) -> bool {
    match s.find(": ") {
        Some(i) => crate::model::PciAddress::parse(&s[..i]).is_ok(),
        None => false,
    }
}

/// A kernel line's text after its prefix, for a line in which no message we know starts (a line
/// inside a crash report): after the journal's or syslog's `kernel: `, or after a leading
/// `[ 9512.238711]` stamp; else the line itself.
pub fn kernel_text(line: &str) -> (PrefixRef<'_>, &str) {
    let line = line.trim_end();
    let at = if let Some(i) = line.find(" kernel: ") {
        i + " kernel: ".len()
    } else {
        let t = line.trim_start();
        let lead = line.len() - t.len();
        match t.strip_prefix('[').and_then(|r| r.find(']')) {
            Some(close) if close < 24 => lead + 1 + close + 1,
            _ => 0,
        }
    };
    let (head, body) = line.split_at(at);
    (parse_prefix(head), body.trim_start())
}

fn parse_prefix(head: &str) -> PrefixRef<'_> {
    plain_stamp(head).unwrap_or_else(|| any_prefix(head))
}

/// Any prefix: its text, and an uptime stamp wherever it stands.
fn any_prefix(head: &str) -> PrefixRef<'_> {
    let text = head.trim().trim_end_matches(':').trim();
    let mut p = PrefixRef {
        text: (!text.is_empty())
            .then(|| std::borrow::Cow::Borrowed(crate::classify::trim::chars(text, 80))),
        ..PrefixRef::default()
    };
    // An uptime stamp `[ 9512.238711]` anywhere in the prefix (dmesg, syslog with the stamp kept).
    // A relative `[  +0.000844]` or a `dmesg -T` date is not an uptime and is left as text.
    let mut rest = head;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        let Some(close) = after.find(']') else { break };
        let inner = after[..close].trim();
        if let Some((s, us)) = inner.split_once('.') {
            if is_digits(s) && is_digits(us) && us.len() <= 9 {
                if let (Ok(s), Ok(frac)) = (s.parse::<u64>(), us.parse::<u64>()) {
                    let usec = frac * 10u64.pow(6u32.saturating_sub(us.len() as u32))
                        / 10u64.pow((us.len() as u32).saturating_sub(6));
                    p.ts_usec = s.checked_mul(1_000_000).and_then(|v| v.checked_add(usec));
                    break;
                }
            }
        }
        rest = &after[close + 1..];
    }
    p
}

/// The common prefix, a bare `[ 9512.238711]` stamp (dmesg, a saved kernel log), read byte by
/// byte: what [`parse_prefix`] makes of it, without its general search for a stamp. `None` for
/// anything else, which takes the general path.
fn plain_stamp(head: &str) -> Option<PrefixRef<'_>> {
    // Byte by byte: `trim`, `strip_prefix` and `split_once` each cost a call here, on every
    // candidate line. Only ASCII spaces are trimmed; a prefix with other white space takes the
    // general path, which trims it as before.
    let b = head.as_bytes();
    let start = b.iter().position(|c| !c.is_ascii_whitespace())?;
    let end = b.iter().rposition(|c| !c.is_ascii_whitespace())? + 1;
    let t = &b[start..end];
    // `[`, spaces, 1 to 12 digits of seconds, `.`, 6 digits, `]`. At most 12 digits of seconds:
    // the product below cannot overflow.
    if t.len() < 10 || t[0] != b'[' || t[t.len() - 1] != b']' || t[t.len() - 8] != b'.' {
        return None;
    }
    let inner = &t[1..t.len() - 1];
    let digits_from = inner.iter().position(|&c| c != b' ')?;
    let secs = &inner[digits_from..inner.len() - 7];
    let usecs = &inner[inner.len() - 6..];
    if secs.is_empty() || secs.len() > 12 {
        return None;
    }
    let mut ts = 0u64;
    for &c in secs.iter().chain(usecs) {
        if !c.is_ascii_digit() {
            return None;
        }
        ts = ts * 10 + u64::from(c - b'0');
    }
    Some(PrefixRef {
        ts_usec: Some(ts),
        seq: None,
        text: Some(std::borrow::Cow::Borrowed(&head[start..end])),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The driver tag after syslog's or the journal's `kernel: ` is found where the line starts
    /// as such a line does, and no record of the kernel's own (what the daemon reads, every one
    /// of them) is taken for one: their message start is the same either way.
    #[test]
    fn only_syslog_and_journal_lines_are_searched_for_the_kernels_tag() {
        for line in [
            "Jan  5 12:00:01 gpu-node-3 kernel: NVRM: Xid (PCI:0000:17:00): 79, GPU has fallen off the bus.",
            "2024-01-05T12:00:01+00:00 gpu-node-3 kernel: [ 12.5] nvidia-nvswitch0: SXid (PCI:0000:85:00.0): 20034, Fatal",
        ] {
            assert!(syslog_like(line.as_bytes()), "{line}");
            let at = message_start(line).expect("a message");
            assert!(line[at..].starts_with("NVRM") || line[at..].starts_with("nvidia"), "{line}");
        }
        for record in [
            "e1000e 0000:00:1f.6 eno1: NIC Link is Up 1000 Mbps Full Duplex",
            "NVRM: Xid (PCI:0000:17:00): 79, GPU has fallen off the bus.",
            "ACPI: Added _OSI(Module Device)",
            "EXT4-fs (nvme0n1p2): mounted filesystem",
            "audit: type=1400 audit(1700000000.123:45): apparmor=\"STATUS\"",
            "pcieport 0000:00:01.0: AER: Corrected error received",
        ] {
            assert!(!syslog_like(record.as_bytes()), "{record}");
        }
    }

    /// A saved `/dev/kmsg` dump line is read by the live source's record reader: the same
    /// sequence number, time and message (escapes and all), the continuation fields left out.
    #[test]
    fn a_kmsg_dump_line_reads_as_the_live_record_does() {
        let line = "4,1187,9512238711,-,caller=T812;NVRM: Xid (PCI:0000:17:00): 79, pid=0, GPU has fallen off the bus.\\x0aNVRM: GPU 0000:17:00.0: GPU has fallen off the bus.";
        let rec = crate::source::kmsg::record::parse_record(line.as_bytes()).expect("record");
        let split = split(line).expect("a dump line");
        assert_eq!(split.prefix.seq, Some(rec.seq));
        assert_eq!(split.prefix.ts_usec, Some(rec.ts_usec));
        assert_eq!(split.prefix.text.as_deref(), Some("[ 9512.238711]"));
        assert_eq!(split.messages.join("\n"), rec.message);
        assert_eq!(split.messages.len(), 2);
        // Not a record: a bad field, or no message we know.
        assert!(split_kmsg("4,x,9512238711,-;NVRM: Xid (PCI:0000:17:00): 79, pid=0").is_none());
        assert!(split_kmsg("6,1,2,-;EXT4-fs (nvme0n1p2): mounted filesystem").is_none());
    }

    /// The bare stamp's fast path reads exactly what the general path reads.
    #[test]
    fn plain_stamps_read_as_the_general_path_does() {
        let mut fast = 0;
        for head in [
            "[ 9512.238711] ",
            "[    0.000000] ",
            "[123456789012.999999] ",
            "[1234567890123.000001] ",
            "[ 12.5] ",
            "[  +0.000844] ",
            "[ 12.34567a] ",
            "[] ",
            "[ .123456] ",
            "[ 12.345678]: ",
            "kern  :warn  : [ 9512.238711] ",
            "  [ 9512.238711]",
            "[\t9512.238711] ",
        ] {
            if let Some(p) = plain_stamp(head) {
                fast += 1;
                let general = any_prefix(head);
                assert_eq!(
                    (p.ts_usec, p.seq, p.text),
                    (general.ts_usec, general.seq, general.text),
                    "{head:?}"
                );
            }
        }
        assert_eq!(fast, 4);
    }

    const MSG: &str =
        "NVRM: Xid (PCI:0000:17:00): 79, pid=2207, name=python3, GPU has fallen off the bus.";

    #[test]
    fn strips_every_common_prefix() {
        for (line, ts) in [
            (format!("[ 9512.238711] {MSG}"), Some(9_512_238_711)),
            (format!("[Sun Nov 29 08:14:03 2026] {MSG}"), None),
            (format!("2026-11-29T08:14:03,238711+00:00 {MSG}"), None),
            (
                format!("kern  :warn  : [ 9512.238711] {MSG}"),
                Some(9_512_238_711),
            ),
            (format!("[  +0.000844] {MSG}"), None),
            (
                format!("Nov 29 08:14:03 gpu-node-7 kernel: [ 9512.238711] {MSG}"),
                Some(9_512_238_711),
            ),
            (format!("Nov 29 08:14:03 gpu-node-7 kernel: {MSG}"), None),
            (
                format!("2026-11-29T08:14:03.238711+00:00 gpu-node-7 kernel: {MSG}"),
                None,
            ),
            (
                format!("nvidia-node-7 kern: warning: [2026-11-29T08:14:03Z]: {MSG}"),
                None,
            ),
            (format!("Nov 29 08:14:03 nvidia-dgx-01 kernel: {MSG}"), None),
            (MSG.to_string(), None),
        ] {
            let s = split(&line).unwrap_or_else(|| panic!("no message in {line:?}"));
            assert_eq!(s.messages, vec![MSG.to_string()], "{line}");
            assert_eq!(s.prefix.ts_usec, ts, "{line}");
        }
    }

    #[test]
    fn raw_kmsg_lines_are_unescaped() {
        let s = split(
            "4,1187,9512238711,-;NVRM: The NVIDIA GPU 0000:17:00.0\\x0aNVRM: fallen off the bus.",
        )
        .unwrap();
        assert_eq!(s.prefix.seq, Some(1187));
        assert_eq!(s.prefix.ts_usec, Some(9_512_238_711));
        assert_eq!(s.messages.len(), 2);
    }

    #[test]
    fn rsyslog_newlines_are_split() {
        let s = split("Nov 29 08:14:03 h kernel: NVRM: The NVIDIA GPU 0000:17:00.0#012NVRM: (PCI ID: 10de:2330) installed in this system has#012NVRM: fallen off the bus and is not responding to commands.").unwrap();
        assert_eq!(s.messages.len(), 3);
        assert!(s.messages[2].starts_with("NVRM: fallen off"));
    }

    /// The kernel's own `\x0a` escape, kept by tools that forward `/dev/kmsg` text as read, splits
    /// a message behind any prefix, as rsyslog's `#012` does, and the other escapes are undone.
    #[test]
    fn kmsg_escaped_newlines_are_split_behind_any_prefix() {
        // siderolabs/extensions#227: Talos's console, one record over five lines.
        let talos = "kern: warning: [2023-09-14T03:08:37.411164757Z]: NVRM: The NVIDIA GPU 0000:00:10.0 (PCI ID: 10de:1b38)\\x0aNVRM: installed in this system is not supported by the\\x0aNVRM: NVIDIA 535.54.03 driver release.\\x0aNVRM: Please see 'Appendix A - Supported NVIDIA GPU Products'\\x0aNVRM: in this release's README, available on the operating system\\x0aNVRM: specific graphics driver download page at www.nvidia.com.";
        let s = split(talos).expect("a message");
        assert_eq!(s.messages.len(), 6, "{:?}", s.messages);
        assert_eq!(
            s.messages[1],
            "NVRM: installed in this system is not supported by the"
        );
        for line in [
            "[ 9512.238711] NVRM: a\\x0aNVRM: b \\x5c c",
            "Nov 29 08:14:03 h kernel: NVRM: a\\x0aNVRM: b \\x5c c",
            "nvidia-node-7 kern: warning: [2026-11-29T08:14:03Z]: NVRM: a\\x0aNVRM: b \\x5c c\\x0a",
        ] {
            let s = split(line).expect("a message");
            assert_eq!(s.messages, ["NVRM: a", "NVRM: b \\ c"], "{line}");
        }
        // A lone `#` or backslash is text.
        for line in [
            "[ 1.0] NVRM: GPU #1 at \\\\server\\x4",
            "[ 1.0] NVRM: #01 and \\x0 end",
        ] {
            let s = split(line).expect("a message");
            assert_eq!(s.messages.len(), 1, "{line}");
            assert_eq!(s.messages[0], line["[ 1.0] ".len()..], "{line}");
        }
    }

    /// The tag right after a stamp is taken without searching the line only where the search
    /// from the line's start would take it too.
    #[test]
    fn a_tag_after_the_stamp_is_where_the_whole_line_search_finds_it() {
        for line in [
            "[ 9512.238711] NVRM: Xid (PCI:0000:17:00): 79, pid=0, GPU has fallen off the bus.",
            "[ 9512.238711] nvidia-modeset: ERROR: GPU:0: Idling display engine timed out",
            "[ 9512.238711] nvidia 0000:01:00.0: enabling device (0000 -> 0003)",
            "[ 9512.238711] nvidia_uvm: module uses symbols from proprietary module nvidia",
            "[ 9512.238711] NVRMx is no tag",
            "[ 9512.238711] nvidiafoo: not a tag either, NVRM: but this is",
            "[ 9512.238711]    NVRM: GPU 0000:17:00.0: RmInitAdapter failed! (0x22:0x56:884)",
            "[nvidia 9512.238711] NVRM: a stamp that holds a tag's letters",
            // A tag inside the brackets comes first in the line: the whole-line search finds
            // it, and the fast path must not answer with the one after the stamp.
            "[NVRM: x] NVRM: Xid (PCI:0000:17:00): 13, pid=1, Graphics Exception",
            "[nvidia-modeset: x] NVRM: Xid (PCI:0000:17:00): 13, pid=1, Graphics Exception",
            "[Nov 29 08:14:03 2026] NVRM: Xid (PCI:0000:17:00): 13, pid=1, Graphics Exception",
            "[ 12.5]NVRM: no space",
            "[ 12.5] nvidia",
            "<4>[ 12.5] NVRM: Xid (PCI:0000:17:00): 13, pid=1, Graphics Exception",
            "Nov 29 08:14:03 nvidia-dgx-01 kernel: NVRM: Xid (PCI:0000:17:00): 79, pid=0",
            "Nov 29 08:14:03 nvidia kernel: nvidia-modeset: ERROR: GPU:0: timed out",
        ] {
            assert_eq!(
                message_start(line),
                tag_start(line).or_else(|| other_start(line)),
                "{line}"
            );
        }
    }

    #[test]
    fn the_driver_tags_are_candidate_literals_but_the_ports() {
        // `message_start` asks the prefilter first: a tag before NON_LITERAL_TAGS that were no
        // literal would never start a message, in the daemon as in `scan`.
        let lits = crate::classify::prefilter::candidate_literals();
        for (i, f) in tag_finders().iter().enumerate() {
            let tag = std::str::from_utf8(f.needle()).unwrap();
            let literal = lits.iter().any(|l| tag.contains(l));
            assert_eq!(literal, i < NON_LITERAL_TAGS, "driver tag {tag:?}");
        }
        // An old kernel's AER recovery line names no `AER:`, only the port's tag.
        assert_eq!(
            message_start("pcieport 0000:00:02.0: device recovery failed"),
            Some(0)
        );
        assert_eq!(
            message_start("[ 1.0] pcieport 0000:00:02.0: device recovery failed"),
            Some(7)
        );
    }

    #[test]
    fn other_tags_and_non_messages() {
        assert_eq!(
            message_start("x nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 1, Fatal"),
            Some(2)
        );
        assert_eq!(message_start("[ 1.0] nvidia 0000:17:00.0: AER: x"), Some(7));
        assert_eq!(message_start("pcieport 0000:16:01.0: AER: x"), Some(0));
        assert_eq!(
            message_start("systemd[1]: Started nvidia-persistenced.service."),
            None
        );
        assert_eq!(
            message_start("nvidia-persistenced[812]: Started (812)"),
            None
        );
        assert_eq!(message_start("python3[22]: my Xid 79 test"), None);
        assert_eq!(message_start(""), None);
    }

    /// The wrappers pastes and log shippers put around the kernel's text: backticks, quotes,
    /// markdown quotes, priorities, `key=` and JSON. Names and paths that merely contain a tag
    /// stay out.
    #[test]
    fn tags_inside_quotes_and_wrappers() {
        const X: &str = "NVRM: Xid (PCI:0000:01:00): 79, pid=589, GPU has fallen off the bus.";
        for line in [
            format!("`{X}`"),
            format!("```[93297.027938] {X}"),
            format!("<4>{X}"),
            format!("> [6781741.548779] {X}"),
            format!("MESSAGE={X}"),
            format!("{{\"log\":\"{X}\",\"stream\":\"stdout\"}}"),
            format!("'{X}'"),
            format!("|{X}"),
        ] {
            let s = split(&line).unwrap_or_else(|| panic!("no message in {line:?}"));
            assert!(s.messages[0].starts_with(X), "{line}: {:?}", s.messages);
        }
        // A name that holds `nvidia` is no tag; the loader's words for NVML's library are a row
        // of the shape table, whose literal starts the message.
        let lib = "libnvidia-ml.so: cannot open shared object file";
        assert_eq!(tag_start(lib), None);
        assert_eq!(message_start(lib), Some(0));
        for line in [
            "ldconfig: /usr/lib/nvidia: No such file or directory",
            "x_NVRM: Xid (PCI:0000:01:00): 79",
            "foo-nvidia: error",
            "insmod nvidia.ko: Invalid module format",
        ] {
            assert_eq!(message_start(line), None, "{line}");
        }
    }

    /// The X server's NVIDIA driver: its error lines only, the message after `(EE) `.
    #[test]
    fn x_driver_error_lines() {
        let line = "15712:Nov  3 12:31:22 h /usr/libexec/gdm-x-session[1605]: (EE) NVIDIA(GPU-0): Failed to initialize the NVIDIA GPU at PCI:82:0:0.  Please";
        let s = split(line).unwrap();
        assert!(
            s.messages[0].starts_with("NVIDIA(GPU-0): Failed"),
            "{:?}",
            s.messages
        );
        let s = split("[   159.042] (EE) NVIDIA: Failed to initialize the NVIDIA kernel module.")
            .unwrap();
        assert!(s.messages[0].starts_with("NVIDIA: Failed"));
        assert_eq!(
            message_start("[   159.043] (II) NVIDIA(0): NVIDIA GPU at PCI:1:0:0"),
            None
        );
        assert_eq!(message_start("(EE) NVIDIAX: not the driver"), None);
        // Older X servers: a stamp after the marker, a space before the screen.
        for line in [
            "(EE) May 25 07:28:50 NVIDIA(0): Failed to initialize the NVIDIA kernel module. Please see the",
            "(EE) NVIDIA (0): Failed to initialize the NVIDIA kernel module! Please ensure",
            "(EE) Jun  5 07:28:50 NVIDIA(0): Failed to initialize the NVIDIA kernel module.",
            "[   494.427](EE) NVIDIA(0): Failed to initialize the NVIDIA graphics device PCI:1:0:0.",
        ] {
            let s = split(line).unwrap_or_else(|| panic!("{line}"));
            assert!(s.messages[0].starts_with("NVIDIA"), "{line}: {:?}", s.messages);
        }
        assert_eq!(message_start("(EE) Failed to load module \"mouse\""), None);
        assert_eq!(message_start("(EE) May 25 07:28:50 Screen(s) found"), None);
    }

    /// NVIDIA's user-space components report an API mismatch without a driver tag.
    #[test]
    fn user_space_api_mismatch() {
        let s = split("ali@ali-desktop:~$ Error: API mismatch: the NVIDIA kernel module has version 173.14.05,").unwrap();
        assert!(s.messages[0].starts_with("API mismatch: the NVIDIA kernel module"));
        assert_eq!(message_start("Error: API mismatch in libfoo"), None);
    }

    /// The Kubernetes device plugin's Xid event lines carry no driver tag.
    #[test]
    fn device_plugin_xid_events() {
        let line = "2024-08-09T13:32:51.873588972Z I0809 13:32:51.873541       1 health.go:185] XidCriticalError: Xid=94 on Device=GPU-3b6e; marking device as unhealthy.";
        let s = split(line).unwrap();
        assert!(s.messages[0].starts_with("XidCriticalError: Xid=94"));
    }

    #[test]
    fn fractional_stamps_of_any_width() {
        assert_eq!(parse_prefix("[   12.5]").ts_usec, Some(12_500_000));
        assert_eq!(parse_prefix("[12.123456789]").ts_usec, Some(12_123_456));
    }
}
