use super::gate::slots;
use super::wire::{CHALLENGE_LEN, HEAD_LEN, HELLO_LEN, Head, Kind, MAGIC, REFUSED, VERSION};
use super::*;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant;

fn secret(byte: u8) -> Secret {
    Secret(vec![byte; 32])
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("node-{i}")).collect()
}

fn config(rank: u32, ranks: usize, addr: &str, secret: &Secret, timeout_ms: u64) -> Config {
    Config {
        group: "run-1/round-0/pair-0".into(),
        rank,
        names: names(ranks),
        addr: addr.into(),
        secret: secret.clone(),
        timeout: Duration::from_millis(timeout_ms),
    }
}

fn listener() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let addr = l.local_addr().expect("local address").to_string();
    (l, addr)
}

/// A loopback address nobody listens on (bound, then released).
fn free_addr() -> String {
    let (l, addr) = listener();
    drop(l);
    addr
}

fn id(byte: u8) -> [u8; ID_BYTES] {
    let mut id = [0u8; ID_BYTES];
    for (i, b) in id.iter_mut().enumerate() {
        *b = byte ^ (i as u8);
    }
    id
}

type Joined = Result<(Group, [u8; ID_BYTES]), RendezvousError>;

fn spawn_join(cfg: Config) -> thread::JoinHandle<Joined> {
    thread::spawn(move || join(&cfg))
}

#[test]
fn a_pair_exchanges_the_id_when_rank_0_starts_first() {
    let s = secret(7);
    let (l, addr) = listener();
    let server_cfg = config(0, 2, &addr, &s, 5_000);
    let server = thread::spawn(move || serve_on(l, &server_cfg, &id(3)));
    thread::sleep(Duration::from_millis(50));
    let (group, got) = join(&config(1, 2, &addr, &s, 5_000)).expect("rank 1 joins");
    assert_eq!(got, id(3));
    assert_eq!((group.rank(), group.ranks()), (1, 2));
    let served = server.join().expect("no panic").expect("rank 0 serves");
    assert_eq!(served.ranks(), 2);
}

#[test]
fn a_pair_exchanges_the_id_when_the_joining_rank_starts_first() {
    let s = secret(9);
    let addr = free_addr();
    let joiner = spawn_join(config(1, 2, &addr, &s, 5_000));
    // Rank 1 is retrying against a closed port meanwhile.
    thread::sleep(Duration::from_millis(300));
    let group = serve(&config(0, 2, &addr, &s, 5_000), &id(1)).expect("rank 0 serves");
    let (_, got) = joiner
        .join()
        .expect("no panic")
        .expect("rank 1 joins late rank 0");
    assert_eq!(got, id(1));
    assert_eq!(group.rank(), 0);
}

#[test]
fn every_rank_of_a_group_of_five_gets_the_same_id_in_any_start_order() {
    let s = secret(1);
    let addr = free_addr();
    // Ranks 4, 2 start before rank 0, ranks 1, 3 after it.
    let mut joiners = vec![
        spawn_join(config(4, 5, &addr, &s, 5_000)),
        spawn_join(config(2, 5, &addr, &s, 5_000)),
    ];
    thread::sleep(Duration::from_millis(100));
    let server_cfg = config(0, 5, &addr, &s, 5_000);
    let server = thread::spawn(move || serve(&server_cfg, &id(42)));
    thread::sleep(Duration::from_millis(100));
    joiners.push(spawn_join(config(1, 5, &addr, &s, 5_000)));
    joiners.push(spawn_join(config(3, 5, &addr, &s, 5_000)));
    let mut ranks: Vec<u32> = joiners
        .into_iter()
        .map(|j| {
            let (group, got) = j.join().expect("no panic").expect("joins");
            assert_eq!(got, id(42));
            group.rank()
        })
        .collect();
    ranks.sort_unstable();
    assert_eq!(ranks, vec![1, 2, 3, 4]);
    assert_eq!(server.join().expect("no panic").expect("serves").ranks(), 5);
}

#[test]
fn a_peer_that_never_arrives_is_named_by_rank_0_within_its_timeout() {
    let s = secret(2);
    let (l, addr) = listener();
    let started = Instant::now();
    let err = serve_on(l, &config(0, 2, &addr, &s, 300), &id(0)).expect_err("nobody joins");
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(2), "took {waited:?}");
    match &err {
        RendezvousError::Missing {
            missing, refused, ..
        } => {
            assert_eq!(missing, &vec!["rank 1 (node-1)".to_string()]);
            assert_eq!(refused.total(), 0);
        }
        other => panic!("expected Missing, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.starts_with("rank 1 (node-1) did not join the rendezvous at 127.0.0.1:"),
        "{text}"
    );
}

#[test]
fn ranks_that_did_arrive_learn_which_rank_is_missing() {
    let s = secret(3);
    let (l, addr) = listener();
    let server_cfg = config(0, 3, &addr, &s, 600);
    let server = thread::spawn(move || serve_on(l, &server_cfg, &id(0)));
    let started = Instant::now();
    // Rank 1 comes, rank 2 (node-2) never does.
    let err = join(&config(1, 3, &addr, &s, 5_000)).expect_err("rank 2 is missing");
    assert!(started.elapsed() < Duration::from_secs(3));
    match &err {
        RendezvousError::Aborted { server, message } => {
            assert_eq!(server, "rank 0 (node-0)");
            assert!(
                message.contains("rank 2 (node-2) did not join"),
                "{message}"
            );
        }
        other => panic!("expected Aborted, got {other:?}"),
    }
    let served = server.join().expect("no panic");
    assert!(
        matches!(served, Err(RendezvousError::Missing { ref missing, .. }) if missing == &vec!["rank 2 (node-2)".to_string()])
    );
}

#[test]
fn a_joining_rank_without_rank_0_names_it_within_its_timeout() {
    let addr = free_addr();
    let started = Instant::now();
    let err = join(&config(1, 2, &addr, &secret(4), 400)).expect_err("nobody listens");
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(2), "took {waited:?}");
    match &err {
        RendezvousError::Unreachable { server, last, .. } => {
            assert_eq!(server, "rank 0 (node-0)");
            assert!(!last.is_empty());
        }
        other => panic!("expected Unreachable, got {other:?}"),
    }
    assert!(
        err.to_string()
            .starts_with("could not reach rank 0 (node-0) at 127.0.0.1:")
    );
}

#[test]
fn a_stranger_with_another_secret_is_refused_by_name_and_does_not_count() {
    let good = secret(5);
    let (l, addr) = listener();
    let server_cfg = config(0, 2, &addr, &good, 3_000);
    let server = thread::spawn(move || serve_on(l, &server_cfg, &id(8)));
    let stranger = join(&config(1, 2, &addr, &secret(6), 3_000)).expect_err("wrong secret");
    assert!(
        matches!(
            stranger,
            RendezvousError::Rejected {
                why: Some(RefusalKind::WrongSecret),
                ..
            }
        ),
        "{stranger:?}"
    );
    assert!(
        stranger.to_string().contains("wrong secret or group"),
        "{stranger}"
    );
    // The real rank 1 still gets in after the stranger was turned away.
    let (_, got) = join(&config(1, 2, &addr, &good, 3_000)).expect("the real rank joins");
    assert_eq!(got, id(8));
    let group = server.join().expect("no panic").expect("serves");
    let refused = &group.admission().refusals;
    assert_eq!(
        (refused.of(RefusalKind::WrongSecret), refused.total()),
        (1, 1)
    );
}

#[test]
fn the_secret_of_one_group_does_not_admit_a_rank_into_another_group() {
    let s = secret(5);
    let (l, addr) = listener();
    let server_cfg = config(0, 2, &addr, &s, 400);
    let server = thread::spawn(move || serve_on(l, &server_cfg, &id(8)));
    let mut other = config(1, 2, &addr, &s, 3_000);
    other.group = "run-1/round-0/pair-1".into();
    let err = join(&other).expect_err("other group");
    assert!(matches!(err, RendezvousError::Rejected { .. }), "{err:?}");
    let served = server
        .join()
        .expect("no panic")
        .expect_err("nobody valid came");
    assert!(
        served.to_string().contains("1 connection(s) were refused"),
        "{served}"
    );
    match served {
        RendezvousError::Missing { refused, .. } => {
            assert_eq!(refused.of(RefusalKind::WrongSecret), 1)
        }
        other => panic!("expected Missing, got {other:?}"),
    }
}

#[test]
fn a_rank_outside_the_group_is_refused_even_with_the_secret() {
    let s = secret(5);
    let (l, addr) = listener();
    let server_cfg = config(0, 2, &addr, &s, 400);
    let server = thread::spawn(move || serve_on(l, &server_cfg, &id(8)));
    // A rank of a group of 3 presents rank 2; this group has 2 ranks (and says so in the tag).
    let err = join(&config(2, 3, &addr, &s, 3_000)).expect_err("rank 2 of 2");
    assert!(
        matches!(
            err,
            RendezvousError::Rejected {
                why: Some(RefusalKind::WrongSecret),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(server.join().expect("no panic").is_err());
}

#[test]
fn a_silent_connection_does_not_hold_up_the_real_ranks() {
    let s = secret(11);
    let (l, addr) = listener();
    let server_cfg = config(0, 2, &addr, &s, 3_000);
    let server = thread::spawn(move || serve_on(l, &server_cfg, &id(9)));
    // Connects and never says anything.
    let _silent = TcpStream::connect(&addr).expect("connect");
    let started = Instant::now();
    let (_, got) = join(&config(1, 2, &addr, &s, 3_000)).expect("joins past the silent one");
    assert_eq!(got, id(9));
    assert!(started.elapsed() < Duration::from_secs(1));
    server.join().expect("no panic").expect("serves");
}

#[test]
fn an_impostor_rank_0_without_the_secret_is_detected() {
    let (l, addr) = listener();
    let impostor = thread::spawn(move || {
        let (mut stream, _) = l.accept().expect("accept");
        stream
            .write_all(&wire::challenge(&[0u8; NONCE]))
            .expect("challenge");
        let mut hello = [0u8; HELLO_LEN];
        stream.read_exact(&mut hello).expect("hello");
        // An id frame as rank 0 would send it, sealed with a key the impostor made up.
        let head = Head {
            kind: Kind::Id as u8,
            seq: 0,
            len: (ID_BYTES + session::SEAL_TAG) as u32,
        };
        let mut reply = head.encode().to_vec();
        reply.extend_from_slice(&[0xAB; ID_BYTES + session::SEAL_TAG]);
        stream.write_all(&reply).expect("reply");
    });
    let err = join(&config(1, 2, &addr, &secret(12), 3_000)).expect_err("forged id");
    assert!(
        matches!(
            err,
            RendezvousError::Unauthenticated {
                why: FrameError::Tampered { seq: 0 },
                ..
            }
        ),
        "{err:?}"
    );
    impostor.join().expect("no panic");
}

#[test]
fn a_server_that_is_not_a_rendezvous_is_reported_as_such() {
    let (l, addr) = listener();
    let other = thread::spawn(move || {
        let (mut stream, _) = l.accept().expect("accept");
        stream
            .write_all(b"HTTP/1.1 400 Bad Request\r\n\r\nxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx")
            .expect("write");
    });
    let err = join(&config(1, 2, &addr, &secret(12), 3_000)).expect_err("not a rendezvous");
    assert!(
        err.to_string().contains("is not a gpufabric rendezvous"),
        "{err}"
    );
    other.join().expect("no panic");
}

fn group_of(n: usize, s: &Secret) -> Vec<Group> {
    let (l, addr) = listener();
    let server_cfg = config(0, n, &addr, s, 5_000);
    let server = thread::spawn(move || serve_on(l, &server_cfg, &id(0)));
    let joiners: Vec<_> = (1..n as u32)
        .map(|r| spawn_join(config(r, n, &addr, s, 5_000)))
        .collect();
    let mut groups = vec![server.join().expect("no panic").expect("serves")];
    for j in joiners {
        groups.push(j.join().expect("no panic").expect("joins").0);
    }
    groups
}

#[test]
fn all_gather_gives_every_rank_every_contribution_by_rank() {
    let groups = group_of(3, &secret(13));
    let handles: Vec<_> = groups
        .into_iter()
        .map(|mut g| {
            thread::spawn(move || {
                let mine = format!("from {}", g.rank()).into_bytes();
                let first = g.all_gather(&mine, Duration::from_secs(5));
                let second = g.all_gather(&[g.rank() as u8; 3], Duration::from_secs(5));
                g.barrier(Duration::from_secs(5)).map(|()| (first, second))
            })
        })
        .collect();
    for h in handles {
        let (first, second) = h.join().expect("no panic").expect("barrier");
        assert_eq!(
            first.expect("first gather"),
            vec![b"from 0".to_vec(), b"from 1".to_vec(), b"from 2".to_vec()]
        );
        assert_eq!(
            second.expect("second gather"),
            vec![vec![0u8; 3], vec![1u8; 3], vec![2u8; 3]]
        );
    }
}

#[test]
fn a_rank_that_never_reaches_the_barrier_is_named() {
    let mut groups = group_of(3, &secret(14));
    let late = groups.pop().expect("rank 2");
    let mut rank1 = groups.pop().expect("rank 1");
    let mut rank0 = groups.pop().expect("rank 0");
    let r1 = thread::spawn(move || rank1.barrier(Duration::from_millis(1_500)));
    let started = Instant::now();
    let err = rank0
        .barrier(Duration::from_millis(300))
        .expect_err("rank 2 never comes");
    assert!(started.elapsed() < Duration::from_secs(2));
    let text = err.to_string();
    assert!(
        text.starts_with("barrier on group run-1/round-0/pair-0: rank 2 (node-2) did not arrive"),
        "{text}"
    );
    // Rank 0 gave up, so rank 1 hears nothing either and names rank 0.
    let err1 = r1.join().expect("no panic").expect_err("no release");
    assert!(err1.to_string().contains("rank 0 (node-0)"), "{err1}");
    drop(late);
}

#[test]
fn an_oversized_contribution_is_refused_before_sending() {
    let mut groups = group_of(2, &secret(15));
    let err = groups[1]
        .all_gather(&vec![0u8; MAX_GATHER_BYTES + 1], Duration::from_secs(1))
        .expect_err("too big");
    assert!(matches!(err, RendezvousError::Config(_)), "{err:?}");
}

#[test]
fn secrets_round_trip_as_hex_and_bad_ones_are_refused() {
    let s = Secret::generate().expect("random");
    let hex = s.to_hex();
    assert_eq!(hex.len(), 64);
    assert_eq!(Secret::from_hex(&hex).expect("parses").0, s.0);
    assert_ne!(Secret::generate().expect("random").0, s.0);
    assert!(Secret::from_hex("abcd").is_err(), "too short");
    assert!(Secret::from_hex(&"zz".repeat(16)).is_err(), "not hex");
    assert!(Secret::from_hex(&"a".repeat(33)).is_err(), "odd length");
    assert!(
        !format!("{s:?}").contains(&hex[..8]),
        "Debug hides the secret"
    );
}

#[test]
fn settings_that_cannot_work_are_refused_up_front() {
    let s = secret(1);
    let err = join(&config(2, 2, "127.0.0.1:1", &s, 100)).expect_err("rank 2 of 2");
    assert!(
        err.to_string().contains("rank 2 is outside a group of 2"),
        "{err}"
    );
    let err = join(&config(0, 2, "127.0.0.1:1", &s, 100)).expect_err("rank 0 joins");
    assert!(matches!(err, RendezvousError::Config(_)));
    let (l, addr) = listener();
    let err = serve_on(l, &config(0, 1, &addr, &s, 100), &id(0)).expect_err("alone");
    assert!(err.to_string().contains("at least 2 ranks"), "{err}");
    let (l, addr) = listener();
    let err = serve_on(l, &config(1, 2, &addr, &s, 100), &id(0)).expect_err("rank 1 serves");
    assert!(matches!(err, RendezvousError::Config(_)));
}

/// Edits one direction's sealed frames as they pass: called with the frame's index in its
/// direction and its bytes (head and body), returns the bytes to pass on.
type Edit = Box<dyn FnMut(usize, Vec<u8>) -> Vec<u8> + Send>;

fn pass() -> Edit {
    Box::new(|_, frame| frame)
}

/// Copies the first `raw` bytes (the handshake) from `from` to `to`, then each sealed frame
/// through `edit`; everything written to `to` is also kept in `seen`.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    raw: usize,
    mut edit: Edit,
    seen: Arc<Mutex<Vec<u8>>>,
) {
    let forward = |bytes: &[u8], to: &mut TcpStream| {
        seen.lock().expect("lock").extend_from_slice(bytes);
        to.write_all(bytes).is_ok()
    };
    let mut hello = vec![0u8; raw];
    if from.read_exact(&mut hello).is_err() || !forward(&hello, &mut to) {
        let _ = to.shutdown(Shutdown::Both);
        return;
    }
    for index in 0.. {
        let mut head = [0u8; HEAD_LEN];
        if from.read_exact(&mut head[..1]).is_err() {
            break;
        }
        if head[0] == REFUSED {
            let mut code = [0u8; 1];
            let _ = from.read_exact(&mut code);
            forward(&[REFUSED, code[0]], &mut to);
            break;
        }
        if from.read_exact(&mut head[1..]).is_err() {
            break;
        }
        let mut body = vec![0u8; Head::decode(&head).len as usize];
        if from.read_exact(&mut body).is_err() {
            break;
        }
        let mut frame = head.to_vec();
        frame.extend_from_slice(&body);
        if !forward(&edit(index, frame), &mut to) {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
}

/// Someone on the pod network between one joining rank and rank 0 at `upstream`: the rank
/// connects to the returned address. Returns also every byte that reached the rank.
fn man_in_the_middle(
    upstream: String,
    to_rank0: Edit,
    to_rank: Edit,
) -> (String, Arc<Mutex<Vec<u8>>>) {
    let (l, addr) = listener();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_by_rank = seen.clone();
    thread::spawn(move || {
        let (rank, _) = l.accept().expect("the rank connects");
        let rank0 = TcpStream::connect(&upstream).expect("rank 0 listens");
        let (rank_in, rank0_in) = (
            rank.try_clone().expect("clone"),
            rank0.try_clone().expect("clone"),
        );
        let up = thread::spawn(move || {
            pump(
                rank_in,
                rank0_in,
                HELLO_LEN,
                to_rank0,
                Arc::new(Mutex::new(Vec::new())),
            )
        });
        pump(rank0, rank, CHALLENGE_LEN, to_rank, seen_by_rank);
        let _ = up.join();
    });
    (addr, seen)
}

/// Rank 0 serving `id(5)` on a pair, and rank 1 joined through a man in the middle.
fn pair_through(to_rank0: Edit, to_rank: Edit) -> (Group, Joined, Arc<Mutex<Vec<u8>>>) {
    let s = secret(21);
    let (l, addr) = listener();
    let server_cfg = config(0, 2, &addr, &s, 3_000);
    let server = thread::spawn(move || serve_on(l, &server_cfg, &id(5)));
    let (relay, seen) = man_in_the_middle(addr, to_rank0, to_rank);
    let joined = join(&config(1, 2, &relay, &s, 3_000));
    let group = server.join().expect("no panic").expect("rank 0 serves");
    (group, joined, seen)
}

#[test]
fn the_nccl_id_never_crosses_the_network_in_clear() {
    let (_rank0, joined, seen) = pair_through(pass(), pass());
    let (_, got) = joined.expect("rank 1 joins through a relay that changes nothing");
    assert_eq!(got, id(5));
    let seen = seen.lock().expect("lock").clone();
    assert!(seen.len() > CHALLENGE_LEN + ID_BYTES, "the id frame passed");
    let id = id(5);
    assert!(
        !seen.windows(16).any(|w| id.windows(16).any(|i| i == w)),
        "16 bytes of the id appear on the wire"
    );
}

#[test]
fn an_id_frame_altered_on_the_way_is_refused_by_the_joining_rank() {
    let flip_last: Edit = Box::new(|_, mut frame| {
        if let Some(b) = frame.last_mut() {
            *b ^= 1;
        }
        frame
    });
    let (_rank0, joined, _) = pair_through(pass(), flip_last);
    let err = joined.expect_err("the altered id is refused");
    assert!(
        matches!(
            err,
            RendezvousError::Unauthenticated {
                why: FrameError::Tampered { seq: 0 },
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn a_tampered_frame_is_refused_and_names_its_sender() {
    let flip_first_body_byte: Edit = Box::new(|_, mut frame| {
        frame[HEAD_LEN] ^= 0x80;
        frame
    });
    let (mut rank0, joined, _) = pair_through(flip_first_body_byte, pass());
    let (mut rank1, _) = joined.expect("rank 1 joins");
    let r1 = thread::spawn(move || rank1.all_gather(b"my numbers", Duration::from_secs(2)));
    let err = rank0
        .all_gather(b"rank 0's", Duration::from_secs(2))
        .expect_err("the altered contribution is refused");
    match &err {
        RendezvousError::Frame {
            step, from, why, ..
        } => {
            assert_eq!((*step, from.as_str()), ("all_gather", "rank 1 (node-1)"));
            assert!(matches!(why, FrameError::Tampered { seq: 0 }), "{why:?}");
        }
        other => panic!("expected Frame, got {other:?}"),
    }
    assert!(err.to_string().contains("fails authentication"), "{err}");
    drop(rank0);
    assert!(r1.join().expect("no panic").is_err());
}

#[test]
fn a_replayed_frame_is_refused_and_named() {
    // The relay passes rank 1's first frame, then sends it again in place of the second.
    let mut first: Option<Vec<u8>> = None;
    let replay: Edit = Box::new(move |i, frame| match (i, &first) {
        (0, _) => {
            first = Some(frame.clone());
            frame
        }
        (_, Some(old)) => old.clone(),
        (_, None) => frame,
    });
    let (mut rank0, joined, _) = pair_through(replay, pass());
    let (mut rank1, _) = joined.expect("rank 1 joins");
    let r1 = thread::spawn(move || {
        rank1.barrier(Duration::from_secs(2))?;
        rank1.barrier(Duration::from_secs(2))
    });
    rank0
        .barrier(Duration::from_secs(2))
        .expect("the first barrier passes");
    let err = rank0
        .barrier(Duration::from_secs(2))
        .expect_err("the replayed frame is refused");
    match &err {
        RendezvousError::Frame { from, why, .. } => {
            assert_eq!(from, "rank 1 (node-1)");
            assert!(
                matches!(why, FrameError::OutOfSequence { got: 0, want: 1 }),
                "{why:?}"
            );
        }
        other => panic!("expected Frame, got {other:?}"),
    }
    assert!(err.to_string().contains("replayed"), "{err}");
    drop(rank0);
    assert!(r1.join().expect("no panic").is_err());
}

#[test]
fn a_flood_of_connections_beyond_the_cap_keeps_rank_0_bounded_and_lets_the_ranks_in() {
    let s = secret(22);
    let (l, addr) = listener();
    let server_cfg = config(0, 3, &addr, &s, 10_000);
    let cap = slots(&server_cfg);
    let server = thread::spawn(move || serve_on(l, &server_cfg, &id(6)));
    // Three times as many silent connections as rank 0 holds handshakes, all kept open.
    let flood: Vec<TcpStream> = (0..3 * cap)
        .map(|_| TcpStream::connect(&addr).expect("a flood connection"))
        .collect();
    thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let joiners = [1, 2].map(|r| spawn_join(config(r, 3, &addr, &s, 10_000)));
    for j in joiners {
        let (_, got) = j.join().expect("no panic").expect("a real rank gets in");
        assert_eq!(got, id(6));
    }
    // Well before the flood's handshakes would have timed out.
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(3), "took {waited:?}");
    let group = server.join().expect("no panic").expect("serves");
    let admission = group.admission();
    assert!(
        admission.peak_handshakes <= cap,
        "{} handshakes at once, cap {cap}",
        admission.peak_handshakes
    );
    let crowded = admission.refusals.of(RefusalKind::Crowded);
    assert!(crowded >= 2 * cap as u32, "{crowded} crowded out");
    drop(flood);
}

#[test]
fn a_rank_of_another_protocol_version_is_refused_by_name() {
    let s = secret(23);
    let (l, addr) = listener();
    let server_cfg = config(0, 2, &addr, &s, 600);
    let server = thread::spawn(move || serve_on(l, &server_cfg, &id(7)));
    let mut old = TcpStream::connect(&addr).expect("connect");
    let mut challenge = [0u8; CHALLENGE_LEN];
    old.read_exact(&mut challenge).expect("challenge");
    assert_eq!((&challenge[..4], challenge[4]), (&MAGIC[..], VERSION));
    let mut hello = vec![0u8; HELLO_LEN];
    hello[..4].copy_from_slice(MAGIC);
    hello[4] = 1;
    hello[8] = 1;
    old.write_all(&hello).expect("hello");
    let mut answer = [0u8; 2];
    old.read_exact(&mut answer).expect("a refusal");
    assert_eq!(
        (answer[0], RefusalKind::from_code(answer[1])),
        (REFUSED, Some(RefusalKind::Version))
    );
    match server.join().expect("no panic") {
        Err(RendezvousError::Missing { refused, .. }) => {
            assert_eq!(refused.of(RefusalKind::Version), 1);
            assert!(
                refused
                    .to_string()
                    .contains("another rendezvous protocol version")
            );
        }
        other => panic!("expected Missing, got {other:?}"),
    }
}

#[test]
fn a_rank_0_of_another_protocol_version_is_named_by_the_joining_rank() {
    let (l, addr) = listener();
    let old = thread::spawn(move || {
        let (mut stream, _) = l.accept().expect("accept");
        let mut challenge = wire::challenge(&[1u8; NONCE]);
        challenge[4] = 1;
        stream.write_all(&challenge).expect("challenge");
        // Hold the connection until the rank has read it.
        let _ = stream.read(&mut [0u8; 1]);
    });
    let err = join(&config(1, 2, &addr, &secret(24), 3_000)).expect_err("version 1");
    assert!(
        matches!(err, RendezvousError::Version { theirs: 1, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("speaks rendezvous protocol version 1, this agent speaks 2"),
        "{err}"
    );
    old.join().expect("no panic");
}
