//! The bytes on the wire: the handshake's constants and HMAC messages, the kinds and head
//! of a sealed frame, the refusal rank 0 sends before it hangs up, and socket deadlines.

use super::{Config, NONCE};
use std::net::TcpStream;
use std::time::{Duration, Instant};

pub(super) const MAGIC: &[u8; 4] = b"GFRZ";
/// The protocol this build speaks. Version 1 sent the id in clear and the group steps
/// unauthenticated; a rank of another version is refused with a message naming both.
pub(super) const VERSION: u8 = 2;
/// Length of the HMAC-SHA256 tag of a hello.
pub(super) const TAG: usize = 32;
/// Rank 0's challenge: `MAGIC`, version, its nonce.
pub(super) const CHALLENGE_LEN: usize = MAGIC.len() + 1 + NONCE;
/// A joining rank's hello: `MAGIC`, version, rank, its nonce, the tag.
pub(super) const HELLO_LEN: usize = MAGIC.len() + 1 + 4 + NONCE + TAG;
/// How long rank 0 gives a fresh connection to complete its hello before dropping it.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Head of a sealed frame: kind, sequence number (u64), length of the sealed body (u32).
pub(super) const HEAD_LEN: usize = 1 + 8 + 4;
/// First byte of rank 0's answer to a hello it refuses (in clear: the peer may not hold
/// the secret), followed by one [`super::RefusalKind`] code; then rank 0 hangs up.
pub(super) const REFUSED: u8 = 0xFF;
/// Most bytes of the message of an abort frame.
pub(super) const MAX_ABORT_BYTES: usize = 16 * 1024;

/// What a sealed frame carries. The kind is in the frame's authenticated head, so a frame
/// cannot be passed off as another kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Rank 0 to a rank: the NCCL unique id.
    Id = 1,
    /// Rank 0 to a rank: the rendezvous failed, and why.
    Abort = 2,
    /// A rank to rank 0: its contribution to a group step.
    Part = 3,
    /// Rank 0 to a rank: every rank's contribution to a group step.
    All = 4,
}

impl Kind {
    pub(super) fn from_byte(b: u8) -> Option<Kind> {
        [Kind::Id, Kind::Abort, Kind::Part, Kind::All]
            .into_iter()
            .find(|k| *k as u8 == b)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::Id => "id",
            Kind::Abort => "abort",
            Kind::Part => "contribution",
            Kind::All => "gathered",
        })
    }
}

/// The head of a sealed frame, as sent (and authenticated as the frame's associated data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Head {
    pub(super) kind: u8,
    pub(super) seq: u64,
    pub(super) len: u32,
}

impl Head {
    pub(super) fn encode(&self) -> [u8; HEAD_LEN] {
        let mut out = [0u8; HEAD_LEN];
        out[0] = self.kind;
        out[1..9].copy_from_slice(&self.seq.to_be_bytes());
        out[9..].copy_from_slice(&self.len.to_be_bytes());
        out
    }

    pub(super) fn decode(bytes: &[u8; HEAD_LEN]) -> Head {
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&bytes[1..9]);
        let mut len = [0u8; 4];
        len.copy_from_slice(&bytes[9..]);
        Head {
            kind: bytes[0],
            seq: u64::from_be_bytes(seq),
            len: u32::from_be_bytes(len),
        }
    }
}

pub(super) fn set_deadline(stream: &TcpStream, deadline: Instant) -> std::io::Result<()> {
    // A zero timeout means "none" to the socket API; wait at least a millisecond.
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    stream.set_read_timeout(Some(left))?;
    stream.set_write_timeout(Some(left))
}

pub(super) fn clear_timeouts(stream: &TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)
}

/// `label`, the group and its size: the start of every HMAC message and key label, so that
/// nothing of one group or purpose is accepted for another.
pub(super) fn context(label: &str, config: &Config) -> Vec<u8> {
    let mut m = Vec::with_capacity(label.len() + config.group.len() + 16);
    m.extend_from_slice(label.as_bytes());
    m.push(0);
    m.extend_from_slice(&(config.group.len() as u32).to_be_bytes());
    m.extend_from_slice(config.group.as_bytes());
    m.extend_from_slice(&config.ranks().to_be_bytes());
    m
}

pub(super) fn hello_message(
    config: &Config,
    server: &[u8; NONCE],
    client: &[u8; NONCE],
    rank: u32,
) -> Vec<u8> {
    let mut m = context("hello", config);
    m.push(VERSION);
    m.extend_from_slice(server);
    m.extend_from_slice(client);
    m.extend_from_slice(&rank.to_be_bytes());
    m
}

/// The challenge rank 0 sends on every connection.
pub(super) fn challenge(nonce: &[u8; NONCE]) -> [u8; CHALLENGE_LEN] {
    let mut out = [0u8; CHALLENGE_LEN];
    out[..4].copy_from_slice(MAGIC);
    out[4] = VERSION;
    out[5..].copy_from_slice(nonce);
    out
}

/// Every rank's contribution to a group step, by rank: a count, then each as a length and
/// its bytes.
pub(super) fn encode_all(all: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + all.iter().map(|p| 4 + p.len()).sum::<usize>());
    out.extend_from_slice(&(all.len() as u32).to_be_bytes());
    for part in all {
        out.extend_from_slice(&(part.len() as u32).to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

/// The contributions of [`encode_all`], or what is wrong with the bytes.
pub(super) fn decode_all(bytes: &[u8], ranks: u32) -> Result<Vec<Vec<u8>>, String> {
    let mut rest = bytes;
    let mut take = |n: usize| -> Result<&[u8], String> {
        if rest.len() < n {
            return Err(format!("{n} bytes wanted, {} left", rest.len()));
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    let count = u32_of(take(4)?);
    if count != ranks {
        return Err(format!("{count} contributions for a group of {ranks}"));
    }
    let mut all = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let len = u32_of(take(4)?) as usize;
        all.push(take(len)?.to_vec());
    }
    if !rest.is_empty() {
        return Err(format!("{} bytes after the last contribution", rest.len()));
    }
    Ok(all)
}

fn u32_of(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_be_bytes(a)
}
