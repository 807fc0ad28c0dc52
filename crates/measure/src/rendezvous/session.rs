//! One connection after its handshake: keys derived from the secret and both nonces, and
//! the sealed frames they carry, each encrypted, authenticated and numbered so that none can
//! be read, forged, replayed or reordered.
//!
//! Each direction has its own ChaCha20-Poly1305 key, `HKDF-SHA256(salt = rank 0's nonce |
//! the rank's nonce, secret)` expanded with the group, its size, the rank and the direction;
//! the frame's sequence number is its AEAD nonce and its head the associated data. A frame
//! is accepted only with the next number of its direction and a tag that opens under that
//! direction's key, so a frame of another connection, of the other direction, or replayed
//! within this one is refused by name.

use super::wire::{HEAD_LEN, Head, Kind, context};
use super::{Config, NONCE, RendezvousError, Secret};
use ring::aead::{self, Aad, CHACHA20_POLY1305, LessSafeKey, UnboundKey};
use ring::hkdf;
use std::io::{Read, Write};
use std::net::TcpStream;

/// Length of a sealed frame's authentication tag.
pub(super) const SEAL_TAG: usize = 16;

/// Why a frame was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(
        "frame {got} arrived where frame {want} was due: a replayed, dropped or reordered frame"
    )]
    OutOfSequence { got: u64, want: u64 },
    #[error(
        "frame {seq} fails authentication: altered on the way, or not sealed with this connection's key"
    )]
    Tampered { seq: u64 },
    #[error("frame {seq} announces {len} bytes, more than the {max} a {kind} frame may have")]
    TooLarge {
        seq: u64,
        len: usize,
        max: usize,
        kind: Kind,
    },
    #[error("an authentic {got} frame arrived where a {want} frame was due")]
    UnexpectedKind { got: String, want: Kind },
    #[error("an authentic {kind} frame that does not parse: {detail}")]
    Malformed { kind: Kind, detail: String },
    #[error("this connection has sealed every sequence number it may")]
    Exhausted,
}

/// Which way a key seals: the directions have separate keys, so that a frame cannot be
/// reflected back to its sender.
#[derive(Debug, Clone, Copy)]
pub(super) enum Direction {
    ToRank,
    ToRank0,
}

/// One direction of a connection: its key and the number of its next frame.
struct Half {
    key: LessSafeKey,
    seq: u64,
}

/// The sealing state of one connection after its handshake.
pub(crate) struct Session {
    send: Half,
    recv: Half,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Session(sent {}, received {})",
            self.send.seq, self.recv.seq
        )
    }
}

fn derive(
    secret: &Secret,
    config: &Config,
    server: &[u8; NONCE],
    client: &[u8; NONCE],
    rank: u32,
    direction: Direction,
) -> Result<LessSafeKey, RendezvousError> {
    let mut salt = Vec::with_capacity(2 * NONCE);
    salt.extend_from_slice(server);
    salt.extend_from_slice(client);
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &salt).extract(secret.bytes());
    let label = match direction {
        Direction::ToRank => "session key, rank 0 to rank",
        Direction::ToRank0 => "session key, rank to rank 0",
    };
    let mut info = context(label, config);
    info.extend_from_slice(&rank.to_be_bytes());
    let info = [info.as_slice()];
    let okm = prk
        .expand(&info, &CHACHA20_POLY1305)
        .map_err(|_| RendezvousError::Config("deriving the session key failed".into()))?;
    Ok(LessSafeKey::new(UnboundKey::from(okm)))
}

fn nonce(seq: u64) -> aead::Nonce {
    let mut n = [0u8; aead::NONCE_LEN];
    n[4..].copy_from_slice(&seq.to_be_bytes());
    aead::Nonce::assume_unique_for_key(n)
}

impl Session {
    /// The session of the connection of `rank` whose handshake used these nonces, as
    /// `sends` sees it (rank 0 sends [`Direction::ToRank`]).
    pub(super) fn new(
        config: &Config,
        server: &[u8; NONCE],
        client: &[u8; NONCE],
        rank: u32,
        sends: Direction,
    ) -> Result<Session, RendezvousError> {
        let key = |d| derive(&config.secret, config, server, client, rank, d);
        let (send, recv) = match sends {
            Direction::ToRank => (Direction::ToRank, Direction::ToRank0),
            Direction::ToRank0 => (Direction::ToRank0, Direction::ToRank),
        };
        Ok(Session {
            send: Half {
                key: key(send)?,
                seq: 0,
            },
            recv: Half {
                key: key(recv)?,
                seq: 0,
            },
        })
    }

    /// The next frame of this direction, sealed: head then body.
    pub(super) fn seal(&mut self, kind: Kind, payload: &[u8]) -> Result<Vec<u8>, FrameError> {
        let seq = self.send.seq;
        let len = u32::try_from(payload.len() + SEAL_TAG).map_err(|_| FrameError::TooLarge {
            seq,
            len: payload.len(),
            max: u32::MAX as usize - SEAL_TAG,
            kind,
        })?;
        let head = Head {
            kind: kind as u8,
            seq,
            len,
        }
        .encode();
        let mut body = payload.to_vec();
        self.send
            .key
            .seal_in_place_append_tag(nonce(seq), Aad::from(head), &mut body)
            .map_err(|_| FrameError::Exhausted)?;
        self.send.seq = seq.checked_add(1).ok_or(FrameError::Exhausted)?;
        let mut out = Vec::with_capacity(HEAD_LEN + body.len());
        out.extend_from_slice(&head);
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// Seals and writes one frame.
    pub(super) fn send(
        &mut self,
        link: &mut TcpStream,
        kind: Kind,
        payload: &[u8],
    ) -> Result<(), FrameError> {
        let frame = self.seal(kind, payload)?;
        link.write_all(&frame)?;
        Ok(())
    }

    /// Reads the next frame, which must be of `want` with at most `max` bytes of payload.
    pub(super) fn receive(
        &mut self,
        link: &mut TcpStream,
        want: Kind,
        max: usize,
    ) -> Result<Vec<u8>, FrameError> {
        let mut head = [0u8; HEAD_LEN];
        link.read_exact(&mut head)?;
        let (kind, payload) = self.receive_after(link, head, &[want], max)?;
        debug_assert_eq!(kind, want);
        Ok(payload)
    }

    /// Checks and opens the frame whose head was read already: its number must be the next
    /// of this direction, its size within `max` payload bytes, its tag good under this
    /// direction's key, and its kind one of `want`.
    pub(super) fn receive_after(
        &mut self,
        link: &mut TcpStream,
        head_bytes: [u8; HEAD_LEN],
        want: &[Kind],
        max: usize,
    ) -> Result<(Kind, Vec<u8>), FrameError> {
        let head = Head::decode(&head_bytes);
        let expected = self.recv.seq;
        if head.seq != expected {
            return Err(FrameError::OutOfSequence {
                got: head.seq,
                want: expected,
            });
        }
        let first = want.first().copied().unwrap_or(Kind::Part);
        let len = head.len as usize;
        if len > max + SEAL_TAG {
            return Err(FrameError::TooLarge {
                seq: head.seq,
                len,
                max,
                kind: first,
            });
        }
        // A body shorter than a tag cannot open: it is refused below as tampered.
        let mut body = vec![0u8; len];
        link.read_exact(&mut body)?;
        let payload = self
            .recv
            .key
            .open_in_place(nonce(head.seq), Aad::from(head_bytes), &mut body)
            .map_err(|_| FrameError::Tampered { seq: head.seq })?
            .to_vec();
        self.recv.seq = expected.checked_add(1).ok_or(FrameError::Exhausted)?;
        match Kind::from_byte(head.kind).filter(|k| want.contains(k)) {
            Some(kind) => Ok((kind, payload)),
            None => Err(FrameError::UnexpectedKind {
                got: Kind::from_byte(head.kind)
                    .map_or_else(|| format!("kind {}", head.kind), |k| k.to_string()),
                want: first,
            }),
        }
    }
}

/// A connection of a group and its session.
#[derive(Debug)]
pub(crate) struct Link {
    pub(super) stream: TcpStream,
    pub(super) session: Session,
}

impl Link {
    pub(super) fn send(&mut self, kind: Kind, payload: &[u8]) -> Result<(), FrameError> {
        self.session.send(&mut self.stream, kind, payload)
    }

    pub(super) fn receive(&mut self, want: Kind, max: usize) -> Result<Vec<u8>, FrameError> {
        self.session.receive(&mut self.stream, want, max)
    }
}
