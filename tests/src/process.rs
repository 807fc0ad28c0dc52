//! Child processes that cannot outlive the test (own process group, PR_SET_PDEATHSIG,
//! group-wide SIGTERM then SIGKILL), and checks on processes through /proc.

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

/// Makes `cmd` start in a new process group (so the whole group can be signalled) and
/// receive SIGKILL when the thread that spawned it exits (PR_SET_PDEATHSIG): a test
/// process that is killed with SIGKILL leaves nothing behind.
///
/// PR_SET_PDEATHSIG follows the spawning *thread*: spawn from a thread that lives as
/// long as the child should (a test's thread, a runtime worker), not from a blocking pool.
pub fn harden(cmd: &mut Command) {
    cmd.process_group(0);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // functions (prctl, getppid, raise); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if libc::getppid() != parent {
                libc::raise(libc::SIGKILL);
            }
            Ok(())
        });
    }
}

/// Sends `signal` to the process group `pgid`; a group that is already gone is fine.
pub(crate) fn signal_group(pgid: u32, signal: Signal) {
    if let Ok(raw) = i32::try_from(pgid) {
        let _ = killpg(Pid::from_raw(raw), signal);
    }
}

/// Whether process `pid` exists and has not exited (a zombie counts as exited).
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses, which may itself contain ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Live processes whose command line contains `needle`: `(pid, command line)`.
pub fn processes_mentioning(needle: &str) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != std::process::id())
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            (cmdline.contains(needle) && pid_alive(pid)).then(|| (pid, cmdline.trim().to_string()))
        })
        .collect()
}

/// Stops a child and its whole process group: SIGTERM, up to `grace` for the leader to
/// exit, then SIGKILL to the group, and reaps the leader.
pub(crate) fn stop_child(child: &mut std::process::Child, grace: Duration) {
    let pgid = child.id();
    if matches!(child.try_wait(), Ok(None)) {
        signal_group(pgid, Signal::SIGTERM);
        let end = Instant::now() + grace;
        while Instant::now() < end {
            if !matches!(child.try_wait(), Ok(None)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    signal_group(pgid, Signal::SIGKILL);
    let _ = child.kill();
    let _ = child.wait();
}
