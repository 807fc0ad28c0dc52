//! Node-pair tests of a run: which nodes meet in which round, and the pods of a pair
//! (pure, no client).

pub mod phase;
pub mod pods;
pub mod rank;
pub mod rounds;

pub use rounds::{NodePair, PairSet, Round, RoundPlan, plan_rounds};
