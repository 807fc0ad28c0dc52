//! What the tests of the multi-node subcommands share: the secret, a free port for rank 0,
//! and the agent started without the environment a pod would give it.

use std::net::TcpListener;
use std::process::Command;

/// The rendezvous secret of every test rank.
pub const SECRET: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/// A free loopback `host:port`: bound, then released for rank 0.
pub fn free_addr() -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("address").to_string()
}

/// `fabric-agent` with none of the `FABRIC_*` settings of the environment it runs in.
pub fn agent() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fabric-agent"));
    for var in [
        "FABRIC_BACKEND",
        "FABRIC_SIM_FLEET",
        "FABRIC_NODE_NAME",
        "FABRIC_RENDEZVOUS",
        "FABRIC_RENDEZVOUS_SECRET",
        "FABRIC_GROUP",
        "FABRIC_RANK",
        "FABRIC_PAIR_NODES",
        "RUST_LOG",
    ] {
        cmd.env_remove(var);
    }
    cmd
}
