//! What the agent does when it is told to stop (SIGTERM: the pod deleted, a deadline):
//! it says in which phase it was, on stderr and in the termination message, and exits.

use anyhow::Context;
use tokio::signal::unix::{SignalKind, signal};

/// Handles SIGTERM from now on, on a thread of its own: the phase is said (see
/// [`crate::output::write_stopped`]) and the process exits with
/// [`Exit::Stopped`](crate::exit::Exit::Stopped): 128 + 15, what the signal itself would
/// give, so that the operator reads the stop as it always has.
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
                std::process::exit(crate::exit::Exit::Stopped.code());
            }
        })
        .context("starting the SIGTERM handler")?;
    Ok(())
}
