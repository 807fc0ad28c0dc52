//! Rank 0: admits the ranks that prove the secret and hands them the id, or tells those that
//! came which ranks never did.

use super::wire::{HELLO_TIMEOUT, MAGIC, NONCE, STATUS_ABORT, STATUS_OK, TAG, VERSION};
use super::wire::{abort_message, hello_message, id_message};
use super::{Config, Group, ID_BYTES, RendezvousError};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Rank 0: binds `config.addr`, then serves `id` (see [`serve_on`]).
pub(crate) fn serve(config: &Config, id: &[u8; ID_BYTES]) -> Result<Group, RendezvousError> {
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
pub(crate) fn serve_on(
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
    let (tx, rx) = mpsc::channel::<Result<Arrival, Refused>>();
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

/// Why rank 0 turned a connection away.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("{0}")]
    Socket(std::io::Error),
    #[error("sending the challenge: {0}")]
    Challenge(std::io::Error),
    #[error("no complete hello ({0})")]
    NoHello(std::io::Error),
    #[error("not a gpufabric rendezvous hello")]
    NotHello,
    #[error("protocol version {0}, this rank 0 speaks {VERSION}")]
    Version(u8),
    #[error("wrong secret or group")]
    WrongSecret,
    #[error("rank {rank} is not a joining rank of a group of {ranks}")]
    NotJoining { rank: u32, ranks: u32 },
}

/// A connection rank 0 turned away: where it came from, and why.
#[derive(Debug, thiserror::Error)]
#[error("from {peer}: {why}")]
struct Refused {
    peer: SocketAddr,
    why: Refusal,
}

/// Rank 0's side of one connection: send the challenge, check the answer.
fn admit(
    mut stream: TcpStream,
    peer: SocketAddr,
    config: &Config,
    nonce: [u8; NONCE],
) -> Result<Arrival, Refused> {
    let fail = |why: Refusal| Refused { peer, why };
    stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_nodelay(true))
        .and_then(|()| stream.set_read_timeout(Some(HELLO_TIMEOUT)))
        .and_then(|()| stream.set_write_timeout(Some(HELLO_TIMEOUT)))
        .map_err(|e| fail(Refusal::Socket(e)))?;
    let mut challenge = Vec::with_capacity(MAGIC.len() + 1 + NONCE);
    challenge.extend_from_slice(MAGIC);
    challenge.push(VERSION);
    challenge.extend_from_slice(&nonce);
    stream
        .write_all(&challenge)
        .map_err(|e| fail(Refusal::Challenge(e)))?;
    let mut hello = [0u8; 4 + 1 + 4 + NONCE + TAG];
    stream
        .read_exact(&mut hello)
        .map_err(|e| fail(Refusal::NoHello(e)))?;
    if &hello[..4] != MAGIC {
        return Err(fail(Refusal::NotHello));
    }
    if hello[4] != VERSION {
        return Err(fail(Refusal::Version(hello[4])));
    }
    let rank = u32::from_be_bytes([hello[5], hello[6], hello[7], hello[8]]);
    let mut their_nonce = [0u8; NONCE];
    their_nonce.copy_from_slice(&hello[9..9 + NONCE]);
    let tag = &hello[9 + NONCE..];
    let message = hello_message(config, &nonce, &their_nonce, rank);
    hmac::verify(&config.secret.key(), &message, tag).map_err(|_| fail(Refusal::WrongSecret))?;
    if rank == 0 || rank >= config.ranks() {
        return Err(fail(Refusal::NotJoining {
            rank,
            ranks: config.ranks(),
        }));
    }
    stream
        .set_read_timeout(None)
        .and_then(|()| stream.set_write_timeout(None))
        .map_err(|e| fail(Refusal::Socket(e)))?;
    Ok(Arrival {
        rank,
        nonce: their_nonce,
        stream,
    })
}
