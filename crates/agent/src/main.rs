//! `fabric-agent`: runs the GPU fabric checks on one node and writes the result document.
fn main() {}
