//! What keeps the daemon's secrets from other programs running as the same user (the service
//! user, under systemd): the process is made non-dumpable before anything else, so they can
//! neither read its memory nor `/proc/<pid>/environ` nor get a core dump of it; and `env:`
//! secrets are taken out of the environment once read, so that not even a privileged reader of
//! `/proc/<pid>/environ` finds them there.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Whether `env:` secrets leave the environment when read: set by [`protect_process`], that is
/// in the `xidwatch` binary only. A program using the library (the tests) keeps its environment:
/// it may name `env:PATH` and still need `PATH`.
static TAKE_FROM_ENV: AtomicBool = AtomicBool::new(false);

/// What `main` does first, for every subcommand, before any secret is read: makes the process
/// non-dumpable ([`set_non_dumpable`]) and has `env:` secrets taken out of the environment when
/// read ([`env_secret`]).
pub fn protect_process() -> std::io::Result<()> {
    TAKE_FROM_ENV.store(true, Ordering::SeqCst);
    set_non_dumpable()
}

/// Makes this process non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`): `/proc/<pid>/*` then belongs
/// to root, processes of the same user cannot ptrace it or read its `environ`, `mem` or `maps`,
/// and a crash leaves no core with the webhook URL in it. Runbook steps set it again for
/// themselves (`runbook::sandbox`); an `exec` makes a program dumpable again, which is the
/// kernel's rule.
pub fn set_non_dumpable() -> std::io::Result<()> {
    // SAFETY: prctl(PR_SET_DUMPABLE) takes plain integers and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `env:` secrets already taken out of the environment, by variable name: a reload (SIGHUP
/// reads the config again) and every later resolve find the value here.
static TAKEN: Mutex<BTreeMap<String, String>> = Mutex::new(BTreeMap::new());

/// The value of the environment variable `name`, taken out of the environment the first time
/// (when it is set and not empty, and [`protect_process`] ran) and kept in this process only.
/// `None` when it is not set (or not UTF-8, or `name` cannot be a variable's name).
///
/// `/proc/<pid>/environ` shows the environment block the process started with, not what
/// `remove_var` leaves, so the value's bytes are first overwritten in place (every entry of
/// that name), then the variable is removed.
///
/// Thread safety: this runs when the config is loaded (at start, and on a reload); the lock
/// held here serialises it with itself, and `remove_var` takes std's environment lock. The
/// overwrite is done without that lock: a concurrent `getenv` of another name stops comparing
/// at the `=` (the name's bytes are not touched), and xidwatch calls no `set_var` that could
/// move the table while it is walked. A concurrent spawn that copies the environment may copy
/// the value half-zeroed, which only hides more of it (runbook steps get a cleared environment
/// anyway).
pub(crate) fn env_secret(name: &str) -> Option<String> {
    if name.is_empty() || name.contains(['=', '\0']) {
        return None;
    }
    let mut taken = TAKEN.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(v) = taken.get(name) {
        return Some(v.clone());
    }
    let value = std::env::var(name).ok()?;
    if value.is_empty() || !TAKE_FROM_ENV.load(Ordering::SeqCst) {
        return Some(value);
    }
    wipe(name);
    std::env::remove_var(name);
    taken.insert(name.to_string(), value.clone());
    Some(value)
}

extern "C" {
    /// The C library's environment table (POSIX `environ`).
    static mut environ: *mut *mut libc::c_char;
}

/// Overwrites with zeros the value of every `name=value` entry of the environment table, in
/// the memory the entries point to (for the variables the process started with, the block
/// `/proc/<pid>/environ` shows).
fn wipe(name: &str) {
    let name = name.as_bytes();
    // SAFETY: `environ` is a NULL-terminated array of pointers to NUL-terminated strings, owned
    // by the C library; nothing else changes it meanwhile (see `env_secret`). Only bytes after
    // the entry's `=` and before its NUL are written, so every string keeps its length and end.
    unsafe {
        let mut p = std::ptr::addr_of!(environ).read();
        if p.is_null() {
            return;
        }
        while !(*p).is_null() {
            let entry = *p;
            let len = libc::strlen(entry);
            let bytes = std::slice::from_raw_parts(entry as *const u8, len);
            if len > name.len() && bytes.starts_with(name) && bytes[name.len()] == b'=' {
                let value = entry.add(name.len() + 1);
                std::ptr::write_bytes(value, 0, len - name.len() - 1);
            }
            p = p.add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Taking a variable out of the environment is the binary's (`protect_process`), tested on
    // the daemon (tests/it/secrets.rs): the test binaries keep their environments.
    #[test]
    fn names_that_cannot_be_variables_resolve_to_nothing() {
        assert_eq!(env_secret("XIDWATCH_TEST_GUARD_UNSET"), None);
        assert_eq!(env_secret("A=B"), None);
        assert_eq!(env_secret("A\0B"), None);
        assert_eq!(env_secret(""), None);
    }
}
