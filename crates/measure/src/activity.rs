//! What this process is measuring now, in words (`NCCL sweep: all_gather, 32 MiB`): set by
//! the probes as they go, read when the process is told to stop, so that the stop names its
//! phase rather than the last line it happened to print; and how such a process ends at once.

use std::sync::Mutex;
use std::time::Duration;

static NOW: Mutex<Option<String>> = Mutex::new(None);

/// What a stop must undo before the process ends (aborting NCCL communicators), registered
/// by the backends that hold such state. Each is kept once.
static ON_STOP: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

/// Before a stop ends the process, `hook` runs (see [`stop_now`]).
pub fn on_stop(hook: fn()) {
    let mut hooks = ON_STOP.lock().unwrap_or_else(|e| e.into_inner());
    if !hooks.iter().any(|h| std::ptr::fn_addr_eq(*h, hook)) {
        hooks.push(hook);
    }
}

/// Ends the process for a stop with `code`: first runs the hooks of [`on_stop`] on a thread
/// of their own, waiting for them at most `budget` (a hook stuck in a driver call must not
/// hold the stop up), then [`end_now`].
pub fn stop_now(code: i32, budget: Duration) -> ! {
    let hooks: Vec<fn()> = ON_STOP.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if !hooks.is_empty() {
        let (done, wait) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("stop-hooks".into())
            .spawn(move || {
                for h in hooks {
                    h();
                }
                let _ = done.send(());
            });
        if spawned.is_ok() {
            let _ = wait.recv_timeout(budget);
        }
    }
    end_now(code)
}

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
    fn a_stop_hook_is_kept_once() {
        fn hook() {}
        on_stop(hook);
        on_stop(hook);
        let n = ON_STOP
            .lock()
            .map(|h| {
                h.iter()
                    .filter(|f| std::ptr::fn_addr_eq(**f, hook as fn()))
                    .count()
            })
            .unwrap_or(0);
        assert_eq!(n, 1);
    }

    #[test]
    fn the_latest_phase_is_the_current_one() {
        enter("NCCL sweep: all_gather, 32 MiB");
        enter("GPU pairs: copies");
        assert_eq!(current().as_deref(), Some("GPU pairs: copies"));
    }
}
