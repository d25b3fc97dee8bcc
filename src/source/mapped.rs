//! A saved log read through a memory map that survives the file shrinking under it.
//!
//! Why a map: `scan` reads bug-report archives of hundreds of MB, and the kernel's copy into a
//! read buffer was half of a scan's time on an ordinary log (bench/scan.sh). A map saves the
//! copy: the literal search streams the mapped pages from memory, and [`crate::source::file`]'s
//! newline count after it finds them in cache.
//!
//! Why the handler: a map of a file that someone truncates meanwhile raises SIGBUS at the first
//! touch of a page past the new end, which kills the process where a `read(2)` would just end
//! early. The handler installed here replaces the mapping from the faulting page to its end with
//! zero pages and sets a flag; the scanner checks the flag after each window, says in a note that
//! the file shrank, and stops. A SIGBUS at any other address, or one sent by `kill`, gets the
//! default action as before.
//!
//! One map at a time: the handler knows one range. A second scan while one is mapped (the test
//! harness runs tests in parallel) reads with `read(2)` instead.
//!
//! The bytes of a shared file map can change while they are read (another process writing the
//! file, or the handler's zero pages): the scanner only ever searches and copies them, and a
//! changed byte changes what is read, never where.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The mapped range `[START, END)`, 0 when none.
static START: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);
/// Set by the handler when a page past the file's end was touched.
static SHRUNK: AtomicBool = AtomicBool::new(false);
/// Whether a map is in use (see the module's note on one map at a time).
static BUSY: AtomicBool = AtomicBool::new(false);
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// A read-only map of a whole regular file.
pub struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mapped {
    /// Maps `len` bytes of `file` (its size when opened). Fails, and the caller reads instead,
    /// when another map is in use, when the handler cannot be installed, or when `mmap` fails.
    pub fn new(file: &File, len: usize) -> io::Result<Mapped> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty file"));
        }
        install_handler()?;
        if BUSY.swap(true, Ordering::AcqRel) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "another file is mapped",
            ));
        }
        // SAFETY: a fresh read-only shared mapping of an open descriptor; the kernel chooses the
        // address. Failure is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            BUSY.store(false, Ordering::Release);
            return Err(e);
        }
        SHRUNK.store(false, Ordering::SeqCst);
        END.store(ptr as usize + len, Ordering::SeqCst);
        START.store(ptr as usize, Ordering::SeqCst);
        Ok(Mapped { ptr, len })
    }

    /// The file's bytes as mapped.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes until `drop`; pages past a shrunk file's end
        // are replaced by zero pages (the handler), so every byte stays readable.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }

    /// Whether a page past the file's end was touched: the file shrank while it was read, and
    /// the bytes from that page on are zeros, not the file's.
    pub fn shrunk(&self) -> bool {
        SHRUNK.load(Ordering::SeqCst)
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        START.store(0, Ordering::SeqCst);
        END.store(0, Ordering::SeqCst);
        // SAFETY: unmaps exactly the range `new` mapped (and the handler's zero pages in it).
        unsafe {
            libc::munmap(self.ptr, self.len);
        }
        BUSY.store(false, Ordering::Release);
    }
}

/// Installs the SIGBUS handler once per process.
fn install_handler() -> io::Result<()> {
    static INSTALLED: std::sync::OnceLock<Result<(), i32>> = std::sync::OnceLock::new();
    let r = INSTALLED.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        // SAFETY: a zeroed sigaction with our handler and an empty mask is a valid argument;
        // the handler only makes async-signal-safe system calls and touches atomics.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
        }
        Ok(())
    });
    r.map_err(io::Error::from_raw_os_error)
}

/// `si_code` of a SIGBUS from touching a page past the end of a mapped file.
const BUS_ADRERR: i32 = 2;

extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    let (start, end) = (START.load(Ordering::SeqCst), END.load(Ordering::SeqCst));
    if code == BUS_ADRERR && start != 0 && (start..end).contains(&addr) {
        let at = addr & !(PAGE.load(Ordering::Relaxed) - 1);
        // SAFETY: replaces pages inside our own mapping (checked above) with private zero pages;
        // mmap is a plain system call, safe in a signal handler.
        let r = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                end - at,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if r != libc::MAP_FAILED {
            SHRUNK.store(true, Ordering::SeqCst);
            return;
        }
    }
    // Not ours: the default action, as if no handler were installed. A fault re-raises it when
    // the handler returns; a sent signal is raised again here.
    // SAFETY: signal and raise are async-signal-safe.
    unsafe {
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
        if code != BUS_ADRERR {
            libc::raise(libc::SIGBUS);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_file_that_shrinks_under_the_map_reads_as_zeros_and_says_so() {
        let _one = crate::source::file::MAP_TEST_LOCK.lock();
        let mut f = tempfile::NamedTempFile::new().expect("temp");
        f.write_all(&vec![b'x'; 1 << 20]).expect("write");
        let file = File::open(f.path()).expect("open");
        let m = Mapped::new(&file, 1 << 20).expect("map");
        assert_eq!(m.bytes()[0], b'x');
        assert!(!m.shrunk());
        f.as_file().set_len(4096).expect("truncate");
        // Past the new end: without the handler this read is a SIGBUS.
        // SAFETY: an index inside the mapped slice, read once.
        let tail = unsafe { std::ptr::read_volatile(&m.bytes()[(1 << 20) - 1]) };
        assert_eq!(tail, 0);
        assert!(m.shrunk());
        assert_eq!(
            m.bytes()[100],
            b'x',
            "the part still in the file is the file's"
        );
        drop(m);
        // The next map starts clean.
        let m = Mapped::new(&file, 4096).expect("map");
        assert!(!m.shrunk());
    }
}
