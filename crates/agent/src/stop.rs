//! What the agent does when it is told to stop (SIGTERM: the pod deleted, a deadline, the node
//! shutting down): it says in which phase it was, on stderr and in the termination message,
//! and ends at once with 143, whatever its threads are doing inside CUDA or NCCL.

use anyhow::Context;
use std::sync::atomic::{AtomicI32, Ordering};
use tokio::signal::unix::{SignalKind, signal};

/// The exit code of a stop: 143, or a sim fault's crash code ([`crash_on_stop`]).
static STOP_CODE: AtomicI32 = AtomicI32::new(crate::exit::Exit::Stopped.code());

/// A stop ends the process with `code` instead of 143 (the sim's `crashOnStop` fault: what a
/// stop that crashes looks like to whoever reads the exit code).
pub fn crash_on_stop(code: i32) {
    STOP_CODE.store(code, Ordering::SeqCst);
}

/// Handles SIGTERM from now on, on a thread of its own: the phase is said (see
/// [`crate::output::write_stopped`]) and the process ends with
/// [`Exit::Stopped`](crate::exit::Exit::Stopped): 128 + 15, what the signal itself would
/// give, so that the operator reads the stop as it always has. It ends through
/// [`gpufabric_measure::activity::end_now`], never `std::process::exit`: the exit handlers of
/// the GPU libraries, run while a collective is in flight on another thread, crash the
/// process (a segmentation fault that would read as the node's).
pub fn on_sigterm() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .context("starting the SIGTERM handler")?;
    let mut term = {
        let _in_runtime = runtime.enter();
        signal(SignalKind::terminate()).context("handling SIGTERM")?
    };
    std::thread::Builder::new()
        .name("sigterm".into())
        .spawn(move || {
            if runtime.block_on(term.recv()).is_some() {
                let _held = crate::output::write_stopped("SIGTERM");
                gpufabric_measure::activity::end_now(STOP_CODE.load(Ordering::SeqCst));
            }
        })
        .context("starting the SIGTERM handler")?;
    Ok(())
}
