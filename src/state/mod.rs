//! Durable state in the state directory: the kernel log position and the open incidents.
//!
//! Every write is atomic (temporary file, fsync, rename, fsync of the directory), so a crash at
//! any instant leaves either the old or the new content, never a torn file.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// Where reading the kernel log stopped: the boot and the last sequence number handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    #[serde(with = "boot_hex")]
    pub boot_id: [u8; 16],
    pub last_seq: u64,
}

mod boot_hex {
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(b: &[u8; 16], s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&super::hex(b))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 16], D::Error> {
        let s = String::deserialize(d)?;
        super::parse_boot_id(&s).ok_or_else(|| serde::de::Error::custom("bad boot_id"))
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Parses a boot id as `/proc/sys/kernel/random/boot_id` prints it (a UUID) or as 32 hex digits.
pub fn parse_boot_id(s: &str) -> Option<[u8; 16]> {
    let digits: Vec<u8> = s.trim().bytes().filter(|b| *b != b'-').collect();
    if digits.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in digits.chunks(2).enumerate() {
        let t = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(t, 16).ok()?;
    }
    Some(out)
}

/// The current boot's id. `boot_id_path` is a seam for tests.
pub fn current_boot_id(boot_id_path: &Path) -> anyhow::Result<[u8; 16]> {
    let s = fs::read_to_string(boot_id_path)
        .with_context(|| format!("reading {}", boot_id_path.display()))?;
    parse_boot_id(&s).with_context(|| format!("{}: not a boot id: {s:?}", boot_id_path.display()))
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    dir: PathBuf,
}

/// Largest state file we read back; anything bigger is not ours.
const MAX_STATE_FILE: u64 = 64 << 20;

impl StateDir {
    /// Opens (creating, mode 0700) the state directory.
    pub fn open(dir: &Path) -> anyhow::Result<StateDir> {
        fs::create_dir_all(dir)
            .with_context(|| format!("creating state directory {}", dir.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
        }
        Ok(StateDir {
            dir: dir.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn load_position(&self) -> anyhow::Result<Option<Position>> {
        self.load_json("position.json")
    }

    pub fn save_position(&self, p: &Position) -> anyhow::Result<()> {
        self.save_json("position.json", p)
    }

    /// Reads a JSON state file; a missing file is `None`, a corrupt one an error naming it.
    pub fn load_json<T: for<'de> Deserialize<'de>>(&self, name: &str) -> anyhow::Result<Option<T>> {
        let path = self.dir.join(name);
        let f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len > MAX_STATE_FILE {
            anyhow::bail!(
                "{}: {len} bytes is too large for a state file",
                path.display()
            );
        }
        let v = serde_json::from_reader(std::io::BufReader::new(f))
            .with_context(|| format!("{}: corrupt state file", path.display()))?;
        Ok(Some(v))
    }

    /// Writes a JSON state file atomically.
    pub fn save_json<T: Serialize>(&self, name: &str, value: &T) -> anyhow::Result<()> {
        let bytes = serde_json::to_vec(value).context("serialising state")?;
        write_atomic(&self.dir.join(name), &bytes)
    }
}

/// Temporary file, fsync, rename, fsync the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = path.with_extension("tmp");
    {
        let mut f = File::create(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
        f.write_all(bytes)
            .with_context(|| format!("writing {}", tmp.display()))?;
        f.sync_all()
            .with_context(|| format!("syncing {}", tmp.display()))?;
    }
    fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_round_trips_and_corruption_is_named() {
        let t = tempfile::tempdir().unwrap();
        let s = StateDir::open(t.path()).unwrap();
        assert_eq!(s.load_position().unwrap(), None);
        let p = Position {
            boot_id: parse_boot_id("5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f").unwrap(),
            last_seq: 42,
        };
        s.save_position(&p).unwrap();
        assert_eq!(s.load_position().unwrap(), Some(p));
        fs::write(t.path().join("position.json"), b"{torn").unwrap();
        let e = format!("{:#}", s.load_position().unwrap_err());
        assert!(e.contains("position.json") && e.contains("corrupt"), "{e}");
    }
}
