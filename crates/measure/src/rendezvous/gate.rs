//! Rank 0's door: each connection's handshake as a small state machine driven from rank 0's
//! own thread (no thread per connection), at most [`slots`] of them at once, each for at
//! most [`HANDSHAKE_TIMEOUT`]; every connection turned away counted by a typed reason.

use super::wire::{HANDSHAKE_TIMEOUT, HELLO_LEN, MAGIC, REFUSED, TAG, VERSION};
use super::wire::{challenge, hello_message};
use super::{Config, NONCE};
use ring::hmac;
use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

/// Handshakes rank 0 holds open at once beyond one per joining rank: room for strangers
/// and retries without letting them crowd out the group.
pub(super) const SPARE_SLOTS: usize = 16;

/// How many handshakes rank 0 of `config`'s group holds open at once.
pub(super) fn slots(config: &Config) -> usize {
    (config.ranks() as usize).saturating_sub(1) + SPARE_SLOTS
}

/// Why rank 0 turned a connection away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RefusalKind {
    /// Every handshake slot was taken: the oldest handshake was dropped to make room (a
    /// joining rank so dropped connects again).
    Crowded,
    /// No complete hello within the handshake's time limit.
    Silent,
    /// Closed, or broke, before a complete hello.
    Closed,
    /// Its first bytes are not a gpufabric rendezvous hello.
    NotRendezvous,
    /// A hello of another protocol version.
    Version,
    /// A hello whose tag does not check: another secret, group or group size.
    WrongSecret,
    /// A good tag for a rank that does not join this group (rank 0, or beyond its size).
    NotJoining,
}

impl RefusalKind {
    /// The code rank 0 sends after [`REFUSED`] for a refusal the peer should hear about
    /// (one that sent a whole hello); None for those it just hangs up on.
    pub(super) fn code(self) -> Option<u8> {
        match self {
            RefusalKind::Version => Some(1),
            RefusalKind::WrongSecret => Some(2),
            RefusalKind::NotJoining => Some(3),
            _ => None,
        }
    }

    pub(super) fn from_code(code: u8) -> Option<RefusalKind> {
        [
            RefusalKind::Version,
            RefusalKind::WrongSecret,
            RefusalKind::NotJoining,
        ]
        .into_iter()
        .find(|k| k.code() == Some(code))
    }
}

impl std::fmt::Display for RefusalKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RefusalKind::Crowded => "dropped when every handshake slot was taken",
            RefusalKind::Silent => "no hello within the handshake's time limit",
            RefusalKind::Closed => "closed before a complete hello",
            RefusalKind::NotRendezvous => "not a gpufabric rendezvous hello",
            RefusalKind::Version => "another rendezvous protocol version",
            RefusalKind::WrongSecret => "wrong secret or group",
            RefusalKind::NotJoining => "a rank this group does not have",
        })
    }
}

/// Connections rank 0 turned away, counted by reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refusals(BTreeMap<RefusalKind, u32>);

impl Refusals {
    pub(super) fn add(&mut self, kind: RefusalKind) {
        *self.0.entry(kind).or_insert(0) += 1;
    }

    /// How many were refused for `kind`.
    pub fn of(&self, kind: RefusalKind) -> u32 {
        self.0.get(&kind).copied().unwrap_or(0)
    }

    /// How many were refused in all.
    pub fn total(&self) -> u32 {
        self.0.values().sum()
    }
}

impl std::fmt::Display for Refusals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (kind, n)) in self.0.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{n} {kind}")?;
        }
        Ok(())
    }
}

/// A connection rank 0 turned away: where from, why, and what it said, for the log.
#[derive(Debug, thiserror::Error)]
#[error("from {peer}: {kind}{detail}")]
pub(super) struct Refused {
    pub(super) peer: SocketAddr,
    pub(super) kind: RefusalKind,
    detail: String,
}

/// A rank that presented a valid hello: its connection, back in blocking mode, and the
/// nonces its session keys derive from.
pub(super) struct Arrival {
    pub(super) rank: u32,
    pub(super) server_nonce: [u8; NONCE],
    pub(super) client_nonce: [u8; NONCE],
    pub(super) stream: TcpStream,
}

/// A handshake in progress: the challenge is sent, the hello arrives in pieces.
pub(super) struct Pending {
    stream: TcpStream,
    peer: SocketAddr,
    nonce: [u8; NONCE],
    hello: [u8; HELLO_LEN],
    filled: usize,
    since: Instant,
}

impl Pending {
    /// Sends the challenge on a fresh connection.
    pub(super) fn start(
        stream: TcpStream,
        peer: SocketAddr,
        nonce: [u8; NONCE],
        now: Instant,
    ) -> Result<Pending, Refused> {
        let refuse = |detail: String| Refused {
            peer,
            kind: RefusalKind::Closed,
            detail,
        };
        stream
            .set_nonblocking(true)
            .and_then(|()| stream.set_nodelay(true))
            .map_err(|e| refuse(format!(" ({e})")))?;
        // A fresh socket's buffer always takes the few bytes of a challenge at once.
        let sent = (&stream)
            .write(&challenge(&nonce))
            .map_err(|e| refuse(format!(" (sending the challenge: {e})")))?;
        if sent != super::wire::CHALLENGE_LEN {
            return Err(refuse(" (the challenge did not fit its buffer)".into()));
        }
        Ok(Pending {
            stream,
            peer,
            nonce,
            hello: [0u8; HELLO_LEN],
            filled: 0,
            since: now,
        })
    }

    /// Drops the connection for `kind`.
    pub(super) fn refuse(self, kind: RefusalKind) -> Refused {
        Refused {
            peer: self.peer,
            kind,
            detail: String::new(),
        }
    }

    /// Reads what has arrived: None while the hello is incomplete and within its time,
    /// Some(Ok) once it is whole (then [`Pending::admit`] checks it).
    pub(super) fn advance(&mut self, now: Instant) -> Option<Result<(), Refused>> {
        while self.filled < HELLO_LEN {
            match (&self.stream).read(&mut self.hello[self.filled..]) {
                Ok(0) => return Some(Err(self.refused(RefusalKind::Closed, String::new()))),
                Ok(n) => self.filled += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if now.duration_since(self.since) >= HANDSHAKE_TIMEOUT {
                        let detail = format!(" ({} of {HELLO_LEN} bytes)", self.filled);
                        return Some(Err(self.refused(RefusalKind::Silent, detail)));
                    }
                    return None;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Some(Err(self.refused(RefusalKind::Closed, format!(" ({e})")))),
            }
        }
        Some(Ok(()))
    }

    fn refused(&self, kind: RefusalKind, detail: String) -> Refused {
        Refused {
            peer: self.peer,
            kind,
            detail,
        }
    }

    /// The whole hello checked: the arrival, or why not (a peer refused after a whole hello
    /// hears why before rank 0 hangs up).
    pub(super) fn admit(self, config: &Config) -> Result<Arrival, Refused> {
        match check_hello(config, &self.nonce, &self.hello) {
            Ok((rank, client_nonce)) => {
                self.stream
                    .set_nonblocking(false)
                    .map_err(|e| self.refused(RefusalKind::Closed, format!(" ({e})")))?;
                Ok(Arrival {
                    rank,
                    server_nonce: self.nonce,
                    client_nonce,
                    stream: self.stream,
                })
            }
            Err((kind, detail)) => {
                if let Some(code) = kind.code() {
                    // Best effort: the peer may be gone already.
                    let _ = (&self.stream).write(&[REFUSED, code]);
                }
                Err(self.refused(kind, detail))
            }
        }
    }
}

/// A hello checked against rank 0's challenge: the joining rank and its nonce, or why not.
fn check_hello(
    config: &Config,
    server_nonce: &[u8; NONCE],
    hello: &[u8; HELLO_LEN],
) -> Result<(u32, [u8; NONCE]), (RefusalKind, String)> {
    if &hello[..4] != MAGIC {
        return Err((RefusalKind::NotRendezvous, String::new()));
    }
    if hello[4] != VERSION {
        let detail = format!(" (version {}, this rank 0 speaks {VERSION})", hello[4]);
        return Err((RefusalKind::Version, detail));
    }
    let rank = u32::from_be_bytes([hello[5], hello[6], hello[7], hello[8]]);
    let mut client_nonce = [0u8; NONCE];
    client_nonce.copy_from_slice(&hello[9..9 + NONCE]);
    let tag = &hello[9 + NONCE..9 + NONCE + TAG];
    let message = hello_message(config, server_nonce, &client_nonce, rank);
    hmac::verify(&config.secret.key(), &message, tag)
        .map_err(|_| (RefusalKind::WrongSecret, String::new()))?;
    if rank == 0 || rank >= config.ranks() {
        let detail = format!(" (rank {rank} of a group of {})", config.ranks());
        return Err((RefusalKind::NotJoining, detail));
    }
    Ok((rank, client_nonce))
}
