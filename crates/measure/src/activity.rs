//! What this process is measuring now, in words (`NCCL sweep: all_gather, 32 MiB`): set by
//! the probes as they go, read when the process is told to stop, so that the stop names its
//! phase rather than the last line it happened to print; and how such a process ends at once.

use std::sync::Mutex;

static NOW: Mutex<Option<String>> = Mutex::new(None);

/// From now on the process is doing `what`.
pub fn enter(what: impl Into<String>) {
    let what = what.into();
    let mut now = NOW.lock().unwrap_or_else(|e| e.into_inner());
    *now = Some(what);
}

/// What the process is doing now; `None` before its first phase. Never blocks for long: the
/// lock is held only to copy a short string.
pub fn current() -> Option<String> {
    NOW.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Ends the process now with `code`, running no exit handler and no library destructor.
///
/// `std::process::exit` runs the C library's `atexit` handlers and the static destructors of
/// CUDA, NCCL and cuBLAS while other threads of the process are still inside those
/// libraries (a collective, a copy, NCCL's proxy thread): they tear down state in use, and
/// the process dies of a segmentation fault instead of the code it was given. `_exit` leaves
/// the GPU contexts to the kernel, which frees them as it frees any process's.
pub fn end_now(code: i32) -> ! {
    // SAFETY: `_exit` takes no pointer and never returns; skipping the exit handlers is its
    // purpose (see above). Nothing written to stderr is buffered.
    unsafe { libc::_exit(code) }
}

/// A message size as a person reads it: `32 MiB`, `1 GiB`, `8 B`, or bytes when it is not a
/// whole number of a binary unit (`1000 B`).
pub fn size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (unit, name) in UNITS {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{} {name}", bytes / unit);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_binary_units_when_whole() {
        assert_eq!(size(33_554_432), "32 MiB");
        assert_eq!(size(1 << 30), "1 GiB");
        assert_eq!(size(8), "8 B");
        assert_eq!(size(1000), "1000 B");
        assert_eq!(size(3 << 10), "3 KiB");
    }

    #[test]
    fn the_latest_phase_is_the_current_one() {
        enter("NCCL sweep: all_gather, 32 MiB");
        enter("GPU pairs: copies");
        assert_eq!(current().as_deref(), Some("GPU pairs: copies"));
    }
}
