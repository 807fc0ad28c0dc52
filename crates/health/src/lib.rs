//! Pure functions: result documents + policy -> findings, per-node verdicts, node history
//! and quarantine plans. No I/O, no Kubernetes client, no async. The rules, in the order
//! they apply, are in this crate's README.md.

#![forbid(unsafe_code)]

pub mod evaluate;
pub mod fleet;
pub mod history;
pub mod nics;
pub mod pairs;
pub mod profiles;
pub mod quarantine;

pub use evaluate::{Evaluation, NodeInput, NodeOutcome, evaluate};
pub use quarantine::{ClusterCap, Guards, Hold, NodeFacts, Plan, Storm, plan, plan_guarded};
