//! Rendezvous of the ranks of a node pair or group over TCP, without Kubernetes credentials:
//! rank 0 serves the NCCL unique id to the ranks that prove they hold the run's secret, and
//! the open connections then carry barriers and small all-gathers.
//!
//! # Protocol
//! Rank 0 listens; every other rank connects, retrying with backoff until the deadline, so
//! the ranks may start in any order. On each connection:
//! 1. rank 0 sends `MAGIC`, a version byte and a fresh 32-byte nonce;
//! 2. the rank answers with `MAGIC`, the version, its rank, its own nonce and
//!    `HMAC-SHA256(secret, "hello" | group | ranks | rank 0's nonce | its nonce | rank)`;
//!    rank 0 checks the tag in constant time and drops a connection whose tag, rank or
//!    version is wrong (a stranger never counts as an arrival);
//! 3. once every rank has arrived, rank 0 sends each a status byte, the 128-byte id and
//!    `HMAC(secret, "id" | group | ranks | the rank's nonce | rank | id)`, so the rank knows
//!    the id came from a holder of the secret. If the deadline passes first, rank 0 sends
//!    the ranks that did arrive an authenticated abort naming the missing ranks, and every
//!    rank returns an error naming them.
//!
//! The group name (e.g. `run/round/pair`) is bound into every tag, so the secret of one run
//! does not admit a rank of one pair into another pair's group.

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Size of an NCCL unique id (`NCCL_UNIQUE_ID_BYTES`).
pub const ID_BYTES: usize = 128;
/// Largest payload one rank may contribute to [`Group::all_gather`].
pub const MAX_GATHER_BYTES: usize = 64 * 1024;

const MAGIC: &[u8; 4] = b"GFRZ";
const VERSION: u8 = 1;
const NONCE: usize = 32;
const TAG: usize = 32;
const STATUS_OK: u8 = 0;
const STATUS_ABORT: u8 = 1;
/// How long rank 0 gives a fresh connection to send its hello before dropping it.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest pause between two connection attempts of a joining rank.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The run-scoped secret the ranks share (at least 16 bytes). Its `Debug` never shows it.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

impl Secret {
    /// Fewest bytes a secret may have.
    pub const MIN_BYTES: usize = 16;

    /// 32 random bytes from the operating system.
    pub fn generate() -> Result<Secret, RendezvousError> {
        let mut bytes = vec![0u8; 32];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| RendezvousError::Config("the system random source failed".into()))?;
        Ok(Secret(bytes))
    }

    /// A secret written as hex (what the operator passes to the pods).
    pub fn from_hex(text: &str) -> Result<Secret, RendezvousError> {
        let text = text.trim();
        let bad = || {
            RendezvousError::Config(format!(
                "the rendezvous secret must be at least {} hex digits (0-9, a-f), got {} characters",
                2 * Secret::MIN_BYTES,
                text.len()
            ))
        };
        if !text.len().is_multiple_of(2) || text.len() < 2 * Secret::MIN_BYTES {
            return Err(bad());
        }
        let bytes = (0..text.len())
            .step_by(2)
            .map(|i| {
                text.get(i..i + 2)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
            })
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(bad)?;
        Ok(Secret(bytes))
    }

    /// The secret as lowercase hex.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn key(&self) -> hmac::Key {
        hmac::Key::new(hmac::HMAC_SHA256, &self.0)
    }
}

/// An id of random bytes, for a backend without NCCL (the sim), so that its ranks make the
/// same exchange a real pair makes.
pub fn random_id() -> Result<[u8; ID_BYTES], RendezvousError> {
    let mut id = [0u8; ID_BYTES];
    SystemRandom::new()
        .fill(&mut id)
        .map_err(|_| RendezvousError::Config("the system random source failed".into()))?;
    Ok(id)
}

/// Who takes part in a rendezvous and how long it may take.
#[derive(Debug, Clone)]
pub struct Config {
    /// Name of the group, the same on every rank (bound into every tag).
    pub group: String,
    /// This process's rank, 0 serves.
    pub rank: u32,
    /// Node (or pod) name of each rank, by rank; its length is the group size.
    pub names: Vec<String>,
    /// Where rank 0 listens (rank 0 binds it; the others connect to it).
    pub addr: String,
    pub secret: Secret,
    /// The whole rendezvous (connect, wait for every rank, receive the id) ends by then.
    pub timeout: Duration,
}

impl Config {
    /// Group size.
    pub fn ranks(&self) -> u32 {
        u32::try_from(self.names.len()).unwrap_or(u32::MAX)
    }

    /// `rank N (node X)`, for messages.
    pub fn who(&self, rank: u32) -> String {
        match self.names.get(rank as usize) {
            Some(name) => format!("rank {rank} ({name})"),
            None => format!("rank {rank}"),
        }
    }

    fn check(&self) -> Result<(), RendezvousError> {
        if self.names.len() < 2 {
            return Err(RendezvousError::Config(format!(
                "a group needs at least 2 ranks, {} named",
                self.names.len()
            )));
        }
        if self.rank >= self.ranks() {
            return Err(RendezvousError::Config(format!(
                "rank {} is outside a group of {} ranks",
                self.rank,
                self.ranks()
            )));
        }
        if self.group.is_empty() {
            return Err(RendezvousError::Config("the group name is empty".into()));
        }
        Ok(())
    }
}

/// Why a rendezvous or a collective step over it failed. Each message names the rank (and
/// node) at fault and the time it was given.
#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    #[error("invalid rendezvous settings: {0}")]
    Config(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    #[error("{} did not join the rendezvous at {addr} within {} s{}", missing.join(", "), secs(*waited), refused_note(*refused))]
    Missing {
        missing: Vec<String>,
        addr: String,
        waited: Duration,
        /// Connections dropped for a wrong secret, group or rank.
        refused: u32,
    },
    #[error("could not reach {server} at {addr} within {} s: {last}", secs(*waited))]
    Unreachable {
        server: String,
        addr: String,
        waited: Duration,
        last: String,
    },
    #[error(
        "{server} at {addr} closed the connection during the handshake: the secret or group differs, or this rank is not expected"
    )]
    Rejected { server: String, addr: String },
    #[error(
        "{server} at {addr} answered without the run's secret (not a gpufabric rank 0 of this group)"
    )]
    Unauthenticated { server: String, addr: String },
    #[error("{server} gave up: {message}")]
    Aborted { server: String, message: String },
    #[error("{step} on group {group}: {} did not arrive within {} s ({detail})", who.join(", "), secs(*waited))]
    Step {
        step: &'static str,
        group: String,
        who: Vec<String>,
        waited: Duration,
        detail: String,
    },
    #[error("{0}")]
    Protocol(String),
}

fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 10.0 {
        format!("{s:.0}")
    } else {
        format!("{s:.1}")
    }
}

fn refused_note(refused: u32) -> String {
    if refused == 0 {
        String::new()
    } else {
        format!("; {refused} connection(s) were refused for a wrong secret, group or rank")
    }
}

/// The ranks of a group after a successful rendezvous: rank 0 holds a connection to every
/// other rank, each other rank one to rank 0.
#[derive(Debug)]
pub struct Group {
    config: Config,
    /// Rank 0: the connection of rank r at index r - 1. Other ranks: one connection.
    links: Vec<TcpStream>,
    steps: u8,
}

/// Rank 0: binds `config.addr`, then serves `id` (see [`serve_on`]).
pub fn serve(config: &Config, id: &[u8; ID_BYTES]) -> Result<Group, RendezvousError> {
    config.check()?;
    let listener = TcpListener::bind(&config.addr).map_err(|source| RendezvousError::Listen {
        addr: config.addr.clone(),
        source,
    })?;
    serve_on(listener, config, id)
}

/// Rank 0 on a bound listener: admits each other rank that presents the secret, and once
/// all have arrived gives them `id`. Ends by `config.timeout` with [`RendezvousError::Missing`]
/// naming the ranks that never came (and tells those that did).
pub fn serve_on(
    listener: TcpListener,
    config: &Config,
    id: &[u8; ID_BYTES],
) -> Result<Group, RendezvousError> {
    config.check()?;
    if config.rank != 0 {
        return Err(RendezvousError::Config(format!(
            "only rank 0 serves the rendezvous, this is rank {}",
            config.rank
        )));
    }
    let start = Instant::now();
    let deadline = start + config.timeout;
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| config.addr.clone());
    listener
        .set_nonblocking(true)
        .map_err(|e| RendezvousError::Protocol(format!("listener on {addr}: {e}")))?;
    let (tx, rx) = mpsc::channel::<Result<Arrival, String>>();
    let mut arrived: Vec<Option<Arrival>> = (1..config.ranks()).map(|_| None).collect();
    let mut refused = 0u32;
    let random = SystemRandom::new();
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                let mut nonce = [0u8; NONCE];
                random
                    .fill(&mut nonce)
                    .map_err(|_| RendezvousError::Config("the random source failed".into()))?;
                let (tx, config) = (tx.clone(), config.clone());
                std::thread::spawn(move || {
                    let result = admit(stream, peer, &config, nonce);
                    let _ = tx.send(result);
                });
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => tracing::debug!(error = %e, "accept failed"),
        }
        while let Ok(result) = rx.try_recv() {
            match result {
                Ok(arrival) => {
                    let index = arrival.rank as usize - 1;
                    if let Some(slot) = arrived.get_mut(index) {
                        // A rank that connects again (its first connection broke) replaces it.
                        *slot = Some(arrival);
                    }
                }
                Err(why) => {
                    refused += 1;
                    tracing::warn!("rendezvous {}: refused a connection: {why}", config.group);
                }
            }
        }
        if arrived.iter().all(Option::is_some) {
            break;
        }
        if Instant::now() >= deadline {
            let missing: Vec<String> = arrived
                .iter()
                .enumerate()
                .filter(|(_, a)| a.is_none())
                .map(|(i, _)| config.who(i as u32 + 1))
                .collect();
            let err = RendezvousError::Missing {
                missing,
                addr,
                waited: start.elapsed(),
                refused,
            };
            let message = err.to_string();
            for arrival in arrived.into_iter().flatten() {
                let _ = arrival.finish(config, Reply::Abort(&message));
            }
            return Err(err);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut links = Vec::with_capacity(arrived.len());
    for arrival in arrived.into_iter().flatten() {
        let rank = arrival.rank;
        let stream = arrival.finish(config, Reply::Id(id)).map_err(|e| {
            RendezvousError::Protocol(format!("sending the id to {}: {e}", config.who(rank)))
        })?;
        links.push(stream);
    }
    Ok(Group {
        config: config.clone(),
        links,
        steps: 0,
    })
}

/// A rank that presented a valid hello.
struct Arrival {
    rank: u32,
    nonce: [u8; NONCE],
    stream: TcpStream,
}

enum Reply<'a> {
    Id(&'a [u8; ID_BYTES]),
    Abort(&'a str),
}

impl Arrival {
    fn finish(mut self, config: &Config, reply: Reply<'_>) -> std::io::Result<TcpStream> {
        let key = config.secret.key();
        let mut out = Vec::with_capacity(1 + ID_BYTES + TAG);
        match reply {
            Reply::Id(id) => {
                out.push(STATUS_OK);
                out.extend_from_slice(id);
                let tag = hmac::sign(&key, &id_message(config, &self.nonce, self.rank, id));
                out.extend_from_slice(tag.as_ref());
            }
            Reply::Abort(message) => {
                let text = &message.as_bytes()[..message.len().min(u16::MAX as usize)];
                out.push(STATUS_ABORT);
                out.extend_from_slice(&(text.len() as u16).to_be_bytes());
                out.extend_from_slice(text);
                let tag = hmac::sign(&key, &abort_message(config, &self.nonce, self.rank, text));
                out.extend_from_slice(tag.as_ref());
            }
        }
        self.stream.set_write_timeout(Some(HELLO_TIMEOUT))?;
        self.stream.write_all(&out)?;
        self.stream.set_write_timeout(None)?;
        Ok(self.stream)
    }
}

/// Rank 0's side of one connection: send the challenge, check the answer.
fn admit(
    mut stream: TcpStream,
    peer: SocketAddr,
    config: &Config,
    nonce: [u8; NONCE],
) -> Result<Arrival, String> {
    let fail = |what: &str| format!("from {peer}: {what}");
    stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_nodelay(true))
        .and_then(|()| stream.set_read_timeout(Some(HELLO_TIMEOUT)))
        .and_then(|()| stream.set_write_timeout(Some(HELLO_TIMEOUT)))
        .map_err(|e| fail(&e.to_string()))?;
    let mut challenge = Vec::with_capacity(MAGIC.len() + 1 + NONCE);
    challenge.extend_from_slice(MAGIC);
    challenge.push(VERSION);
    challenge.extend_from_slice(&nonce);
    stream
        .write_all(&challenge)
        .map_err(|e| fail(&format!("sending the challenge: {e}")))?;
    let mut hello = [0u8; 4 + 1 + 4 + NONCE + TAG];
    stream
        .read_exact(&mut hello)
        .map_err(|e| fail(&format!("no complete hello ({e})")))?;
    if &hello[..4] != MAGIC {
        return Err(fail("not a gpufabric rendezvous hello"));
    }
    if hello[4] != VERSION {
        return Err(fail(&format!(
            "protocol version {}, this rank 0 speaks {VERSION}",
            hello[4]
        )));
    }
    let rank = u32::from_be_bytes([hello[5], hello[6], hello[7], hello[8]]);
    let mut their_nonce = [0u8; NONCE];
    their_nonce.copy_from_slice(&hello[9..9 + NONCE]);
    let tag = &hello[9 + NONCE..];
    let message = hello_message(config, &nonce, &their_nonce, rank);
    hmac::verify(&config.secret.key(), &message, tag).map_err(|_| fail("wrong secret or group"))?;
    if rank == 0 || rank >= config.ranks() {
        return Err(fail(&format!(
            "rank {rank} is not a joining rank of a group of {}",
            config.ranks()
        )));
    }
    stream
        .set_read_timeout(None)
        .and_then(|()| stream.set_write_timeout(None))
        .map_err(|e| fail(&e.to_string()))?;
    Ok(Arrival {
        rank,
        nonce: their_nonce,
        stream,
    })
}

/// Any rank but 0: connects to rank 0 (retrying until the deadline), proves the secret,
/// and receives the id.
pub fn join(config: &Config) -> Result<(Group, [u8; ID_BYTES]), RendezvousError> {
    config.check()?;
    if config.rank == 0 {
        return Err(RendezvousError::Config(
            "rank 0 serves the rendezvous; it does not join".into(),
        ));
    }
    let start = Instant::now();
    let deadline = start + config.timeout;
    let server = config.who(0);
    let mut stream = connect(config, start, deadline)?;
    let addr = config.addr.clone();
    let io = |what: &str, e: std::io::Error| match e.kind() {
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => {
            RendezvousError::Rejected {
                server: server.clone(),
                addr: addr.clone(),
            }
        }
        ErrorKind::WouldBlock | ErrorKind::TimedOut => RendezvousError::Step {
            step: "rendezvous",
            group: config.group.clone(),
            who: vec![server.clone()],
            waited: start.elapsed(),
            detail: format!("connected, but no {what} came"),
        },
        _ => RendezvousError::Protocol(format!("{what} from {server} at {addr}: {e}")),
    };
    set_deadline(&stream, deadline).map_err(|e| io("challenge", e))?;
    let mut challenge = [0u8; 4 + 1 + NONCE];
    stream
        .read_exact(&mut challenge)
        .map_err(|e| io("challenge", e))?;
    if &challenge[..4] != MAGIC || challenge[4] != VERSION {
        return Err(RendezvousError::Protocol(format!(
            "{server} at {addr} is not a gpufabric rendezvous (version {VERSION})"
        )));
    }
    let mut server_nonce = [0u8; NONCE];
    server_nonce.copy_from_slice(&challenge[5..]);
    let mut nonce = [0u8; NONCE];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| RendezvousError::Config("the random source failed".into()))?;
    let key = config.secret.key();
    let tag = hmac::sign(
        &key,
        &hello_message(config, &server_nonce, &nonce, config.rank),
    );
    let mut hello = Vec::with_capacity(4 + 1 + 4 + NONCE + TAG);
    hello.extend_from_slice(MAGIC);
    hello.push(VERSION);
    hello.extend_from_slice(&config.rank.to_be_bytes());
    hello.extend_from_slice(&nonce);
    hello.extend_from_slice(tag.as_ref());
    stream.write_all(&hello).map_err(|e| io("hello", e))?;
    // Rank 0 answers once every rank has arrived, or at its own deadline; allow a little
    // beyond ours for its abort to arrive.
    set_deadline(&stream, deadline + Duration::from_secs(2)).map_err(|e| io("reply", e))?;
    let mut status = [0u8; 1];
    stream.read_exact(&mut status).map_err(|e| io("reply", e))?;
    let unauthenticated = || RendezvousError::Unauthenticated {
        server: server.clone(),
        addr: addr.clone(),
    };
    match status[0] {
        STATUS_OK => {
            let mut id = [0u8; ID_BYTES];
            let mut tag = [0u8; TAG];
            stream.read_exact(&mut id).map_err(|e| io("id", e))?;
            stream.read_exact(&mut tag).map_err(|e| io("id", e))?;
            hmac::verify(&key, &id_message(config, &nonce, config.rank, &id), &tag)
                .map_err(|_| unauthenticated())?;
            clear_timeouts(&stream).map_err(|e| io("id", e))?;
            let group = Group {
                config: config.clone(),
                links: vec![stream],
                steps: 0,
            };
            Ok((group, id))
        }
        STATUS_ABORT => {
            let mut len = [0u8; 2];
            stream.read_exact(&mut len).map_err(|e| io("abort", e))?;
            let mut text = vec![0u8; u16::from_be_bytes(len) as usize];
            let mut tag = [0u8; TAG];
            stream.read_exact(&mut text).map_err(|e| io("abort", e))?;
            stream.read_exact(&mut tag).map_err(|e| io("abort", e))?;
            hmac::verify(
                &key,
                &abort_message(config, &nonce, config.rank, &text),
                &tag,
            )
            .map_err(|_| unauthenticated())?;
            Err(RendezvousError::Aborted {
                server,
                message: String::from_utf8_lossy(&text).into_owned(),
            })
        }
        other => Err(RendezvousError::Protocol(format!(
            "{server} at {addr} sent status {other}, expected 0 or 1"
        ))),
    }
}

/// Connects to rank 0, retrying refused or unreachable attempts with a doubling pause
/// (10 ms up to [`MAX_BACKOFF`]) until the deadline.
fn connect(
    config: &Config,
    start: Instant,
    deadline: Instant,
) -> Result<TcpStream, RendezvousError> {
    let mut pause = Duration::from_millis(10);
    let mut last = String::from("no attempt");
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(RendezvousError::Unreachable {
                server: config.who(0),
                addr: config.addr.clone(),
                waited: start.elapsed(),
                last,
            });
        }
        let left = deadline - now;
        match resolve(&config.addr) {
            Ok(addr) => match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Err(e) => last = e.to_string(),
            },
            Err(e) => last = e,
        }
        let now = Instant::now();
        if now >= deadline {
            continue;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(MAX_BACKOFF);
    }
}

fn resolve(addr: &str) -> Result<SocketAddr, String> {
    addr.to_socket_addrs()
        .map_err(|e| format!("resolving {addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr} resolves to no address"))
}

fn set_deadline(stream: &TcpStream, deadline: Instant) -> std::io::Result<()> {
    // A zero timeout means "none" to the socket API; wait at least a millisecond.
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    stream.set_read_timeout(Some(left))?;
    stream.set_write_timeout(Some(left))
}

fn clear_timeouts(stream: &TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)
}

fn context(label: &str, config: &Config) -> Vec<u8> {
    let mut m = Vec::with_capacity(label.len() + config.group.len() + 16);
    m.extend_from_slice(label.as_bytes());
    m.push(0);
    m.extend_from_slice(&(config.group.len() as u32).to_be_bytes());
    m.extend_from_slice(config.group.as_bytes());
    m.extend_from_slice(&config.ranks().to_be_bytes());
    m
}

fn hello_message(
    config: &Config,
    server: &[u8; NONCE],
    client: &[u8; NONCE],
    rank: u32,
) -> Vec<u8> {
    let mut m = context("hello", config);
    m.extend_from_slice(server);
    m.extend_from_slice(client);
    m.extend_from_slice(&rank.to_be_bytes());
    m
}

fn id_message(config: &Config, client: &[u8; NONCE], rank: u32, id: &[u8; ID_BYTES]) -> Vec<u8> {
    let mut m = context("id", config);
    m.extend_from_slice(client);
    m.extend_from_slice(&rank.to_be_bytes());
    m.extend_from_slice(id);
    m
}

fn abort_message(config: &Config, client: &[u8; NONCE], rank: u32, text: &[u8]) -> Vec<u8> {
    let mut m = context("abort", config);
    m.extend_from_slice(client);
    m.extend_from_slice(&rank.to_be_bytes());
    m.extend_from_slice(text);
    m
}

impl Group {
    /// This rank.
    pub fn rank(&self) -> u32 {
        self.config.rank
    }

    /// Group size.
    pub fn ranks(&self) -> u32 {
        self.config.ranks()
    }

    /// Returns once every rank has called it, or fails naming the ranks that did not arrive
    /// within `timeout`.
    pub fn barrier(&mut self, timeout: Duration) -> Result<(), RendezvousError> {
        self.step("barrier", &[], timeout).map(|_| ())
    }

    /// Every rank contributes up to [`MAX_GATHER_BYTES`] bytes; every rank receives all
    /// contributions, by rank. Fails naming the ranks that did not contribute in time.
    pub fn all_gather(
        &mut self,
        data: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, RendezvousError> {
        if data.len() > MAX_GATHER_BYTES {
            return Err(RendezvousError::Config(format!(
                "all_gather takes at most {MAX_GATHER_BYTES} bytes per rank, got {}",
                data.len()
            )));
        }
        self.step("all_gather", data, timeout)
    }

    fn step(
        &mut self,
        step: &'static str,
        data: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, RendezvousError> {
        let start = Instant::now();
        let deadline = start + timeout;
        self.steps = self.steps.wrapping_add(1);
        let seq = self.steps;
        let failed = |who: Vec<String>, detail: String| RendezvousError::Step {
            step,
            group: self.config.group.clone(),
            who,
            waited: start.elapsed(),
            detail,
        };
        if self.config.rank == 0 {
            let mut all = vec![data.to_vec()];
            for (i, link) in self.links.iter_mut().enumerate() {
                let rank = i as u32 + 1;
                let got = set_deadline(link, deadline).and_then(|()| read_frame(link, seq));
                match got {
                    Ok(bytes) => all.push(bytes),
                    Err(e) => return Err(failed(vec![self.config.who(rank)], e.to_string())),
                }
            }
            let reply = encode_all(seq, &all);
            for (i, link) in self.links.iter_mut().enumerate() {
                link.write_all(&reply).map_err(|e| {
                    failed(vec![self.config.who(i as u32 + 1)], format!("sending: {e}"))
                })?;
            }
            Ok(all)
        } else {
            let server = self.config.who(0);
            let link = self
                .links
                .first_mut()
                .ok_or_else(|| RendezvousError::Protocol("group has no connection".into()))?;
            set_deadline(link, deadline)
                .and_then(|()| write_frame(link, seq, data))
                .and_then(|()| read_all(link, seq))
                .map_err(|e| failed(vec![server], e.to_string()))
        }
    }
}

fn write_frame(link: &mut TcpStream, seq: u8, data: &[u8]) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(5 + data.len());
    out.push(seq);
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    link.write_all(&out)
}

fn read_frame(link: &mut TcpStream, seq: u8) -> std::io::Result<Vec<u8>> {
    let mut head = [0u8; 5];
    link.read_exact(&mut head)?;
    if head[0] != seq {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            format!("step {} arrived while waiting for step {seq}", head[0]),
        ));
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_GATHER_BYTES {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            format!("a contribution of {len} bytes is over {MAX_GATHER_BYTES}"),
        ));
    }
    let mut data = vec![0u8; len];
    link.read_exact(&mut data)?;
    Ok(data)
}

fn encode_all(seq: u8, all: &[Vec<u8>]) -> Vec<u8> {
    let mut out = vec![seq];
    out.extend_from_slice(&(all.len() as u32).to_be_bytes());
    for part in all {
        out.extend_from_slice(&(part.len() as u32).to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

fn read_all(link: &mut TcpStream, seq: u8) -> std::io::Result<Vec<Vec<u8>>> {
    let mut head = [0u8; 5];
    link.read_exact(&mut head)?;
    if head[0] != seq {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            format!("step {} arrived while waiting for step {seq}", head[0]),
        ));
    }
    let count = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if count > 4096 {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            format!("{count} contributions is more than a group has"),
        ));
    }
    let mut all = Vec::with_capacity(count);
    for _ in 0..count {
        let mut len = [0u8; 4];
        link.read_exact(&mut len)?;
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_GATHER_BYTES {
            return Err(std::io::Error::new(
                ErrorKind::InvalidData,
                format!("a contribution of {len} bytes is over {MAX_GATHER_BYTES}"),
            ));
        }
        let mut data = vec![0u8; len];
        link.read_exact(&mut data)?;
        all.push(data);
    }
    Ok(all)
}

#[cfg(test)]
mod tests;
