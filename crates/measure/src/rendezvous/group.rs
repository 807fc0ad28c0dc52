//! The ranks after a successful rendezvous: barriers and small all-gathers over the open
//! connections, every frame sealed (see `session`).

#[cfg(test)]
use super::serve::Admission;
use super::session::{FrameError, Link};
use super::wire::{Kind, decode_all, encode_all, set_deadline};
use super::{Config, MAX_GATHER_BYTES, RendezvousError};
use std::time::{Duration, Instant};

/// The ranks of a group after a successful rendezvous: rank 0 holds a connection to every
/// other rank, each other rank one to rank 0.
#[derive(Debug)]
pub(crate) struct Group {
    pub(super) config: Config,
    /// Rank 0: the connection of rank r at index r - 1. Other ranks: one connection.
    pub(super) links: Vec<Link>,
    /// Rank 0: what its door turned away while the group gathered (logged as it forms; kept
    /// for the tests).
    #[cfg(test)]
    pub(super) admission: Admission,
}
impl Group {
    /// This rank.
    pub(crate) fn rank(&self) -> u32 {
        self.config.rank
    }

    /// Group size.
    #[cfg(test)]
    pub(crate) fn ranks(&self) -> u32 {
        self.config.ranks()
    }

    /// Returns once every rank has called it, or fails naming the ranks that did not arrive
    /// within `timeout`.
    pub(crate) fn barrier(&mut self, timeout: Duration) -> Result<(), RendezvousError> {
        self.step("barrier", &[], timeout).map(|_| ())
    }

    /// Every rank contributes up to [`MAX_GATHER_BYTES`] bytes; every rank receives all
    /// contributions, by rank. Fails naming the ranks that did not contribute in time.
    pub(crate) fn all_gather(
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

    /// Rank 0: what its door turned away while the group gathered (nothing on other ranks).
    #[cfg(test)]
    pub(crate) fn admission(&self) -> &Admission {
        &self.admission
    }

    fn step(
        &mut self,
        step: &'static str,
        data: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, RendezvousError> {
        let start = Instant::now();
        let deadline = start + timeout;
        let config = &self.config;
        let failed = |from: u32, e: FrameError| match e {
            FrameError::Io(e) => RendezvousError::Step {
                step,
                group: config.group.clone(),
                who: vec![config.who(from)],
                waited: start.elapsed(),
                detail: e.to_string(),
            },
            why => RendezvousError::Frame {
                step,
                group: config.group.clone(),
                from: config.who(from),
                why,
            },
        };
        if config.rank == 0 {
            let mut all = vec![data.to_vec()];
            for (i, link) in self.links.iter_mut().enumerate() {
                let rank = i as u32 + 1;
                let got = set_deadline(&link.stream, deadline)
                    .map_err(FrameError::Io)
                    .and_then(|()| link.receive(Kind::Part, MAX_GATHER_BYTES));
                all.push(got.map_err(|e| failed(rank, e))?);
            }
            let reply = encode_all(&all);
            for (i, link) in self.links.iter_mut().enumerate() {
                link.send(Kind::All, &reply)
                    .map_err(|e| failed(i as u32 + 1, e))?;
            }
            Ok(all)
        } else {
            let link = self
                .links
                .first_mut()
                .ok_or_else(|| RendezvousError::Protocol("group has no connection".into()))?;
            let max = (config.ranks() as usize) * (4 + MAX_GATHER_BYTES) + 4;
            let reply = set_deadline(&link.stream, deadline)
                .map_err(FrameError::Io)
                .and_then(|()| link.send(Kind::Part, data))
                .and_then(|()| link.receive(Kind::All, max))
                .map_err(|e| failed(0, e))?;
            decode_all(&reply, config.ranks()).map_err(|detail| {
                failed(
                    0,
                    FrameError::Malformed {
                        kind: Kind::All,
                        detail,
                    },
                )
            })
        }
    }
}
