//! The shape table's own tests: the built-in rows are proved by their example lines, their
//! literals reach the prefilter and the message-start anchors, and a bad row is refused with the
//! key that is wrong.

use super::*;
use crate::classify::shape_id::{family, ALL, HUNG_TASK, TOOL_ERROR, XID};
use crate::classify::{prefilter, prefix, testing};

fn spec(id: &str, literal: &str, pattern: &str, examples: &[&str]) -> RowSpec {
    RowSpec {
        id: Some(id.into()),
        literal: literal.into(),
        pattern: pattern.into(),
        kind: Some("driver_error".into()),
        severity: Some("warning".into()),
        title: Some("t".into()),
        examples: examples.iter().map(|e| e.to_string()).collect(),
        ..RowSpec::default()
    }
}

/// A table of the one row `row` with the title `title`.
fn titled(title: &str, row: RowSpec) -> Table {
    Table::build(
        &[RowSpec {
            title: Some(title.into()),
            ..row
        }],
        "classify.shape",
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_builtin_table_parses_and_is_not_empty() {
    let t = Table::parse_builtin().unwrap_or_else(|e| panic!("{e}"));
    assert!(t.rows().len() >= 10, "{} rows", t.rows().len());
    assert_eq!(Table::builtin().rows().len(), t.rows().len());
}

/// Each row's examples, read as `scan` reads a saved log (prefilter, prefix split, classifier),
/// make exactly one loud finding with the row's kind, severity, category and shape id.
#[test]
fn every_example_makes_its_rows_finding() {
    for row in Table::builtin().rows() {
        for ex in &row.examples {
            let found = testing::read(&[ex], true);
            if row.silence {
                assert!(found.is_empty(), "{}: {ex}: {found:#?}", row.id);
                continue;
            }
            assert_eq!(found.len(), 1, "{}: {ex}: {found:#?}", row.id);
            let f = &found[0];
            assert_eq!(
                (f.kind, f.severity, f.category, f.shape),
                (row.kind, row.severity, row.category, Some(row.id)),
                "{}: {ex}",
                row.id
            );
            assert!(
                !f.title.contains("(not in the log)"),
                "{}: {}",
                row.id,
                f.title
            );
        }
    }
}

/// The prefilter's list is generated from the table: every row's literal is in it (or a literal
/// the row's literal holds), and every example holds both.
#[test]
fn every_rows_literal_reaches_the_prefilter() {
    let list = prefilter::candidate_literals();
    let pre = prefilter::Prefilter::new();
    for row in Table::builtin().rows() {
        let l = row.prefilter_literal();
        assert!(
            list.iter().any(|c| l.contains(c)),
            "{}: {l:?} not in {list:?}",
            row.id
        );
        for ex in &row.examples {
            assert!(
                ex.contains(l) && ex.contains(row.literal),
                "{}: {ex}",
                row.id
            );
            assert!(pre.is_candidate(ex.as_bytes()), "{}: {ex}", row.id);
        }
    }
    // Every literal a row may be found by is one the prefilter searches on its own.
    for f in super::FOUND_BY {
        assert!(
            prefilter::HAND_LITERALS.contains(f),
            "{f} is no hand literal"
        );
    }
    // The hand literals are all still there, each once.
    for h in prefilter::HAND_LITERALS {
        assert_eq!(list.iter().filter(|l| *l == h).count(), 1, "{h}");
    }
    // The measured search order names only literals that are candidates (a renamed row's
    // literal would be searched in another order, and slower).
    for l in prefilter::SEARCH_ORDER {
        assert!(
            list.contains(l),
            "SEARCH_ORDER names {l:?}, which is no candidate literal"
        );
    }
}

/// A row with `anchor = true` starts a message wherever its literal is in a saved line.
#[test]
fn anchor_rows_start_messages() {
    for row in Table::builtin().rows().iter().filter(|r| r.anchor) {
        for ex in &row.examples {
            let line = format!("Mar 16 12:35:19 host tool[77]: {ex}");
            let at = prefix::message_start(&line);
            // The message starts at the literal, whatever the tool wrote before it (`ERROR: `).
            let from = ex.find(row.literal).unwrap_or(0);
            assert_eq!(
                at.map(|a| &line[a..]),
                Some(&ex[from..]),
                "{}: {line}",
                row.id
            );
        }
    }
}

#[test]
fn slots_are_typed_and_read() {
    let t = titled(
        "{module} link down",
        spec(
            "site.link",
            "mlx5_core",
            r"{module} {pci}: Port \d+ link down, pid {pid}",
            &["mlx5_core 0000:3b:00.0: Port 1 link down, pid 4242"],
        ),
    );
    let m = t
        .read(
            "mlx5_core 0000:3b:00.0: Port 1 link down, pid 4242",
            Tag::None,
            None,
        )
        .expect("read");
    assert_eq!(m.title, "mlx5_core link down");
    assert_eq!(
        m.pci.map(|p| p.to_string()).as_deref(),
        Some("0000:3b:00.0")
    );
    assert_eq!(m.pid, Some(4242));
    assert_eq!(m.id, "site.link");
    // A line without the literal never runs the pattern, one with it but another wording does
    // not match.
    assert_eq!(t.read("Port 1 link down", Tag::None, None), None);
    assert_eq!(t.read("mlx5_core 0000:3b:00.0: up", Tag::None, None), None);
}

/// A `{word}` takes the whole run of text without spaces, however long, and a title carries its
/// first [`pattern::WORD_MAX`] characters (cut at a character, not a byte); numbers are ASCII.
#[test]
fn a_long_word_is_read_whole_and_cut_in_the_title() {
    let t = titled(
        "kernel {word} failed ({int})",
        spec(
            "site.build",
            "build for kernel",
            r"^build for kernel {word} failed: {int}$",
            &["build for kernel 6.8.0-45-generic failed: 2"],
        ),
    );
    let word = format!("6.8.0-{}", "é".repeat(300));
    let m = t
        .read(
            &format!("build for kernel {word} failed: 2"),
            Tag::None,
            None,
        )
        .expect("a word longer than the title takes is still read");
    let cut: String = word.chars().take(pattern::WORD_MAX).collect();
    assert_eq!(m.title, format!("kernel {cut} failed (2)"));
    let m = t
        .read(
            "build for kernel 6.8.0-45-generic failed: 2",
            Tag::None,
            None,
        )
        .expect("read");
    assert_eq!(m.title, "kernel 6.8.0-45-generic failed (2)");
    // A digit of another script is no number.
    assert_eq!(
        t.read("build for kernel 6.8 failed: \u{0663}", Tag::None, None),
        None
    );
}

/// A refused row names the key that is wrong.
#[test]
fn bad_rows_are_refused_with_their_key() {
    let ok = spec(
        "a.b",
        "mlx5_core",
        "mlx5_core {pci}: .*link down",
        &["mlx5_core 0000:3b:00.0: x link down"],
    );
    let cases: Vec<(RowSpec, &str, &str)> = vec![
        (
            RowSpec {
                pattern: "mlx5_core {addr}".into(),
                ..ok.clone()
            },
            "classify.shape[1].pattern",
            "unknown slot {addr}",
        ),
        (
            RowSpec {
                severity: Some("urgent".into()),
                ..ok.clone()
            },
            "classify.shape[1].severity",
            "unknown severity",
        ),
        (
            RowSpec {
                kind: Some("xid".into()),
                ..ok.clone()
            },
            "classify.shape[1].kind",
            "unknown kind",
        ),
        (
            RowSpec {
                examples: vec!["mlx5_core 0000:3b:00.0: link up".into()],
                ..ok.clone()
            },
            "classify.shape[1].examples[0]",
            "does not match",
        ),
        (
            RowSpec {
                examples: vec!["other 0000:3b:00.0: link down".into()],
                ..ok.clone()
            },
            "classify.shape[1].examples[0]",
            "does not hold the literal",
        ),
        (
            RowSpec {
                examples: vec![],
                ..ok.clone()
            },
            "classify.shape[1].examples",
            "at least one",
        ),
        (
            RowSpec {
                pattern: "mlx5_core (up|down)".into(),
                ..ok.clone()
            },
            "classify.shape[1].pattern",
            "(?:...)",
        ),
        (
            RowSpec {
                literal: "mlx".into(),
                ..ok.clone()
            },
            "classify.shape[1].literal",
            "4 to 128",
        ),
        (
            RowSpec {
                title: Some("{pid} down".into()),
                ..ok.clone()
            },
            "classify.shape[1].title",
            "not a slot of the pattern",
        ),
        (
            RowSpec {
                pattern: "mlx5_core (".into(),
                ..ok.clone()
            },
            "classify.shape[1].pattern",
            "not a valid pattern",
        ),
    ];
    let first = spec("a.first", "unrelated", "unrelated", &["unrelated"]);
    for (bad, key, words) in cases {
        let e = Table::build(&[first.clone(), bad.clone()], "classify.shape")
            .expect_err(&format!("{bad:?}"));
        assert_eq!(e.key, key, "{e}");
        assert!(e.message.contains(words), "{e}");
    }
    // The same id twice, and an example an earlier row reads.
    let e = Table::build(&[ok.clone(), ok.clone()], "classify.shape").expect_err("dup");
    assert_eq!(e.key, "classify.shape[1].id");
    let later = RowSpec {
        id: Some("a.c".into()),
        ..ok.clone()
    };
    let e = Table::build(&[ok.clone(), later], "classify.shape").expect_err("shadowed");
    assert_eq!(e.key, "classify.shape[1].examples[0]");
    assert!(e.message.contains("earlier row \"a.b\""), "{e}");
}

#[test]
fn site_rows_take_no_tag_or_anchor() {
    let ok = spec(
        "site.a",
        "mlx5_core",
        "mlx5_core",
        &["mlx5_core 0000:3b:00.0: x"],
    );
    assert!(Table::build_site(std::slice::from_ref(&ok), &[]).is_ok());
    let e = Table::build_site(
        &[RowSpec {
            tag: Some("NVRM".into()),
            ..ok.clone()
        }],
        &[],
    )
    .expect_err("tag");
    assert_eq!(e.key, "classify.shape[0].tag");
    let e = Table::build_site(
        &[],
        &[RowSpec {
            anchor: true,
            ..ok.clone()
        }],
    )
    .expect_err("anchor");
    assert_eq!(e.key, "classify.silence[0].anchor");
    let e = Table::build_site(
        &[RowSpec {
            found_by: Some("nvidia".into()),
            ..ok
        }],
        &[],
    )
    .expect_err("found_by");
    assert_eq!(e.key, "classify.shape[0].found_by");
}

/// A row found by a driver literal: the literal must be one the prefilter searches on its own,
/// every example must hold it, and the row's own literal then costs the prefilter nothing.
#[test]
fn a_row_found_by_a_driver_literal_is_checked_and_costs_no_search() {
    let row = RowSpec {
        anchor: true,
        found_by: Some("nvidia".into()),
        kind: Some("driver_error".into()),
        severity: Some("warning".into()),
        ..spec(
            "installer.x",
            "kernel module failed to build",
            "^kernel module failed to build",
            &["ERROR: The nvidia-uvm kernel module failed to build."],
        )
    };
    let t = Table::build(std::slice::from_ref(&row), "shape").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.prefilter_literals(), vec!["nvidia"]);
    assert_eq!(t.anchors(), vec!["kernel module failed to build"]);
    // An example without the literal that finds it is refused, naming the example.
    let e = Table::build(
        &[RowSpec {
            examples: vec!["ERROR: The uvm kernel module failed to build.".into()],
            ..row.clone()
        }],
        "shape",
    )
    .expect_err("example without nvidia");
    assert_eq!(e.key, "shape[0].examples[0]");
    assert!(e.message.contains("\"nvidia\""), "{e}");
    // Only a literal the prefilter searches on its own, and only on an anchored row.
    for bad in [
        RowSpec {
            found_by: Some("NVIDIA".into()),
            ..row.clone()
        },
        RowSpec {
            anchor: false,
            ..row.clone()
        },
    ] {
        let e = Table::build(&[bad], "shape").expect_err("bad found_by");
        assert_eq!(e.key, "shape[0].found_by");
    }
}

#[test]
fn silence_rows_need_no_finding_fields_and_take_none() {
    let s = RowSpec {
        id: None,
        literal: "NVRM".into(),
        pattern: "NVRM: .*nvCheckOkFailedNoLog".into(),
        examples: vec!["NVRM: nvCheckOkFailedNoLog: Check failed: Generic Error".into()],
        ..RowSpec::default()
    };
    let t = Table::build(std::slice::from_ref(&s), "classify.silence")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.rows()[0].id, "classify.silence[0]");
    assert!(t.rows()[0].silence);
    let e = Table::build(
        &[RowSpec {
            severity: Some("warning".into()),
            ..s
        }],
        "classify.silence",
    )
    .expect_err("severity on a silence");
    assert_eq!(e.key, "classify.silence[0].severity");
}

/// A site row wins over the built-in shapes, and a silence row quiets a line they would report.
#[test]
fn site_rows_come_first_in_the_classifier() {
    let line = "NVRM: GPU 0000:17:00.0: RmInitAdapter failed! (0x62:0xffff:1863)";
    let mut c = crate::classify::Classifier::new();
    let mut out = Vec::new();
    let at = crate::classify::LineOrigin::default();
    c.push(line, &at, &mut out);
    c.flush(&mut out);
    assert_eq!(out.len(), 1);
    let silence = Table::build(
        &[RowSpec {
            literal: "RmInitAdapter".into(),
            pattern: r"RmInitAdapter failed! \(0x62".into(),
            examples: vec![line.into()],
            ..RowSpec::default()
        }],
        "classify.silence",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut c = crate::classify::Classifier::new();
    c.set_site(std::sync::Arc::new(silence));
    let mut out = Vec::new();
    c.push(line, &at, &mut out);
    c.flush(&mut out);
    assert!(out.is_empty(), "{out:#?}");
}

#[test]
fn every_shape_has_its_own_id() {
    let table = Table::parse_builtin().expect("shapes.toml");
    let mut seen = std::collections::HashSet::new();
    for id in ALL.iter().copied().chain(table.rows().iter().map(|r| r.id)) {
        assert!(seen.insert(id), "two shapes share the id {id}");
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b".-_".contains(&b)),
            "{id}"
        );
    }
    assert_eq!(family("init.probe-error"), "init");
    assert_eq!(family(XID), "xid");
    assert!(Table::is_builtin_id(TOOL_ERROR) && Table::is_builtin_id("tool.smi-failed"));
    assert!(!Table::is_builtin_id("site.ib-link-flap"));
}

#[test]
fn a_site_row_may_not_take_a_builtin_id() {
    for id in [HUNG_TASK, "tool.smi-failed"] {
        let spec: crate::classify::table::RowSpec = toml::from_str(&format!(
            "id = \"{id}\"\nliteral = \"mlx5_core\"\npattern = \"mlx5_core {{text}}\"\nkind = \"driver_error\"\nseverity = \"warning\"\ncategory = \"driver\"\ntitle = \"link flap\"\nexamples = [\"mlx5_core 0000:3b:00.0: link down\"]\n"
        ))
        .expect("row");
        let err = Table::build_site(std::slice::from_ref(&spec), &[])
            .expect_err("a built-in id is refused");
        assert_eq!(err.key, "classify.shape[0].id");
        assert!(err.message.contains("built-in"), "{}", err.message);
    }
}

#[test]
fn a_rows_module_slot_is_the_findings_module() {
    let row = spec(
        "site.module-link",
        "link down",
        r"{module}: link down",
        &["mlx5_core: link down"],
    );
    let t = Table::build_site(&[row], &[]).expect("row");
    let mut c = crate::classify::Classifier::new();
    c.set_site(std::sync::Arc::new(t));
    let mut out = Vec::new();
    for l in ["nvidia_peermem: link down", "nv_peer_mem: link down"] {
        c.push(l, &crate::classify::LineOrigin::default(), &mut out);
    }
    c.flush(&mut out);
    let modules: Vec<_> = out.iter().map(|f| f.module.as_deref()).collect();
    assert_eq!(modules, [Some("nvidia_peermem"), Some("nv_peer_mem")]);
    assert!(out.iter().all(|f| f.shape == Some("site.module-link")));
}

/// Which patterns are known to match only where the message starts with their literal, and
/// which are not: escapes, classes, quantifiers on the literal's last character, alternations
/// outside a group, flags, and a pattern that does not start where the message does.
#[test]
fn a_pattern_that_starts_with_its_literal_is_told_apart() {
    for (pattern, literal) in [
        (
            r"^nvidia-modeset: (?:ERROR|WARNING): (.*)",
            "nvidia-modeset: ",
        ),
        (r"^nvc\.c:(\d+)", "nvc.c:"),
        (r"^nvidia-vgpu-mgr\[(\d{1,7})\]: error", "nvidia-vgpu-mgr["),
        (
            r"^Unable to load the '([A-Za-z0-9_-]{1,64})' kernel module",
            "Unable to load the '",
        ),
        (
            r"^rm_init_adapter\((-?\d{1,10})\) failed",
            "rm_init_adapter",
        ),
    ] {
        assert!(starts_with_literal(pattern, literal), "{pattern}");
    }
    for (pattern, literal) in [
        (
            r"load library failed: libnvidia-ml",
            "load library failed: libnvidia-ml",
        ),
        (r"^abc|xyz", "abc"),
        (r"^abc?", "abc"),
        (r"^ab*", "ab"),
        (r"^ab{2}", "ab"),
        (r"^a\dc", "a1c"),
        (r"^(?i)abc", "abc"),
        (r"^a.c", "a.c"),
        (r"^abc(", "abc"),
        (r"^ab", "abc"),
        (r"^[ab]c", "ac"),
        (r"^abc", ""),
    ] {
        assert!(!starts_with_literal(pattern, literal), "{pattern}");
    }
    // An alternation inside a group or a class is not one of the whole pattern.
    assert!(starts_with_literal(r"^abc(?:x|y)[|]", "abc"));
}

/// The rows a message is read by are the same whether a literal that starts its rows' patterns
/// is compared at the message's start or searched for through it: on every line of the corpus
/// and the unseen rounds, after any driver tag, for both kinds of row.
#[test]
fn reading_by_leading_literals_finds_the_rows_a_full_search_finds() {
    let t = Table::builtin();
    let finder = t.finder.as_ref().expect("a finder");
    let by_search = |text: &str, tag: Tag| {
        let mut cand: Vec<usize> = Vec::new();
        for m in finder.find_overlapping_iter(text) {
            for &i in &t.by_literal[m.pattern().as_usize()] {
                if !cand.contains(&i) {
                    cand.push(i);
                }
            }
        }
        cand.sort_unstable();
        cand.into_iter()
            .filter(|&i| t.rows[i].tag == tag)
            .find(|&i| t.rows[i].re().is_some_and(|r| r.is_match(text)))
    };
    let mut texts: Vec<String> = Vec::new();
    for line in testing::fixture_lines() {
        texts.push(line.trim().to_string());
        if let Some((_, msgs)) = prefix::split_ref_with(&line, None) {
            for m in msgs.iter() {
                texts.push(m.trim().to_string());
                if let Some(body) = m.strip_prefix("NVRM: ") {
                    texts.push(split_gpu_prefix(body).1.to_string());
                }
            }
        }
    }
    for r in t.rows() {
        texts.extend(r.examples.iter().cloned());
    }
    assert!(texts.len() > 5000, "the fixtures were read");
    let mut found = 0;
    for text in &texts {
        for tag in [Tag::None, Tag::Nvrm] {
            let mine = t.find(text, tag).map(|(i, _)| i);
            assert_eq!(mine, by_search(text, tag), "{tag:?} {text}");
            found += usize::from(mine.is_some());
        }
    }
    assert!(found > 100, "rows were found ({found})");
    // Most literals are compared at the start: the search is left to the few others.
    assert!(t.anywhere_literal.len() * 3 < t.by_literal.len());
}

/// Every built-in pattern compiles, as `xidwatch check` asks in the shipped binary (CI runs it on
/// the release build, whose regex features a test build does not share).
#[test]
fn every_builtin_pattern_compiles() {
    assert_eq!(Table::builtin().uncompiled(), Vec::new());
}

/// Every built-in row compiles to a small automaton: a process pays for a row's build the first
/// time a line reaches it, and one row written with a counted repetition of a Unicode class
/// (`\S{1,128}`, `[^\]]{0,256}`) was 250 KB of automaton and a millisecond or more to build,
/// more than a small log costs to read. Measured with the regex engine's own size limit, the
/// same bound that refuses a site row's pattern, so the figure is the engine's, not a timing.
#[test]
fn every_builtin_row_compiles_small() {
    const ROW: usize = 32 << 10;
    const TABLE: usize = 512 << 10;
    let size = |re: &str| {
        let (mut lo, mut hi) = (1usize, 1usize << 21);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if regex::RegexBuilder::new(re).size_limit(mid).build().is_ok() {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    };
    let mut total = 0;
    for row in Table::builtin().rows() {
        let n = size(&row.source);
        assert!(
            n <= ROW,
            "{}: {n} bytes of automaton for {}",
            row.id,
            row.source
        );
        total += n;
    }
    assert!(total <= TABLE, "the built-in rows compile to {total} bytes");
    // The guard itself: the old `{word}` slot is over the row bound.
    assert!(size(r"^x (\S{1,128})") > ROW);
}
