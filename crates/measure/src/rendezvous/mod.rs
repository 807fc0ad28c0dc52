//! Rendezvous of the ranks of a node pair or group over TCP, without Kubernetes credentials:
//! rank 0 serves the NCCL unique id to the ranks that prove they hold the run's secret, and
//! the open connections then carry barriers and small all-gathers.
//!
//! # Protocol (version 2)
//! Rank 0 listens; every other rank connects, retrying with backoff until the deadline, so
//! the ranks may start in any order. On each connection:
//! 1. rank 0 sends `MAGIC`, the version byte and a fresh 32-byte nonce;
//! 2. the rank answers with `MAGIC`, the version, its rank, its own nonce and
//!    `HMAC-SHA256(secret, "hello" | group | ranks | version | rank 0's nonce | its nonce |
//!    rank)`; rank 0 checks the tag in constant time. A hello with a wrong tag, rank or
//!    version is answered with a one-byte refusal code and the connection closed (a
//!    stranger never counts as an arrival); either side names a version it does not speak;
//! 3. from then on every frame in either direction is sealed (`session`): ChaCha20-Poly1305
//!    under a key per direction derived by HKDF from the secret and both nonces, numbered
//!    so that a frame replayed, dropped, reordered or altered is refused by name. Once every
//!    rank has arrived rank 0 sends each the id in such a frame: the id never crosses the
//!    network in clear, and only a holder of the secret can have sent it. If the deadline
//!    passes first, rank 0 sends the ranks that did arrive a sealed abort naming the missing
//!    ranks, and every rank returns an error naming them.
//!
//! The group name (e.g. `run/round/pair`) is bound into every tag and key, so the secret of
//! one run does not admit a rank of one pair into another pair's group.
//!
//! Rank 0 runs every handshake on its own thread, at most [`gate`]'s number of them at once
//! (a connection beyond them pushes out the oldest handshake, whose rank connects again),
//! each for at most five seconds; every connection turned away is counted by a typed
//! [`RefusalKind`], reported in [`RendezvousError::Missing`] and logged.
//!
//! Rank 0's side is in `serve` and its door in `gate`, the other ranks' in `join`, the
//! sealed frames in `session`, the steps over an established group in `group`, and the
//! bytes on the wire in `wire`.

mod gate;
mod group;
mod join;
mod serve;
mod session;
mod wire;

pub use gate::{RefusalKind, Refusals};
pub(crate) use group::Group;
pub(crate) use join::join;
pub(crate) use serve::serve;
#[cfg(test)]
use serve::serve_on;
pub use session::FrameError;
pub use wire::Kind as FrameKind;

use gpufabric_api::group::GroupHeader;
use gpufabric_api::result::Backend;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use std::time::Duration;

/// Size of an NCCL unique id (`NCCL_UNIQUE_ID_BYTES`).
pub const ID_BYTES: usize = 128;
/// Size of each side's handshake nonce.
pub(crate) const NONCE: usize = 32;
/// Largest payload one rank may contribute to [`Group::all_gather`].
pub(crate) const MAX_GATHER_BYTES: usize = 64 * 1024;

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

    /// 32 random bytes from the operating system. The operator makes the run's secret; this
    /// one is for the tests of the exchange.
    #[cfg(test)]
    pub(crate) fn generate() -> Result<Secret, RendezvousError> {
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

    /// The secret as lowercase hex (what [`Secret::from_hex`] reads).
    #[cfg(test)]
    pub(crate) fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn bytes(&self) -> &[u8] {
        &self.0
    }

    fn key(&self) -> hmac::Key {
        hmac::Key::new(hmac::HMAC_SHA256, &self.0)
    }
}

/// An id of random bytes, for a backend without NCCL (the sim), so that its ranks make the
/// same exchange a real pair makes.
pub(crate) fn random_id() -> Result<[u8; ID_BYTES], RendezvousError> {
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
    /// The header of the document this rank writes under `schema`, as its test starts.
    pub fn header(&self, schema: &str, backend: Backend, started_at: String) -> GroupHeader {
        GroupHeader::new(
            schema,
            self.group.clone(),
            self.names.clone(),
            self.rank,
            backend,
            started_at,
        )
    }

    /// Group size.
    pub(crate) fn ranks(&self) -> u32 {
        u32::try_from(self.names.len()).unwrap_or(u32::MAX)
    }

    /// `rank N (node X)`, for messages.
    pub(crate) fn who(&self, rank: u32) -> String {
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
    #[error("{} did not join the rendezvous at {addr} within {} s{}", missing.join(", "), secs(*waited), refused_note(refused))]
    Missing {
        missing: Vec<String>,
        addr: String,
        waited: Duration,
        /// Connections rank 0 turned away meanwhile, by reason.
        refused: Refusals,
    },
    #[error("could not reach {server} at {addr} within {} s: {last}", secs(*waited))]
    Unreachable {
        server: String,
        addr: String,
        waited: Duration,
        last: String,
    },
    #[error(
        "{server} at {addr} refused this rank: {}; every rank of a group needs the run's secret, the same group and size, and the same agent version",
        why.map_or_else(|| "for a reason it did not name".to_string(), |w| w.to_string())
    )]
    Rejected {
        server: String,
        addr: String,
        why: Option<RefusalKind>,
    },
    #[error(
        "{server} at {addr} speaks rendezvous protocol version {theirs}, this agent speaks {}: run the same agent image on every node of a run",
        wire::VERSION
    )]
    Version {
        server: String,
        addr: String,
        theirs: u8,
    },
    #[error(
        "{server} at {addr} answered without the run's secret (not a gpufabric rank 0 of this group): {why}"
    )]
    Unauthenticated {
        server: String,
        addr: String,
        why: FrameError,
    },
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
    #[error("{step} on group {group}: refused a frame from {from}: {why}")]
    Frame {
        step: &'static str,
        group: String,
        from: String,
        why: FrameError,
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

fn refused_note(refused: &Refusals) -> String {
    if refused.total() == 0 {
        String::new()
    } else {
        format!(
            "; {} connection(s) were refused: {refused}",
            refused.total()
        )
    }
}

#[cfg(test)]
mod tests;
