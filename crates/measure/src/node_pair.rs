//! The node-pair probe, backend-neutral: one rank's steps, the refusals on the way and the
//! document they add up to; the cuda and sim backends ([`PairBackend`]) do only the steps.
//!
//! In order: the backend gets ready and refuses GPUs other work holds ([`PairBackend::prepare`]:
//! such a rank ends alone, before it meets the other); the ranks meet over the
//! [`crate::rendezvous`] (rank 0 makes the id and serves it; a peer that never comes is a
//! not-measured document); other work that started while the rank waited makes the pair not
//! measured, this node's doing; the backend measures the collectives, watched: a rank that
//! met the other but never joined the communicator with it is not measured (the caller ends
//! the process, as the set-up cannot be aborted); work that started on the GPUs while they
//! measured makes the pair not measured (unless the GPUs are shared by request or a
//! collective timed out); last, both ranks pass a barrier, so neither reports a pair the
//! other abandoned.

use crate::pairs::PairOptions;
use crate::rendezvous::{self, Config, ID_BYTES, RendezvousError};
use crate::{CheckError, Progress};
use gpufabric_api::pair::{NodePairResult, NotMeasured, PAIR_SCHEMA};
use gpufabric_api::result::{Backend, ErrorKind, Phase, PhaseError};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What a rank measures with once the ranks met.
pub struct Met<'a> {
    pub opts: &'a PairOptions,
    /// The id rank 0 made and handed over.
    pub id: &'a [u8; ID_BYTES],
    /// To be set once this rank's communicator with the other exists.
    pub joined: &'a AtomicBool,
    /// Meets the other rank; called before each timed loop.
    pub barrier: &'a mut dyn FnMut() -> Result<(), RendezvousError>,
    pub progress: Progress<'a>,
}

/// How one backend does the steps of a node pair; the order is [`run`]'s.
pub trait PairBackend {
    /// The backend the document names.
    fn kind(&self) -> Backend;

    /// Before the ranks meet: the backend can measure here, and other work holds none of the
    /// GPUs (unless `shared`); an error ends this rank alone.
    fn prepare(&mut self, shared: bool, progress: Progress) -> Result<(), CheckError>;

    /// The id rank 0 hands the other rank (called on rank 0 only).
    fn make_id(&mut self) -> Result<[u8; ID_BYTES], CheckError>;

    /// Once met, before this rank makes anything on the GPUs: [`CheckError::GpusInUse`] when
    /// other work started on them while it waited (unless `shared`).
    fn look_again(&mut self, shared: bool) -> Result<(), CheckError>;

    /// Measures the pair's collectives into `doc`: this node's GPUs, each collective, the
    /// transport and NICs, and the phase errors of collectives that failed or hung. An
    /// `Err` is a rank that could not measure at all.
    fn measure(&mut self, met: &mut Met, doc: &mut NodePairResult) -> Result<(), CheckError>;

    /// After the measurements: [`CheckError::GpusInUse`] when other work started on the GPUs
    /// while they ran.
    fn end_look(&mut self) -> Result<(), CheckError>;
}

/// How a rank meets the other and shares its GPUs.
pub struct PairRun {
    /// The rendezvous; its timeout also bounds the barrier and the communicator's set-up.
    pub config: Config,
    /// Measure beside other work on this node's GPUs (`--shared-gpus`).
    pub shared_gpus: bool,
}

/// What a rank ends with: its document, and why the ranks did not meet when they did not
/// (the document says it too).
pub struct PairEnd {
    pub doc: NodePairResult,
    pub unmet: Option<RendezvousError>,
}

/// Called with the not-measured document when the other rank met this one but never joined
/// the communicator: the set-up cannot be aborted, so it is to write the document and end
/// the process.
pub type Stuck = Box<dyn FnOnce(NodePairResult) + Send>;

/// Runs one rank of a node pair on `backend` (see the module doc). `startedAt` and
/// `durationS` are the real time of the call; a panic while measuring is an error, never
/// the process's end.
pub fn run(
    backend: &mut dyn PairBackend,
    opts: &PairOptions,
    pair: &PairRun,
    stuck: Stuck,
    progress: Progress,
) -> Result<PairEnd, CheckError> {
    let started = Instant::now();
    let started_at = gpufabric_api::rfc3339::now();
    let _span = tracing::info_span!("node_pair", group = %opts.group, rank = opts.rank).entered();
    crate::activity::enter("node pair: preparing the GPUs");
    backend.prepare(pair.shared_gpus, progress)?;
    let config = &pair.config;
    crate::activity::enter(format!("node pair: rendezvous at {}", config.addr));
    progress(&format!(
        "node-pair {} <-> {} (group {}, rank {}): rendezvous at {}",
        opts.nodes[0], opts.nodes[1], opts.group, opts.rank, config.addr
    ));
    let met = if opts.rank == 0 {
        let id = backend.make_id()?;
        rendezvous::serve(config, &id).map(|group| (group, id))
    } else {
        rendezvous::join(config)
    };
    let mut doc = document(opts, backend.kind(), started_at);
    let (mut group, id) = match met {
        Ok(m) => m,
        Err(e) => {
            doc.not_measured = Some(NotMeasured {
                peer: Some(opts.peer().to_string()),
                message: e.to_string(),
            });
            doc.duration_s = started.elapsed().as_secs_f64();
            return Ok(PairEnd {
                doc,
                unmet: Some(e),
            });
        }
    };
    let again = backend.look_again(pair.shared_gpus);
    if let Err(CheckError::GpusInUse(message)) = again {
        doc.not_measured = Some(NotMeasured::own_node(message));
    } else {
        again?;
        let joined = Arc::new(AtomicBool::new(false));
        let gone = peer_gone(opts, &doc, config.timeout);
        let _watch = watch_init(joined.clone(), config.timeout, move || {
            let mut gone = gone;
            gone.duration_s = started.elapsed().as_secs_f64();
            stuck(gone)
        });
        let mut barrier = || group.barrier(config.timeout);
        let met = Met {
            opts,
            id: &id,
            joined: &joined,
            barrier: &mut barrier,
            progress,
        };
        crate::activity::enter("node pair: measuring across both nodes (NCCL)");
        let measured = measure(backend, pair.shared_gpus, met, &mut doc);
        // The watch stands down whatever the measurement's end.
        joined.store(true, Ordering::SeqCst);
        measured?;
    }
    crate::activity::enter("node pair: waiting for the peer to finish");
    if let Err(e) = group.barrier(config.timeout) {
        doc.errors.push(PhaseError {
            phase: Phase::NodePair,
            kind: ErrorKind::Failed,
            message: e.to_string(),
        });
    }
    doc.duration_s = started.elapsed().as_secs_f64();
    Ok(PairEnd { doc, unmet: None })
}

/// The document of a rank whose peer met it but never joined the communicator.
fn peer_gone(opts: &PairOptions, doc: &NodePairResult, timeout: Duration) -> NodePairResult {
    let mut gone = doc.clone();
    gone.not_measured = Some(NotMeasured {
        peer: Some(opts.peer().to_string()),
        message: format!(
            "{} met the rendezvous but did not join NCCL's communicator within {}s \
             (its agent died, or NCCL cannot reach it on the network)",
            opts.peer(),
            timeout.as_secs()
        ),
    });
    gone
}

/// The measurements, a panic among them an error, and the look at the GPUs after them.
fn measure(
    backend: &mut dyn PairBackend,
    shared_gpus: bool,
    mut met: Met,
    doc: &mut NodePairResult,
) -> Result<(), CheckError> {
    let measured = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        backend.measure(&mut met, doc)
    }));
    match measured {
        Ok(r) => r?,
        Err(p) => {
            return Err(CheckError::Other(crate::node_check::panic_message(
                p.as_ref(),
            )));
        }
    }
    // A collective that timed out leaves a thread holding this rank's own memory.
    if !(shared_gpus || crate::gpu_use::timed_out(&doc.errors))
        && let Err(CheckError::GpusInUse(message)) = backend.end_look()
    {
        doc.not_measured = Some(NotMeasured::own_node(message));
    }
    Ok(())
}

/// The document of rank `opts.rank` with nothing measured yet.
pub(crate) fn document(opts: &PairOptions, backend: Backend, started_at: String) -> NodePairResult {
    NodePairResult {
        schema: PAIR_SCHEMA.into(),
        group: opts.group.clone(),
        nodes: opts.nodes.clone(),
        rank: opts.rank,
        backend,
        started_at,
        duration_s: 0.0,
        gpus_per_node: 0,
        collectives: Vec::new(),
        transport: None,
        nics_used: 0,
        nics: Vec::new(),
        not_measured: None,
        errors: Vec::new(),
    }
}

/// Watches the communicator's set-up from a thread: when `joined` is not set within
/// `timeout`, calls `expire` (NCCL's `ncclCommInitRank` blocks for ever on a peer that died
/// after the rendezvous, and cannot be aborted). The thread ends on its own once `joined`
/// is set.
fn watch_init(
    joined: Arc<AtomicBool>,
    timeout: Duration,
    expire: impl FnOnce() + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let deadline = Instant::now() + timeout;
        while !joined.load(Ordering::SeqCst) {
            let now = Instant::now();
            if now >= deadline {
                expire();
                return;
            }
            std::thread::sleep((deadline - now).min(Duration::from_millis(50)));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn the_init_watch_expires_when_the_communicator_never_forms() {
        let (tx, rx) = mpsc::channel();
        let joined = Arc::new(AtomicBool::new(false));
        let t = watch_init(joined, Duration::from_millis(100), move || {
            let _ = tx.send(());
        });
        assert!(rx.recv_timeout(Duration::from_secs(10)).is_ok(), "expired");
        t.join().expect("the watch ends");
    }

    #[test]
    fn the_init_watch_stands_down_once_joined() {
        let (tx, rx) = mpsc::channel::<()>();
        let joined = Arc::new(AtomicBool::new(false));
        let t = watch_init(joined.clone(), Duration::from_millis(300), move || {
            let _ = tx.send(());
        });
        joined.store(true, Ordering::SeqCst);
        t.join().expect("the watch ends");
        // The watch has ended without expiring: the sender is dropped unused.
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(1)),
            Err(mpsc::RecvTimeoutError::Disconnected)
        );
    }
}
