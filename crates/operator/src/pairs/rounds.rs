//! Rounds of node pairs: the planner lives with the localization rules
//! ([`gpufabric_health::pairs::rounds`]), so that the rounds the operator runs can be
//! rehearsed without it.

pub use gpufabric_health::pairs::rounds::*;
