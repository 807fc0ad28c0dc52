//! Every rank but 0: reaches rank 0 with backoff, proves the secret and receives the id in
//! a sealed frame.

use super::gate::RefusalKind;
use super::session::{Direction, FrameError, Link, Session};
use super::wire::{CHALLENGE_LEN, HANDSHAKE_TIMEOUT, HEAD_LEN, HELLO_LEN, Kind, MAGIC};
use super::wire::{MAX_ABORT_BYTES, REFUSED, VERSION};
use super::wire::{clear_timeouts, hello_message, set_deadline};
use super::{Config, Group, ID_BYTES, NONCE, RendezvousError};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Longest pause between two connection attempts of a joining rank.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Any rank but 0: connects to rank 0 (retrying until the deadline while it is not there,
/// or hangs up before judging this rank, as it does when crowded), proves the secret, and
/// receives the id.
pub(crate) fn join(config: &Config) -> Result<(Group, [u8; ID_BYTES]), RendezvousError> {
    config.check()?;
    if config.rank == 0 {
        return Err(RendezvousError::Config(
            "rank 0 serves the rendezvous; it does not join".into(),
        ));
    }
    let start = Instant::now();
    let deadline = start + config.timeout;
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
        match attempt(config, start, deadline) {
            Ok(joined) => return Ok(joined),
            Err(Attempt::Again(why)) => last = why,
            Err(Attempt::Fail(e)) => return Err(e),
        }
        std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
        pause = (pause * 2).min(MAX_BACKOFF);
    }
}

/// How one connection attempt ended, when it did not join.
enum Attempt {
    /// Worth another try (rank 0 not there yet, or it hung up before judging us), and why.
    Again(String),
    /// Final.
    Fail(RendezvousError),
}

fn closed(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
    )
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// One connection: challenge, hello, and rank 0's answer.
fn attempt(
    config: &Config,
    start: Instant,
    deadline: Instant,
) -> Result<(Group, [u8; ID_BYTES]), Attempt> {
    let server = config.who(0);
    let addr = config.addr.clone();
    let again = |what: &str, e: std::io::Error| Attempt::Again(format!("{what}: {e}"));
    let target = resolve(&addr).map_err(|e| Attempt::Again(e.to_string()))?;
    let left = deadline.saturating_duration_since(Instant::now());
    let mut stream = TcpStream::connect_timeout(
        &target,
        left.clamp(Duration::from_millis(1), Duration::from_secs(5)),
    )
    .map_err(|e| Attempt::Again(e.to_string()))?;
    let _ = stream.set_nodelay(true);
    set_deadline(&stream, deadline.min(Instant::now() + HANDSHAKE_TIMEOUT))
        .map_err(|e| again("setting a deadline", e))?;
    let mut challenge = [0u8; CHALLENGE_LEN];
    stream
        .read_exact(&mut challenge)
        .map_err(|e| again("connected, but no challenge came", e))?;
    if &challenge[..4] != MAGIC {
        return Err(Attempt::Fail(RendezvousError::Protocol(format!(
            "{server} at {addr} is not a gpufabric rendezvous (version {VERSION})"
        ))));
    }
    if challenge[4] != VERSION {
        return Err(Attempt::Fail(RendezvousError::Version {
            server,
            addr,
            theirs: challenge[4],
        }));
    }
    let mut server_nonce = [0u8; NONCE];
    server_nonce.copy_from_slice(&challenge[5..]);
    let mut nonce = [0u8; NONCE];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| Attempt::Fail(RendezvousError::Config("the random source failed".into())))?;
    let tag = hmac::sign(
        &config.secret.key(),
        &hello_message(config, &server_nonce, &nonce, config.rank),
    );
    let mut hello = Vec::with_capacity(HELLO_LEN);
    hello.extend_from_slice(MAGIC);
    hello.push(VERSION);
    hello.extend_from_slice(&config.rank.to_be_bytes());
    hello.extend_from_slice(&nonce);
    hello.extend_from_slice(tag.as_ref());
    stream
        .write_all(&hello)
        .map_err(|e| again("sending the hello", e))?;

    // Rank 0 answers once every rank has arrived, or at its own deadline; allow a little
    // beyond ours for its abort to arrive.
    let fail = |what: &str, e: std::io::Error| {
        if closed(&e) {
            // Rank 0 hung up without a refusal: crowded out, or restarting.
            Attempt::Again(format!("{server} closed the connection after the hello"))
        } else if timed_out(&e) {
            Attempt::Fail(RendezvousError::Step {
                step: "rendezvous",
                group: config.group.clone(),
                who: vec![server.clone()],
                waited: start.elapsed(),
                detail: format!("connected, but no {what} came"),
            })
        } else {
            Attempt::Fail(RendezvousError::Protocol(format!(
                "{what} from {server} at {addr}: {e}"
            )))
        }
    };
    set_deadline(&stream, deadline + Duration::from_secs(2)).map_err(|e| fail("reply", e))?;
    let mut head = [0u8; HEAD_LEN];
    stream
        .read_exact(&mut head[..1])
        .map_err(|e| fail("reply", e))?;
    if head[0] == REFUSED {
        let mut code = [0u8; 1];
        let why = stream
            .read_exact(&mut code)
            .ok()
            .and_then(|()| RefusalKind::from_code(code[0]));
        return Err(Attempt::Fail(RendezvousError::Rejected {
            server,
            addr,
            why,
        }));
    }
    stream
        .read_exact(&mut head[1..])
        .map_err(|e| fail("reply", e))?;
    let mut session = Session::new(
        config,
        &server_nonce,
        &nonce,
        config.rank,
        Direction::ToRank0,
    )
    .map_err(Attempt::Fail)?;
    let first = session.receive_after(
        &mut stream,
        head,
        &[Kind::Id, Kind::Abort],
        MAX_ABORT_BYTES.max(ID_BYTES),
    );
    match first {
        Ok((Kind::Id, payload)) => {
            let id: [u8; ID_BYTES] = payload.as_slice().try_into().map_err(|_| {
                Attempt::Fail(RendezvousError::Protocol(format!(
                    "{server} sent an id of {} bytes, NCCL's has {ID_BYTES}",
                    payload.len()
                )))
            })?;
            clear_timeouts(&stream).map_err(|e| fail("id", e))?;
            let group = Group {
                config: config.clone(),
                links: vec![Link { stream, session }],
                #[cfg(test)]
                admission: Default::default(),
            };
            Ok((group, id))
        }
        Ok((_, text)) => Err(Attempt::Fail(RendezvousError::Aborted {
            server,
            message: String::from_utf8_lossy(&text).into_owned(),
        })),
        Err(FrameError::Io(e)) => Err(fail("id", e)),
        Err(why) => Err(Attempt::Fail(RendezvousError::Unauthenticated {
            server,
            addr,
            why,
        })),
    }
}

/// Why rank 0's address gave nothing to connect to.
#[derive(Debug, thiserror::Error)]
enum ResolveError {
    #[error("resolving {addr}: {source}")]
    Failed {
        addr: String,
        source: std::io::Error,
    },
    #[error("{0} resolves to no address")]
    NoAddress(String),
}

fn resolve(addr: &str) -> Result<SocketAddr, ResolveError> {
    addr.to_socket_addrs()
        .map_err(|source| ResolveError::Failed {
            addr: addr.to_string(),
            source,
        })?
        .next()
        .ok_or_else(|| ResolveError::NoAddress(addr.to_string()))
}
