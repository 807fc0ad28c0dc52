//! Every rank but 0: reaches rank 0 with backoff, proves the secret and receives the id.

use super::wire::{MAGIC, NONCE, STATUS_ABORT, STATUS_OK, TAG, VERSION};
use super::wire::{abort_message, clear_timeouts, hello_message, id_message, set_deadline};
use super::{Config, Group, ID_BYTES, RendezvousError};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Longest pause between two connection attempts of a joining rank.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Any rank but 0: connects to rank 0 (retrying until the deadline), proves the secret,
/// and receives the id.
pub(crate) fn join(config: &Config) -> Result<(Group, [u8; ID_BYTES]), RendezvousError> {
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
            Err(e) => last = e.to_string(),
        }
        let now = Instant::now();
        if now >= deadline {
            continue;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(MAX_BACKOFF);
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
