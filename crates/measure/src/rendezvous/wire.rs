//! The bytes on the wire: the handshake's constants and HMAC messages, the frames of a
//! group step, and socket deadlines.

use super::{Config, ID_BYTES, MAX_GATHER_BYTES};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

pub(super) const MAGIC: &[u8; 4] = b"GFRZ";
pub(super) const VERSION: u8 = 1;
pub(super) const NONCE: usize = 32;
pub(super) const TAG: usize = 32;
pub(super) const STATUS_OK: u8 = 0;
pub(super) const STATUS_ABORT: u8 = 1;
/// How long rank 0 gives a fresh connection to send its hello before dropping it.
pub(super) const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

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
    m.extend_from_slice(server);
    m.extend_from_slice(client);
    m.extend_from_slice(&rank.to_be_bytes());
    m
}

pub(super) fn id_message(
    config: &Config,
    client: &[u8; NONCE],
    rank: u32,
    id: &[u8; ID_BYTES],
) -> Vec<u8> {
    let mut m = context("id", config);
    m.extend_from_slice(client);
    m.extend_from_slice(&rank.to_be_bytes());
    m.extend_from_slice(id);
    m
}

pub(super) fn abort_message(
    config: &Config,
    client: &[u8; NONCE],
    rank: u32,
    text: &[u8],
) -> Vec<u8> {
    let mut m = context("abort", config);
    m.extend_from_slice(client);
    m.extend_from_slice(&rank.to_be_bytes());
    m.extend_from_slice(text);
    m
}

pub(super) fn write_frame(link: &mut TcpStream, seq: u8, data: &[u8]) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(5 + data.len());
    out.push(seq);
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    link.write_all(&out)
}

pub(super) fn read_frame(link: &mut TcpStream, seq: u8) -> std::io::Result<Vec<u8>> {
    let len = read_head(link, seq)? as usize;
    read_contribution(link, len)
}

/// The head of a frame (the step's sequence byte and a big-endian count), refused when it
/// belongs to another step.
fn read_head(link: &mut TcpStream, seq: u8) -> std::io::Result<u32> {
    let mut head = [0u8; 5];
    link.read_exact(&mut head)?;
    if head[0] != seq {
        return Err(invalid(format!(
            "step {} arrived while waiting for step {seq}",
            head[0]
        )));
    }
    Ok(u32::from_be_bytes([head[1], head[2], head[3], head[4]]))
}

/// One rank's contribution of `len` bytes, refused when over [`MAX_GATHER_BYTES`].
fn read_contribution(link: &mut TcpStream, len: usize) -> std::io::Result<Vec<u8>> {
    if len > MAX_GATHER_BYTES {
        return Err(invalid(format!(
            "a contribution of {len} bytes is over {MAX_GATHER_BYTES}"
        )));
    }
    let mut data = vec![0u8; len];
    link.read_exact(&mut data)?;
    Ok(data)
}

fn invalid(message: String) -> std::io::Error {
    std::io::Error::new(ErrorKind::InvalidData, message)
}

pub(super) fn encode_all(seq: u8, all: &[Vec<u8>]) -> Vec<u8> {
    let mut out = vec![seq];
    out.extend_from_slice(&(all.len() as u32).to_be_bytes());
    for part in all {
        out.extend_from_slice(&(part.len() as u32).to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

pub(super) fn read_all(link: &mut TcpStream, seq: u8) -> std::io::Result<Vec<Vec<u8>>> {
    let count = read_head(link, seq)? as usize;
    if count > 4096 {
        return Err(invalid(format!(
            "{count} contributions is more than a group has"
        )));
    }
    let mut all = Vec::with_capacity(count);
    for _ in 0..count {
        let mut len = [0u8; 4];
        link.read_exact(&mut len)?;
        all.push(read_contribution(link, u32::from_be_bytes(len) as usize)?);
    }
    Ok(all)
}
