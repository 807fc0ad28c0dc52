//! Rank 0: admits the ranks that prove the secret and hands them the id in a sealed frame,
//! or tells those that came which ranks never did.

use super::gate::{self, Arrival, Pending, RefusalKind, Refusals, Refused};
use super::session::{Direction, Link, Session};
use super::wire::{HANDSHAKE_TIMEOUT, Kind, MAX_ABORT_BYTES};
use super::{Config, Group, ID_BYTES, NONCE, RendezvousError};
use ring::rand::{SecureRandom, SystemRandom};
use std::io::ErrorKind;
use std::net::TcpListener;
use std::time::{Duration, Instant};

/// Rank 0's pause between two looks at its listener and handshakes when nothing moved.
const IDLE: Duration = Duration::from_millis(2);

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
/// all have arrived gives them `id`, sealed. Ends by `config.timeout` with
/// [`RendezvousError::Missing`] naming the ranks that never came (and tells those that did).
///
/// Every handshake runs on this thread: at most [`gate::slots`] at once (a new connection
/// beyond them drops the oldest handshake), each for at most the handshake time limit.
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
    let mut door = Door::new(config);
    let mut arrived: Vec<Option<Arrival>> = (1..config.ranks()).map(|_| None).collect();
    loop {
        let now = Instant::now();
        let mut moved = false;
        for arrival in door.advance(config, now) {
            moved = true;
            if let Some(slot) = arrived.get_mut(arrival.rank as usize - 1) {
                // A rank that connects again (its first connection broke) replaces it.
                *slot = Some(arrival);
            }
        }
        if arrived.iter().all(Option::is_some) {
            break;
        }
        if now >= deadline {
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
                refused: door.refusals.clone(),
            };
            let message = err.to_string();
            let message = &message.as_bytes()[..message.len().min(MAX_ABORT_BYTES)];
            for arrival in arrived.into_iter().flatten() {
                let _ = finish(config, arrival, Kind::Abort, message);
            }
            return Err(err);
        }
        moved |= door.accept(&listener, now)?;
        if !moved {
            std::thread::sleep(IDLE);
        }
    }
    let mut links = Vec::with_capacity(arrived.len());
    for arrival in arrived.into_iter().flatten() {
        let rank = arrival.rank;
        let link = finish(config, arrival, Kind::Id, id).map_err(|e| {
            RendezvousError::Protocol(format!("sending the id to {}: {e}", config.who(rank)))
        })?;
        links.push(link);
    }
    let admission = door.admission();
    if admission.refusals.total() > 0 {
        tracing::warn!(
            "rendezvous {}: refused {} connection(s): {} (at most {} handshakes at once)",
            config.group,
            admission.refusals.total(),
            admission.refusals,
            admission.peak_handshakes
        );
    }
    Ok(Group {
        config: config.clone(),
        links,
        #[cfg(test)]
        admission,
    })
}

/// What rank 0's door saw while the group gathered.
#[derive(Debug, Clone, Default)]
pub(crate) struct Admission {
    /// Connections turned away, by reason.
    pub(crate) refusals: Refusals,
    /// Most handshakes in progress at one time.
    pub(crate) peak_handshakes: usize,
}

/// The handshakes in progress, oldest first, and what was turned away.
struct Door {
    pending: Vec<Pending>,
    slots: usize,
    peak: usize,
    refusals: Refusals,
    random: SystemRandom,
    group: String,
}

impl Door {
    fn new(config: &Config) -> Door {
        Door {
            pending: Vec::new(),
            slots: gate::slots(config),
            peak: 0,
            refusals: Refusals::default(),
            random: SystemRandom::new(),
            group: config.group.clone(),
        }
    }

    fn admission(&self) -> Admission {
        Admission {
            refusals: self.refusals.clone(),
            peak_handshakes: self.peak,
        }
    }

    fn refuse(&mut self, why: Refused) {
        self.refusals.add(why.kind);
        match why.kind {
            RefusalKind::WrongSecret | RefusalKind::NotJoining | RefusalKind::Version => {
                tracing::warn!("rendezvous {}: refused a connection {why}", self.group)
            }
            _ => tracing::debug!("rendezvous {}: refused a connection {why}", self.group),
        }
    }

    /// Moves every handshake on; the ranks whose hello proved the secret.
    fn advance(&mut self, config: &Config, now: Instant) -> Vec<Arrival> {
        let mut arrivals = Vec::new();
        let mut i = 0;
        while i < self.pending.len() {
            match self.pending[i].advance(now) {
                None => i += 1,
                Some(Err(why)) => {
                    self.pending.remove(i);
                    self.refuse(why);
                }
                Some(Ok(())) => match self.pending.remove(i).admit(config) {
                    Ok(arrival) => arrivals.push(arrival),
                    Err(why) => self.refuse(why),
                },
            }
        }
        arrivals
    }

    /// Takes the connections waiting on the listener (at most a slot's worth per call, so a
    /// handshake begun now is read before a burst can push it out); true if any came.
    fn accept(&mut self, listener: &TcpListener, now: Instant) -> Result<bool, RendezvousError> {
        let mut any = false;
        for _ in 0..self.slots {
            match listener.accept() {
                Ok((stream, peer)) => {
                    any = true;
                    if self.pending.len() >= self.slots {
                        let oldest = self.pending.remove(0);
                        let why = oldest.refuse(RefusalKind::Crowded);
                        self.refuse(why);
                    }
                    let mut nonce = [0u8; NONCE];
                    self.random
                        .fill(&mut nonce)
                        .map_err(|_| RendezvousError::Config("the random source failed".into()))?;
                    match Pending::start(stream, peer, nonce, now) {
                        Ok(p) => self.pending.push(p),
                        Err(why) => self.refuse(why),
                    }
                    self.peak = self.peak.max(self.pending.len());
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::debug!(error = %e, "accept failed");
                    break;
                }
            }
        }
        Ok(any)
    }
}

/// Opens the arrival's session and sends it its first sealed frame (the id, or an abort).
fn finish(
    config: &Config,
    arrival: Arrival,
    kind: Kind,
    payload: &[u8],
) -> Result<Link, RendezvousError> {
    let session = Session::new(
        config,
        &arrival.server_nonce,
        &arrival.client_nonce,
        arrival.rank,
        Direction::ToRank,
    )?;
    let mut link = Link {
        stream: arrival.stream,
        session,
    };
    let io = |e: std::io::Error| RendezvousError::Protocol(e.to_string());
    link.stream
        .set_write_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io)?;
    link.send(kind, payload)
        .map_err(|e| RendezvousError::Protocol(e.to_string()))?;
    link.stream.set_write_timeout(None).map_err(io)?;
    Ok(link)
}
