//! Rendezvous groups of a run without a client: the node pairs (which nodes meet in which
//! round, the pods of a pair) and the multi-node groups (`group`), with the rank pods and
//! rank documents all of them share.

pub mod group;
pub mod phase;
pub mod pods;
pub mod rank;
pub mod rounds;

pub use rounds::{NodePair, PairSet, Round, RoundPlan, plan_rounds};
