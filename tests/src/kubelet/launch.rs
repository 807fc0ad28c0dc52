//! A container as a local process: its program, arguments and env resolved from the pod,
//! started in its own process group, watched until it exits, hits its deadline, is
//! evicted or deleted, and its end written as the kubelet writes it.

use super::pod::{DEADLINE_MESSAGE, PodRun, until_deadline};
use super::sources::{container_env, expand};
use super::status::{Disruption, now, termination_message};
use super::{ENV_AGENT_BIN_DIR, LOG_FILE, Stop, TERMINATION_LOG_FILE};
use crate::process::signal_group;
use gpufabric_api::keys;
use nix::sys::signal::Signal;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// What the process of a pod is, once resolved from its spec.
pub(super) struct Launch {
    program: PathBuf,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    fallback_to_logs: bool,
}

#[derive(Debug)]
pub(super) enum LaunchError {
    /// Env the kubelet cannot build (`CreateContainerConfigError`); retried.
    Config(String),
    /// The program cannot be found or started.
    Start(String),
}

/// Resolves the first container of the pod into a program, its arguments and env.
pub(super) async fn resolve(run: &PodRun) -> Result<Launch, LaunchError> {
    let spec = run
        .pod
        .spec
        .as_ref()
        .ok_or_else(|| LaunchError::Config("pod has no spec".into()))?;
    let c = spec
        .containers
        .first()
        .ok_or_else(|| LaunchError::Config("pod has no containers".into()))?;
    let opts = &run.inner.opts;
    let host_path = std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into());
    let path = format!("{}:{host_path}", opts.agent_bin_dir.display());
    let mut env: BTreeMap<String, String> = opts.extra_env.clone();
    env.insert("PATH".into(), path.clone());
    env.insert("HOME".into(), run.dir.display().to_string());
    env.insert("HOSTNAME".into(), run.name.clone());
    container_env(&run.inner.client, &run.pod, c, &run.ip, &mut env)
        .await
        .map_err(LaunchError::Config)?;
    env.insert(
        keys::ENV_TERMINATION_LOG.into(),
        run.dir.join(TERMINATION_LOG_FILE).display().to_string(),
    );
    env.insert(
        keys::ENV_SIM_FLEET.into(),
        run.inner.fleet_path.display().to_string(),
    );
    let mut argv: Vec<String> = match &c.command {
        Some(cmd) if !cmd.is_empty() => cmd.iter().map(|a| expand(a, &env)).collect(),
        _ => opts.default_command.clone(),
    };
    argv.extend(c.args.iter().flatten().map(|a| expand(a, &env)));
    let Some((program, args)) = argv.split_first() else {
        return Err(LaunchError::Start("no command to run".into()));
    };
    let program = find_program(program, &path).ok_or_else(|| {
        LaunchError::Start(format!(
            "executable {program:?} not found in PATH ({path}); for fabric-agent run `cargo build -p gpufabric-agent` \
             or set {ENV_AGENT_BIN_DIR}"
        ))
    })?;
    Ok(Launch {
        program,
        args: args.to_vec(),
        env,
        fallback_to_logs: c.termination_message_policy.as_deref() == Some("FallbackToLogsOnError"),
    })
}

/// Finds `program` as the kubelet's container would: a path containing `/` as is (or, if
/// absent on this host, its file name on `PATH`), else the first match on `PATH`.
pub(super) fn find_program(program: &str, path: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let exec = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let name = if program.contains('/') {
        let p = PathBuf::from(program);
        if exec(&p) {
            return Some(p);
        }
        p.file_name()?.to_string_lossy().to_string()
    } else {
        program.to_string()
    };
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(&name))
        .find(|p| exec(p))
}

enum End {
    Exited(std::process::ExitStatus),
    Deadline,
    Stopped(Stop),
}

/// Starts the process, reports it Running, and reports how it ended.
pub(super) async fn run_process(mut run: PodRun, launch: Launch) {
    let log = match std::fs::File::create(run.dir.join(LOG_FILE)) {
        Ok(f) => f,
        Err(e) => return run.end_start_error(e.to_string()).await,
    };
    let mut cmd = std::process::Command::new(&launch.program);
    cmd.args(&launch.args)
        .env_clear()
        .envs(&launch.env)
        .current_dir(&run.dir)
        .stdin(std::process::Stdio::null())
        .stdout(
            log.try_clone()
                .map(std::process::Stdio::from)
                .unwrap_or(std::process::Stdio::null()),
        )
        .stderr(log);
    crate::process::harden(&mut cmd);
    let mut child = match tokio::process::Command::from(cmd).spawn() {
        Ok(c) => c,
        Err(e) => {
            let msg = format!("starting {}: {e}", launch.program.display());
            return run.end_start_error(msg).await;
        }
    };
    let pid = child.id().unwrap_or(0);
    run.pid.store(pid, Ordering::SeqCst);
    let container_id = format!("process://{pid}");
    tracing::info!(pod = %run.label(), pid, program = %launch.program.display(), ip = %run.ip, "pod started");
    let mut base = run.container_status(json!(null));
    base["containerID"] = json!(container_id);
    let mut running = base.clone();
    running["ready"] = json!(true);
    running["started"] = json!(true);
    running["state"] = json!({"running": {"startedAt": run.start_time}});
    if *run.stop.borrow() == Stop::Run {
        run.write("Running", None, None, running, None).await;
    }
    let deadline = run.deadline;
    let end = loop {
        let state = *run.stop.borrow_and_update();
        if state != Stop::Run {
            break End::Stopped(state);
        }
        tokio::select! {
            st = child.wait() => match st {
                Ok(st) => break End::Exited(st),
                Err(e) => {
                    tracing::warn!(pod = %run.label(), error = %e, "waiting for the process failed");
                    break End::Deadline;
                }
            },
            _ = until_deadline(deadline) => break End::Deadline,
            changed = run.stop.changed() => if changed.is_err() { break End::Stopped(Stop::Abandon) },
        }
    };
    let (status, reason, pod_message, eviction) = match end {
        End::Exited(st) => {
            // Take down anything the process left behind in its group.
            signal_group(pid, Signal::SIGKILL);
            (Some(st), None, None, None)
        }
        End::Deadline => {
            let st = kill_child(&mut child, pid, Duration::ZERO).await;
            let msg = Some(DEADLINE_MESSAGE.to_string());
            (st, Some("DeadlineExceeded"), msg, None)
        }
        End::Stopped(Stop::Evicted(e)) => {
            let st = kill_child(&mut child, pid, Duration::ZERO).await;
            tracing::info!(pod = %run.label(), reason = e.reason(), "pod evicted");
            (st, Some(e.reason()), Some(e.message().to_string()), Some(e))
        }
        End::Stopped(Stop::Deleted { grace_seconds }) => {
            let grace = Duration::from_secs(u64::try_from(grace_seconds).unwrap_or(0))
                .min(run.inner.opts.max_grace);
            let st = kill_child(&mut child, pid, grace).await;
            run.pid.store(0, Ordering::SeqCst);
            // As a kubelet does: the container's end (its exit code, its termination message)
            // is written before the deletion is confirmed, so that a watcher sees how the
            // stopped process ended.
            let code = st.map(exit_code).unwrap_or(137);
            let message = termination_message(&run.dir, code != 0, launch.fallback_to_logs);
            let mut terminated = json!({"exitCode": code,
                "reason": if code == 0 { "Completed" } else { "Error" },
                "startedAt": run.start_time, "finishedAt": now(), "containerID": container_id});
            if !message.is_empty() {
                terminated["message"] = json!(message);
            }
            let mut container = base;
            container["state"] = json!({ "terminated": terminated });
            let phase = if code == 0 { "Succeeded" } else { "Failed" };
            run.write(phase, None, None, container, None).await;
            tracing::info!(pod = %run.label(), code, "pod deleted: process stopped");
            let c = run.inner.client.clone();
            return super::pod::confirm_deletion(&c, &run.namespace, &run.name, &run.uid).await;
        }
        End::Stopped(_) => {
            let _ = kill_child(&mut child, pid, Duration::ZERO).await;
            run.pid.store(0, Ordering::SeqCst);
            return;
        }
    };
    run.pid.store(0, Ordering::SeqCst);
    let code = status.map(exit_code).unwrap_or(137);
    let failed = code != 0 || reason.is_some();
    let message = termination_message(&run.dir, failed, launch.fallback_to_logs);
    let mut terminated = json!({"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
                                "startedAt": run.start_time, "finishedAt": now(), "containerID": container_id});
    if !message.is_empty() {
        terminated["message"] = json!(message);
    }
    let mut container = base;
    container["state"] = json!({ "terminated": terminated });
    let phase = if failed { "Failed" } else { "Succeeded" };
    tracing::info!(pod = %run.label(), phase, code, "pod finished");
    if *run.stop.borrow() == Stop::Run || reason.is_some() {
        let disruption = eviction.map(|e| Disruption {
            reason: e.condition_reason(),
            message: e.message(),
        });
        run.write(phase, reason, pod_message, container, disruption)
            .await;
    }
    run.wait_for_deletion().await
}

/// SIGTERM to the process group, up to `grace` for the leader to exit, then SIGKILL.
async fn kill_child(
    child: &mut tokio::process::Child,
    pid: u32,
    grace: Duration,
) -> Option<std::process::ExitStatus> {
    signal_group(pid, Signal::SIGTERM);
    let exited = if grace.is_zero() {
        None
    } else {
        tokio::time::timeout(grace, child.wait()).await.ok()
    };
    signal_group(pid, Signal::SIGKILL);
    match exited {
        Some(Ok(st)) => Some(st),
        _ => child.wait().await.ok(),
    }
}

fn exit_code(st: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code()
        .or_else(|| st.signal().map(|s| 128 + s))
        .unwrap_or(137)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_an_absolute_program_missing_here_by_its_name_on_path() {
        let found = find_program("/nonexistent/dir/sh", "/usr/bin:/bin");
        assert!(found.is_some_and(|p| p.ends_with("sh")));
        assert_eq!(find_program("no-such-program-here", "/usr/bin:/bin"), None);
    }
}
