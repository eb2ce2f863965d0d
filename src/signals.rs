//! What happens when a run is cut short by a signal. SIGINT, SIGTERM and SIGHUP remove the staging
//! directory and the output lock, then exit with 130; they wait for a section marked
//! [`uninterrupted`] (the swap of an old output for a new one, the rename that puts the output in
//! place) to finish first. Their line says what was removed: "partial output removed" only when a
//! staging directory or temporary file was there to remove, "nothing was written" otherwise. Once
//! the output is in place ([`output_in_place`]) the run has succeeded: such a signal no longer ends
//! it, and it finishes its report and exits as it would have (a note on stderr says the signal
//! came too late); so does a run that is printing its final report or failure ([`reporting`]), so
//! that stdout carries that one document. SIGBUS, which a
//! memory-mapped input raises when its file shrinks under the reader, removes them too, names the
//! input file that changed and exits with 1; SIGABRT (an allocation that failed) removes them and
//! aborts. SIGXFSZ is ignored, so a file-size limit (`ulimit -f`) fails the write that reaches it
//! with an error naming the file instead of killing the run. None ends in a half-written output
//! left behind.
//!
//! Under `--json` Ctrl-C (SIGTERM, SIGHUP) and SIGBUS also print the failure document on stdout
//! (`interrupted`, exit 130; `input_changed`, exit 1); SIGBUS's is made when the file is mapped,
//! since its handler may not allocate. SIGABRT prints none. A signal after the output is in place
//! prints no document: stdout carries the report alone.
//!
//! Paths to remove and mapped input ranges are registered here before they exist; the SIGBUS
//! handler only makes system calls (no allocation), so it cannot deadlock on a lock a worker
//! thread held when it faulted.

use crate::failure::ErrorCode;
use std::ffi::CString;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The exit code of a run ended by SIGINT, SIGTERM or SIGHUP (128 + SIGINT, as shells report it).
pub const INTERRUPTED_EXIT: u8 = 130;

/// Staging directories, temporary files and lock files of this process, removed on a fatal
/// signal; each with whether it is output (a lock is not: removing it is no news).
static LIVE: Mutex<Vec<(CString, bool)>> = Mutex::new(Vec::new());
/// Memory-mapped input files: (start address, length, path, the `--json` failure document for a
/// SIGBUS inside it).
static MAPPED: Mutex<Vec<Mapping>> = Mutex::new(Vec::new());

type Mapping = (usize, usize, CString, Option<CString>);

/// What SIGBUS says (after the file's path) when it names the file.
const CHANGED: &str = ": changed during conversion (truncated while being read); no output was written";
/// What SIGBUS says when the address is in no registered file.
const BUS_ERROR: &str = "bus error reading an input file (did it change during the run?); no output was written";
/// The `--json` failure document of a SIGBUS in no registered file, as
/// `failure::error_document` writes it (a test holds them equal).
const BUS_ERROR_DOCUMENT: &str = "{\n  \"schema_version\": 1,\n  \"error\": {\n    \"code\": \"input_changed\",\n    \
\"message\": \"bus error reading an input file (did it change during the run?); no output was written\",\n    \
\"exit_status\": 1\n  }\n}\n";
/// What Ctrl-C, SIGTERM and SIGHUP say when they removed partial output.
pub const INTERRUPTED_LINE: &str = "interrupted; partial output removed";
/// What they say when there was no output to remove yet (a lock file is not output).
pub const INTERRUPTED_EARLY_LINE: &str = "interrupted; nothing was written";
/// What they say once the output is in place: the run goes on to its end.
const TOO_LATE_LINE: &str = "interrupted after the output was complete and in place; finishing the run";
/// What they say while a run that wrote nothing prints its report or failure.
const REPORTING_LINE: &str = "interrupted while the run's report was printed; finishing it";
/// Held while a section must not be cut in half by Ctrl-C, SIGTERM or SIGHUP.
static UNINTERRUPTED: Mutex<()> = Mutex::new(());
/// Set as soon as Ctrl-C, SIGTERM or SIGHUP arrives.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// Set once the output is in place: from then on the run has succeeded.
static IN_PLACE: AtomicBool = AtomicBool::new(false);
/// Set once the run prints its final report or failure: its outcome is decided, nothing of it is
/// left to remove, and stdout must carry that one document.
static REPORTING: AtomicBool = AtomicBool::new(false);

/// Runs `f` with Ctrl-C, SIGTERM and SIGHUP held off: one arriving meanwhile takes effect once
/// `f` is done (`f` may ask [`interrupted`] and undo its work first).
pub fn uninterrupted<T>(f: impl FnOnce() -> T) -> T {
    let _held = UNINTERRUPTED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    f()
}

/// Whether Ctrl-C, SIGTERM or SIGHUP has arrived (the run ends as soon as nothing holds it off).
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Records that the output is complete and in place (called inside an [`uninterrupted`] section,
/// with the rename that put it there): a later Ctrl-C, SIGTERM or SIGHUP no longer ends the run,
/// which finishes its report and exits as it would have.
pub fn output_in_place() {
    IN_PLACE.store(true, Ordering::SeqCst);
}

/// Records that the run is printing its final report (or failure document): a later Ctrl-C,
/// SIGTERM or SIGHUP lets it finish, so that stdout carries that one document.
pub fn reporting() {
    REPORTING.store(true, Ordering::SeqCst);
}

/// Runs `put` (the rename that puts a finished output in place) with Ctrl-C, SIGTERM and SIGHUP
/// held off, and records the output in place when it succeeds. A signal that arrived before it
/// wins: `put` is not run and the signal's handler ends the run, removing the output not yet in
/// place.
pub fn put_in_place<T, E>(put: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    let put = uninterrupted(|| {
        if interrupted() {
            return None;
        }
        let result = put();
        if result.is_ok() {
            output_in_place();
        }
        Some(result)
    });
    let result = put.unwrap_or_else(|| await_interruption());
    if result.is_ok() {
        pause_point("in_place");
    }
    result
}

/// Waits for the handler of a signal that has arrived ([`interrupted`]) to end the run: once
/// work has been undone for it, nothing else may race it to the exit.
pub fn await_interruption() -> ! {
    loop {
        std::thread::park();
    }
}

/// In test builds, stops for three seconds at `point` when `ESCHA_CONVERT_PAUSE` names it, so a
/// test can deliver a signal exactly there. Release builds have no such stop.
pub fn pause_point(point: &str) {
    if cfg!(debug_assertions) && std::env::var_os("ESCHA_CONVERT_PAUSE").is_some_and(|p| p == point) {
        eprintln!("escha-convert: paused at {point}");
        std::thread::sleep(std::time::Duration::from_secs(3));
    }
}

fn c_path(path: &Path) -> Option<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes()).ok()
}

/// Registers `path` (a staging directory or a temporary file: output not yet in place) for removal
/// on a fatal signal.
pub fn remove_on_signal(path: &Path) {
    register(path, true);
}

/// Registers a lock file, or an old output moved aside, for removal on a fatal signal: removing
/// it is no news.
pub fn remove_leftover_on_signal(path: &Path) {
    register(path, false);
}

fn register(path: &Path, output: bool) {
    if let Some(p) = c_path(path) {
        LIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((p, output));
    }
}

/// Forgets `path` (committed, or removed by its owner).
pub fn forget(path: &Path) {
    if let Some(p) = c_path(path) {
        LIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|(q, _)| *q != p);
    }
}

/// Registers a mapped input file, so that a SIGBUS inside it names it.
pub fn register_mapping(start: *const u8, len: usize, path: &Path) {
    if let Some(p) = c_path(path) {
        let doc = crate::failure::json().then(|| {
            let message = format!("{}{CHANGED}", path.display());
            CString::new(crate::failure::error_document(ErrorCode::InputChanged, &message, 1)).ok()
        });
        MAPPED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((start as usize, len, p, doc.flatten()));
    }
}

/// Forgets a mapping that is about to be unmapped.
pub fn unregister_mapping(start: *const u8) {
    MAPPED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|m| m.0 != start as usize);
}

/// Installs the handlers (once per process; later calls do nothing).
pub fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = ctrlc::set_handler(|| {
            // Runs on its own thread, not in a signal handler: it may wait for the locks.
            INTERRUPTED.store(true, Ordering::SeqCst);
            let _held = UNINTERRUPTED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if IN_PLACE.load(Ordering::SeqCst) {
                // The run has succeeded; its report (on stdout, perhaps to a slow reader) finishes.
                eprintln!("escha-convert: note: {TOO_LATE_LINE}");
                return;
            }
            if REPORTING.load(Ordering::SeqCst) {
                eprintln!("escha-convert: note: {REPORTING_LINE}");
                return;
            }
            let live = LIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut removed_output = false;
            for (p, output) in live.iter() {
                // SAFETY: `p` is a valid C string.
                let removed = unsafe { remove_tree(p.as_ptr(), 0) };
                removed_output |= removed && *output;
            }
            let line = if removed_output { INTERRUPTED_LINE } else { INTERRUPTED_EARLY_LINE };
            eprintln!("escha-convert: {line}");
            if crate::failure::json() {
                use std::io::Write;
                let doc = crate::failure::error_document(ErrorCode::Interrupted, line, INTERRUPTED_EXIT);
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(doc.as_bytes()).and_then(|()| out.flush());
            }
            std::process::exit(INTERRUPTED_EXIT.into());
        });
        install_handler(libc::SIGBUS, on_sigbus as *const () as usize);
        install_handler(libc::SIGABRT, on_sigabrt as *const () as usize);
        // SAFETY: ignoring a signal is a plain system call.
        unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    });
}

/// Installs `handler` (of the `SA_SIGINFO` signature) for `signal`.
fn install_handler(signal: libc::c_int, handler: usize) {
    // SAFETY: a plain sigaction call with a handler of the SA_SIGINFO signature.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESETHAND;
        libc::sigemptyset(&raw mut action.sa_mask);
        libc::sigaction(signal, &raw const action, std::ptr::null_mut());
    }
}

/// Writes raw bytes to stderr (async-signal-safe).
fn say(bytes: &[u8]) {
    // SAFETY: write(2) on fd 2 with a valid buffer.
    let _ = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
}

/// Writes raw bytes to stdout (async-signal-safe).
fn say_out(bytes: &[u8]) {
    // SAFETY: write(2) on fd 1 with a valid buffer.
    let _ = unsafe { libc::write(1, bytes.as_ptr().cast(), bytes.len()) };
}

extern "C" fn on_sigbus(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t for SA_SIGINFO handlers.
    let addr = unsafe { fault_address(info) };
    say(b"escha-convert: error: ");
    let named = MAPPED.try_lock().ok().and_then(|mapped| {
        let (_, _, path, doc) = mapped.iter().find(|(start, len, _, _)| addr >= *start && addr < start + len)?;
        say(path.as_bytes());
        say(CHANGED.as_bytes());
        say(b"\n");
        if let Some(doc) = doc {
            say_out(doc.as_bytes());
        }
        Some(())
    });
    if named.is_none() {
        say(BUS_ERROR.as_bytes());
        say(b"\n");
        if crate::failure::json() {
            say_out(BUS_ERROR_DOCUMENT.as_bytes());
        }
    }
    remove_registered();
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(1) };
}

extern "C" fn on_sigabrt(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    if IN_PLACE.load(Ordering::SeqCst) {
        say(b"escha-convert: aborted (out of memory?) after the output was complete and in place\n");
    } else {
        say(b"escha-convert: aborted (out of memory?); partial output removed\n");
    }
    remove_registered();
    // The handler was reset when it ran: abort again with the default action.
    // SAFETY: raise is async-signal-safe.
    unsafe { libc::raise(libc::SIGABRT) };
}

#[cfg(target_os = "linux")]
unsafe fn fault_address(info: *mut libc::siginfo_t) -> usize {
    // SAFETY: the caller passes the kernel's siginfo_t.
    unsafe { (*info).si_addr() as usize }
}

#[cfg(not(target_os = "linux"))]
unsafe fn fault_address(info: *mut libc::siginfo_t) -> usize {
    // SAFETY: the caller passes the kernel's siginfo_t.
    unsafe { (*info).si_addr as usize }
}

/// Removes every registered path. Called from signal handlers: system calls only.
fn remove_registered() {
    // A poisoned or contended lock still holds valid paths; never block in a handler.
    let live = match LIVE.try_lock() {
        Ok(g) => g,
        Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return,
    };
    for (p, _) in live.iter() {
        // SAFETY: `p` is a valid C string; remove_tree makes system calls only.
        unsafe { remove_tree(p.as_ptr(), 0) };
    }
}

/// Removes a file, or a directory and everything in it, with system calls only; whether there was
/// something to remove.
#[cfg(target_os = "linux")]
unsafe fn remove_tree(path: *const libc::c_char, depth: u32) -> bool {
    // SAFETY: plain system calls on a valid path.
    unsafe {
        if libc::unlink(path) == 0 {
            return true;
        }
        let fd = libc::open(path, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        remove_contents(fd, depth);
        libc::close(fd);
        libc::rmdir(path);
        true
    }
}

/// Empties the directory open as `dir` (a few levels deep at most: outputs are shallow).
#[cfg(target_os = "linux")]
unsafe fn remove_contents(dir: libc::c_int, depth: u32) {
    // dirent64 records are 8-byte aligned from the start of the buffer.
    let mut buf = [0u64; 512];
    // Entries shift as they are removed: read from the start until only "." and ".." remain.
    for _ in 0..64 {
        // SAFETY: getdents64 fills `buf` with dirent64 records of the open directory.
        let n = unsafe {
            libc::lseek(dir, 0, libc::SEEK_SET);
            libc::syscall(libc::SYS_getdents64, dir, buf.as_mut_ptr(), std::mem::size_of_val(&buf))
        };
        if n <= 0 {
            return;
        }
        let mut removed = false;
        let mut off = 0usize;
        while off < n as usize {
            // SAFETY: the kernel wrote whole records; d_reclen steps from one to the next and keeps
            // them 8-byte aligned in the aligned buffer.
            let (reclen, kind, name) = unsafe {
                #[allow(clippy::cast_ptr_alignment)]
                let d = buf.as_ptr().cast::<u8>().add(off).cast::<libc::dirent64>();
                (usize::from((*d).d_reclen), (*d).d_type, (*d).d_name.as_ptr())
            };
            off += reclen;
            // SAFETY: d_name is NUL-terminated within the record.
            let bytes = unsafe { std::ffi::CStr::from_ptr(name) }.to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            // SAFETY: plain system calls relative to the open directory.
            unsafe {
                if kind == libc::DT_DIR && depth < 4 {
                    let sub = libc::openat(
                        dir,
                        name,
                        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                    );
                    if sub >= 0 {
                        remove_contents(sub, depth + 1);
                        libc::close(sub);
                    }
                    libc::unlinkat(dir, name, libc::AT_REMOVEDIR);
                } else {
                    libc::unlinkat(dir, name, 0);
                }
            }
            removed = true;
        }
        if !removed {
            return;
        }
    }
}

/// Other systems have no getdents64: the standard library's removal, best effort.
#[cfg(not(target_os = "linux"))]
unsafe fn remove_tree(path: *const libc::c_char, _depth: u32) -> bool {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: the caller passes a valid C string.
    let bytes = unsafe { std::ffi::CStr::from_ptr(path) }.to_bytes();
    let path = Path::new(std::ffi::OsStr::from_bytes(bytes));
    std::fs::remove_file(path).or_else(|_| std::fs::remove_dir_all(path)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bus_error_document_is_the_one_failure_writes() {
        assert_eq!(BUS_ERROR_DOCUMENT, crate::failure::error_document(ErrorCode::InputChanged, BUS_ERROR, 1));
    }
}
