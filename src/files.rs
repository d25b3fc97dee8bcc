//! Reading the small files a person hands xidwatch (the config, secrets in `file:`), bounded
//! and only if they are regular files. Beside the modules that use it, not inside one of them,
//! so the config and the alert stage do not import each other for it.

use std::path::Path;

/// Largest config file read. A real one is a few KiB; anything near this is a mistake, and
/// reading it whole (`--config /dev/zero`) would only fill memory.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads a config file as text, if it is a regular file of at most [`MAX_CONFIG_BYTES`].
/// A device, FIFO or directory is refused before any read, so `--config /dev/zero` fails at
/// once; the caller adds the path.
pub fn read_config_file(path: &Path) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind, Read};
    use std::os::unix::fs::OpenOptionsExt;
    // Non-blocking, so opening a FIFO does not wait for a writer; reads of a regular file are
    // unaffected.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "not a regular file (a {}); give the path of a TOML file",
                file_kind(&meta)
            ),
        ));
    }
    let too_big = |n: u64| {
        Error::new(
            ErrorKind::InvalidData,
            format!("{n} bytes is more than a config may be ({MAX_CONFIG_BYTES} bytes)"),
        )
    };
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(too_big(meta.len()));
    }
    // Bounded even if the file grows between the check and the read.
    let mut text = String::new();
    f.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(too_big(text.len() as u64));
    }
    Ok(text)
}

/// What a non-regular file is, in words.
fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "directory"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else {
        "special file"
    }
}
