//! The ranks after a successful rendezvous: barriers and small all-gathers over the open
//! connections.

use super::wire::{encode_all, read_all, read_frame, set_deadline, write_frame};
use super::{Config, MAX_GATHER_BYTES, RendezvousError};
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The ranks of a group after a successful rendezvous: rank 0 holds a connection to every
/// other rank, each other rank one to rank 0.
#[derive(Debug)]
pub(crate) struct Group {
    pub(super) config: Config,
    /// Rank 0: the connection of rank r at index r - 1. Other ranks: one connection.
    pub(super) links: Vec<TcpStream>,
    pub(super) steps: u8,
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
