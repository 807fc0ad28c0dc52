//! The DDP probe with one process per GPU, as PyTorch DDP runs: the parent makes the NCCL
//! unique id, starts one `ddp-worker` child per rank, hands each its task (id included)
//! as one JSON line on stdin, and combines the JSON lines they print into the probe's
//! points.

use super::{self as ddp, DdpSettings};
use crate::cuda::gpu::{Gpu, GpuError, GpuResult};
use crate::cuda::nccl;
use crate::model::{PointTimes, buckets};
use cudarc::nccl::sys as nsys;
use gpufabric_api::result::{DdpPoint, DdpResult};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The hidden subcommand of the agent binary that runs one rank.
pub(crate) const WORKER_SUBCOMMAND: &str = "ddp-worker";

/// What one worker process is asked to do (one JSON line on its stdin).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WorkerTask {
    pub rank: u32,
    pub world: u32,
    /// CUDA device ordinal (as the parent sees the devices).
    pub device: u32,
    /// The NCCL unique id, 128 bytes as hex.
    pub id: String,
    /// The probe's settings; `counts` is the parent's business and ignored. With `trace`,
    /// the worker prints its last timed step's timeline on stderr.
    pub settings: DdpSettings,
}

impl WorkerTask {
    fn settings(&self) -> DdpSettings {
        DdpSettings {
            counts: vec![self.world],
            ..self.settings.clone()
        }
    }
}

/// What one worker reports (one JSON line on its stdout).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "status", rename_all = "camelCase")]
pub(crate) enum WorkerReport {
    #[serde(rename_all = "camelCase")]
    Measured {
        rank: u32,
        step_ms: f64,
        compute_ms: f64,
        compute_alone_ms: f64,
        comm_alone_ms: f64,
    },
    #[serde(rename_all = "camelCase")]
    Failed {
        rank: Option<u32>,
        timeout: bool,
        message: String,
    },
}

/// The report in one line of a worker's stdout, if the line is one (NCCL may print
/// other lines there).
pub(crate) fn parse_report(line: &str) -> Option<WorkerReport> {
    let line = line.trim();
    if !line.starts_with('{') {
        return None;
    }
    serde_json::from_str(line).ok()
}

/// An NCCL unique id as 256 hex digits.
pub(crate) fn encode_id(id: &nsys::ncclUniqueId) -> String {
    id.internal
        .iter()
        .map(|b| format!("{:02x}", *b as u8))
        .collect()
}

/// Text that is not an NCCL unique id of 256 hex digits.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum IdError {
    /// Its length in bytes (not 256), or it is not ASCII.
    #[error("an NCCL unique id is 256 hex digits, got {0} characters")]
    Length(usize),
    #[error("bad hex digit in the NCCL unique id at {at}: {source}")]
    Digit {
        at: usize,
        source: std::num::ParseIntError,
    },
}

/// The NCCL unique id of 256 hex digits.
pub(crate) fn decode_id(hex: &str) -> Result<nsys::ncclUniqueId, IdError> {
    let hex = hex.trim();
    if hex.len() != 256 || !hex.is_ascii() {
        return Err(IdError::Length(hex.len()));
    }
    let mut id = nsys::ncclUniqueId { internal: [0; 128] };
    for (i, cell) in id.internal.iter_mut().enumerate() {
        let byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|source| IdError::Digit { at: 2 * i, source })?;
        *cell = byte as std::ffi::c_char;
    }
    Ok(id)
}

/// Runs one worker: reads the task line from `input`, measures, writes the report line
/// to `output`. Every failure, a panic of a missing library included, becomes a
/// `Failed` report; only an I/O error on `output` is returned.
pub fn worker_main(input: &mut dyn BufRead, output: &mut dyn Write) -> std::io::Result<()> {
    let mut line = String::new();
    let report = match input.read_line(&mut line) {
        Err(e) => failed(None, false, format!("reading the task: {e}")),
        Ok(_) => match serde_json::from_str::<WorkerTask>(line.trim()) {
            Err(e) => failed(None, false, format!("bad task line: {e}")),
            Ok(task) => run_task(&task),
        },
    };
    let text = serde_json::to_string(&report).map_err(std::io::Error::other)?;
    writeln!(output, "{text}")?;
    output.flush()
}

fn failed(rank: Option<u32>, timeout: bool, message: String) -> WorkerReport {
    WorkerReport::Failed {
        rank,
        timeout,
        message,
    }
}

fn run_task(task: &WorkerTask) -> WorkerReport {
    let id = match decode_id(&task.id) {
        Ok(id) => id,
        Err(e) => return failed(Some(task.rank), false, e.to_string()),
    };
    let set = task.settings();
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ddp::measure_rank(task.device, task.rank, task.world, id, &set)
    }));
    match run {
        Ok(Ok(t)) => WorkerReport::Measured {
            rank: task.rank,
            step_ms: t.step_ms,
            compute_ms: t.compute_ms.first().copied().unwrap_or(0.0),
            compute_alone_ms: t.compute_alone_ms,
            comm_alone_ms: t.comm_alone_ms,
        },
        Ok(Err(e)) => failed(
            Some(task.rank),
            matches!(e, GpuError::Timeout(..)),
            e.to_string(),
        ),
        Err(p) => failed(
            Some(task.rank),
            false,
            format!("panicked: {}", crate::cuda::panic_message(p.as_ref())),
        ),
    }
}

/// Why the workers' reports make no point.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CombineError {
    #[error("no reports")]
    NoReports,
    /// The report at `index` is another rank's.
    #[error("report {index} is of rank {rank}, not {want}")]
    OtherRank { index: usize, rank: u32, want: u32 },
    #[error("rank {rank} failed: {message}")]
    Failed { rank: u32, message: String },
}

/// One report per rank, in rank order, combined into the point's times: the step is the
/// slowest rank's, compute per GPU in rank order, compute and communication alone the
/// slowest rank's.
pub(crate) fn combine(reports: &[WorkerReport]) -> Result<PointTimes, CombineError> {
    combine_ranks(reports, 0)
}

/// [`combine`] for reports of the ranks `first`, `first + 1`, ... (one node's GPUs in a
/// clique over several nodes).
pub(crate) fn combine_ranks(
    reports: &[WorkerReport],
    first: u32,
) -> Result<PointTimes, CombineError> {
    if reports.is_empty() {
        return Err(CombineError::NoReports);
    }
    let ranks = reports
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let want = first + i as u32;
            match r {
                WorkerReport::Measured {
                    rank,
                    step_ms,
                    compute_ms,
                    compute_alone_ms,
                    comm_alone_ms,
                } if *rank == want => Ok(PointTimes {
                    step_ms: *step_ms,
                    compute_ms: vec![*compute_ms],
                    compute_alone_ms: *compute_alone_ms,
                    comm_alone_ms: *comm_alone_ms,
                }),
                WorkerReport::Measured { rank, .. } => Err(CombineError::OtherRank {
                    index: i,
                    rank: *rank,
                    want,
                }),
                WorkerReport::Failed { message, .. } => Err(CombineError::Failed {
                    rank: want,
                    message: message.clone(),
                }),
            }
        })
        .collect::<Result<Vec<_>, CombineError>>()?;
    Ok(PointTimes::together(ranks))
}

/// Children killed and reaped when dropped: no worker outlives the probe.
struct Workers {
    children: Vec<Child>,
}

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
    }
}

/// Starts `program args` once per input line (rank = position), hands each its line on
/// stdin and collects one report per rank within `limit`. A worker that fails, exits
/// without a report or is not done in time is an error; all workers are then killed.
/// `nccl_log`: the file this process pointed NCCL's INFO log at, which the workers keep out
/// of.
pub(crate) fn run_workers(
    program: &Path,
    args: &[&str],
    inputs: &[String],
    limit: Duration,
    nccl_log: Option<&Path>,
) -> GpuResult<Vec<WorkerReport>> {
    let (tx, rx) = mpsc::channel::<(usize, Option<WorkerReport>)>();
    let mut workers = Workers {
        children: Vec::new(),
    };
    let quiet_nccl = nccl_log.is_some();
    for (rank, input) in inputs.iter().enumerate() {
        let child = spawn_worker(program, args, rank, input, quiet_nccl, tx.clone())?;
        workers.children.push(child);
    }
    drop(tx);
    let deadline = Instant::now() + limit;
    let mut reports: Vec<Option<WorkerReport>> = vec![None; inputs.len()];
    while reports.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((rank, Some(r))) => {
                if let WorkerReport::Failed {
                    timeout, message, ..
                } = &r
                {
                    let what = format!("ddp worker rank {rank}: {message}");
                    return Err(if *timeout {
                        GpuError::Timeout(what, limit)
                    } else {
                        GpuError::Call {
                            call: "ddp worker",
                            detail: what,
                        }
                    });
                }
                reports[rank] = Some(r);
            }
            Ok((rank, None)) => {
                let status = workers
                    .children
                    .get_mut(rank)
                    .map(wait_briefly)
                    .unwrap_or_else(|| "unknown".into());
                return Err(GpuError::Call {
                    call: "ddp worker",
                    detail: format!("rank {rank} ended without a report ({status})"),
                });
            }
            Err(_) => {
                let missing: Vec<usize> = reports
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.is_none())
                    .map(|(i, _)| i)
                    .collect();
                return Err(GpuError::Timeout(
                    format!("ddp worker rank(s) {missing:?} (killed)"),
                    limit,
                ));
            }
        }
    }
    // Let the workers tear down on their own for a moment; Drop kills what is left.
    let until = Instant::now() + Duration::from_secs(5);
    for c in &mut workers.children {
        while Instant::now() < until {
            match c.try_wait() {
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                _ => break,
            }
        }
    }
    Ok(reports.into_iter().flatten().collect())
}

/// Starts the worker of `rank`, hands it its task line (`input`) and reads its report on a
/// thread of its own, which sends `(rank, report)` to `tx` (None: it ended without one).
fn spawn_worker(
    program: &Path,
    args: &[&str],
    rank: usize,
    input: &str,
    quiet_nccl: bool,
    tx: mpsc::Sender<(usize, Option<WorkerReport>)>,
) -> GpuResult<Child> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if quiet_nccl {
        // The parent's NCCL log file is parsed for transports; workers keep out of it.
        cmd.env_remove("NCCL_DEBUG_FILE")
            .env_remove("NCCL_DEBUG_SUBSYS")
            .env("NCCL_DEBUG", "WARN");
    }
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn().map_err(|e| GpuError::Call {
        call: "starting a ddp worker",
        detail: format!("{}: {e}", program.display()),
    })?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    if let Some(mut stdin) = stdin {
        // A worker that died at once is found below (no report), not here.
        let _ = writeln!(stdin, "{input}");
    }
    let Some(stdout) = stdout else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(GpuError::Call {
            call: "starting a ddp worker",
            detail: "no stdout pipe".into(),
        });
    };
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            match parse_report(&line) {
                Some(r) if !sent => {
                    sent = true;
                    let _ = tx.send((rank, Some(r)));
                }
                _ => tracing::debug!(rank, line = %line, "ddp worker output"),
            }
        }
        if !sent {
            let _ = tx.send((rank, None));
        }
    });
    Ok(child)
}

/// The exit status of a child whose stdout closed, waiting up to a second for it.
fn wait_briefly(c: &mut Child) -> String {
    let until = Instant::now() + Duration::from_secs(1);
    loop {
        match c.try_wait() {
            Ok(Some(s)) => return s.to_string(),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => return "still running, stdout closed".into(),
            Err(e) => return format!("wait failed: {e}"),
        }
    }
}

/// The child gets SIGKILL when the thread that started it ends (the agent died).
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Measures every GPU count of the probe with one worker process per GPU (`exe`'s
/// `ddp-worker` subcommand); `nccl_log` as [`run_workers`] takes it.
pub(crate) fn probe(
    gpus: &[Gpu],
    set: &DdpSettings,
    exe: &Path,
    nccl_log: Option<&Path>,
    progress: &dyn Fn(&str),
) -> GpuResult<DdpResult> {
    let bks = buckets(
        set.hidden as u64,
        set.layers,
        set.first_bucket_bytes,
        set.bucket_bytes,
    );
    // Start-up, buffers and NCCL set-up come on top of the steps, each of which the
    // workers bound by the timeout themselves.
    let limit = set.timeout * 2 + Duration::from_secs(30);
    let mut points: Vec<DdpPoint> = Vec::new();
    for &count in &set.counts {
        let count = count as usize;
        if count == 0 || count > gpus.len() {
            continue;
        }
        let id = encode_id(&nccl::unique_id()?);
        let inputs: Vec<String> = gpus[..count]
            .iter()
            .enumerate()
            .map(|(rank, g)| {
                let task = WorkerTask {
                    rank: rank as u32,
                    world: count as u32,
                    device: g.index,
                    id: id.clone(),
                    settings: set.clone(),
                };
                serde_json::to_string(&task).map_err(|e| GpuError::Call {
                    call: "ddp worker task",
                    detail: e.to_string(),
                })
            })
            .collect::<GpuResult<_>>()?;
        let reports = run_workers(exe, &[WORKER_SUBCOMMAND], &inputs, limit, nccl_log)?;
        let t = combine(&reports).map_err(|e| GpuError::Call {
            call: "ddp worker",
            detail: e.to_string(),
        })?;
        let point = make_point_logged(set, points.first(), &t, gpus, count, progress);
        points.push(point);
    }
    Ok(ddp::result(set, &bks, points))
}

fn make_point_logged(
    set: &DdpSettings,
    base: Option<&DdpPoint>,
    t: &PointTimes,
    gpus: &[Gpu],
    count: usize,
    progress: &dyn Fn(&str),
) -> DdpPoint {
    let indices = gpus[..count].iter().map(|g| g.index).collect();
    let p = |s: &str| progress(&format!("{s} [one process per GPU]"));
    ddp::make_point(set, base, t, indices, &p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(rank: u32, step: f64, compute: f64) -> WorkerReport {
        WorkerReport::Measured {
            rank,
            step_ms: step,
            compute_ms: compute,
            compute_alone_ms: compute - 1.0,
            comm_alone_ms: 5.0 + f64::from(rank),
        }
    }

    fn sh() -> &'static Path {
        Path::new("/bin/sh")
    }

    #[test]
    fn an_nccl_id_survives_the_hex_round_trip() {
        let mut id = nsys::ncclUniqueId { internal: [0; 128] };
        for (i, c) in id.internal.iter_mut().enumerate() {
            *c = (i as u8).wrapping_mul(37).wrapping_add(200) as std::ffi::c_char;
        }
        let hex = encode_id(&id);
        assert_eq!(hex.len(), 256);
        assert_eq!(decode_id(&hex).expect("decodes").internal, id.internal);
    }

    #[test]
    fn a_malformed_id_is_an_error_not_a_panic() {
        assert!(decode_id("abcd").is_err());
        assert!(decode_id(&"zz".repeat(128)).is_err());
        assert!(decode_id(&"é".repeat(128)).is_err());
    }

    #[test]
    fn reports_parse_and_other_lines_are_ignored() {
        let r = measured(1, 24.5, 21.0);
        let line = serde_json::to_string(&r).expect("serializes");
        assert!(line.contains("\"status\":\"measured\""), "{line}");
        assert_eq!(parse_report(&format!("  {line}\n")), Some(r));
        assert_eq!(parse_report("host:123:456 [0] NCCL WARN something"), None);
        assert_eq!(parse_report("{not json"), None);
        let f = parse_report(
            r#"{"status":"failed","rank":2,"timeout":true,"message":"ddp probe step"}"#,
        );
        assert!(matches!(
            f,
            Some(WorkerReport::Failed {
                timeout: true,
                rank: Some(2),
                ..
            })
        ));
    }

    #[test]
    fn combining_takes_the_slowest_rank_and_keeps_compute_per_gpu() {
        let t = combine(&[measured(0, 24.0, 21.0), measured(1, 24.6, 21.5)]).expect("ok");
        assert_eq!(t.step_ms, 24.6);
        assert_eq!(t.compute_ms, vec![21.0, 21.5]);
        assert_eq!(t.compute_alone_ms, 20.5);
        assert_eq!(t.comm_alone_ms, 6.0);
        assert!(combine(&[measured(1, 24.0, 21.0)]).is_err(), "rank order");
        assert!(combine(&[]).is_err());
        let failed = WorkerReport::Failed {
            rank: Some(1),
            timeout: false,
            message: "boom".into(),
        };
        let e = combine(&[measured(0, 1.0, 1.0), failed]).expect_err("a failed rank");
        assert!(e.to_string().contains("boom"), "{e}");
    }

    #[test]
    fn a_bad_task_line_gets_a_failed_report() {
        let mut out = Vec::new();
        worker_main(&mut "not json\n".as_bytes(), &mut out).expect("writes");
        let text = String::from_utf8(out).expect("utf8");
        match parse_report(&text) {
            Some(WorkerReport::Failed { message, .. }) => {
                assert!(message.contains("bad task"), "{message}")
            }
            other => panic!("expected a failed report, got {other:?} from {text}"),
        }
    }

    #[test]
    fn a_task_with_a_bad_id_fails_before_touching_a_gpu() {
        let task = WorkerTask {
            rank: 3,
            world: 4,
            device: 0,
            id: "00".into(),
            settings: DdpSettings {
                hidden: 64,
                layers: 2,
                batch: 64,
                first_bucket_bytes: 1 << 20,
                bucket_bytes: 25 << 20,
                warmup: 1,
                steps: 1,
                counts: vec![1, 4],
                timeout: Duration::from_secs(1),
                trace: true,
            },
        };
        let line = serde_json::to_string(&task).expect("serializes");
        let back: WorkerTask = serde_json::from_str(&line).expect("parses");
        assert_eq!(back, task);
        let mut out = Vec::new();
        worker_main(&mut format!("{line}\n").as_bytes(), &mut out).expect("writes");
        let r = parse_report(&String::from_utf8_lossy(&out));
        assert!(
            matches!(r, Some(WorkerReport::Failed { rank: Some(3), timeout: false, ref message }) if message.contains("256 hex")),
            "{r:?}"
        );
    }

    #[test]
    fn workers_hand_back_their_reports_in_rank_order() {
        // Each worker echoes the report it is given on stdin, after a line of noise.
        let inputs: Vec<String> = (0..3)
            .map(|r| serde_json::to_string(&measured(r, 20.0 + f64::from(r), 19.0)).expect("json"))
            .collect();
        let reports = run_workers(
            sh(),
            &["-c", "read l; echo 'NCCL INFO noise'; echo \"$l\""],
            &inputs,
            Duration::from_secs(20),
            None,
        )
        .expect("reports");
        assert_eq!(reports.len(), 3);
        for (r, rep) in reports.iter().enumerate() {
            assert_eq!(rep, &measured(r as u32, 20.0 + r as f64, 19.0));
        }
    }

    #[test]
    fn a_worker_that_exits_without_a_report_is_a_clear_error() {
        let started = Instant::now();
        let e = run_workers(
            sh(),
            &["-c", "read l; echo oops; exit 3"],
            &["{}".to_string(), "{}".to_string()],
            Duration::from_secs(20),
            None,
        )
        .expect_err("no report");
        let text = e.to_string();
        assert!(
            text.contains("without a report") && text.contains('3'),
            "{text}"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_hung_worker_becomes_a_timeout_and_is_killed() {
        let started = Instant::now();
        // Rank 0 reports, rank 1 hangs.
        let ok = serde_json::to_string(&measured(0, 1.0, 1.0)).expect("json");
        let e = run_workers(
            sh(),
            &[
                "-c",
                "read l; case \"$l\" in *measured*) echo \"$l\";; *) exec sleep 60;; esac",
            ],
            &[ok, "hang".to_string()],
            Duration::from_millis(800),
            None,
        )
        .expect_err("times out");
        assert!(
            matches!(e, GpuError::Timeout(ref w, _) if w.contains("[1]")),
            "{e}"
        );
        // The hung worker was killed, not waited for.
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_worker_reporting_a_timeout_fails_the_probe_with_a_timeout() {
        let line = r#"{"status":"failed","rank":0,"timeout":true,"message":"ddp probe step did not finish within 2s"}"#;
        let e = run_workers(
            sh(),
            &["-c", &format!("read l; echo '{line}'")],
            &["{}".to_string()],
            Duration::from_secs(20),
            None,
        )
        .expect_err("fails");
        assert!(
            matches!(e, GpuError::Timeout(ref w, _) if w.contains("rank 0")),
            "{e}"
        );
    }
}
