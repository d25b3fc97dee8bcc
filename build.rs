//! Embeds every `runbooks/*.toml` into the binary, so `xidwatch install` can put the shipped
//! runbooks in place without the source tree. Writes `$OUT_DIR/runbooks.rs`: a sorted
//! `&[(file name, contents)]`.

use std::{env, fs, path::Path};

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("runbooks");
    // A directory here makes cargo rerun this script when any file in it changes or appears.
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<_> = fs::read_dir(&dir)
        .map(|rd| rd.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "toml") && p.is_file());
    files.sort();
    let mut out = String::from("pub const RUNBOOKS: &[(&str, &str)] = &[\n");
    for path in &files {
        let name = path
            .file_name()
            .unwrap()
            .to_str()
            .expect("runbook file names are UTF-8");
        out += &format!(
            "    ({name:?}, include_str!({:?})),\n",
            path.display().to_string()
        );
    }
    out += "];\n";
    fs::write(
        Path::new(&env::var("OUT_DIR").unwrap()).join("runbooks.rs"),
        out,
    )
    .unwrap();
}
