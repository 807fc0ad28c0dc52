//! `kubectl gpufabric`: what gpufabric found and holds, as tables, JSON or YAML, and the
//! annotations that ask it to act. Pure: views built from the API objects and rendered,
//! no client (`main.rs` fetches, this renders); the demo prints the same tables. A run's
//! report is also one HTML page (`html`).

#![forbid(unsafe_code)]

pub mod doc;
pub mod exit;
pub mod findings;
pub mod gpus_out;
pub mod html;
pub mod jsonpath;
pub mod node;
pub mod output;
pub mod reach;
pub mod report;
pub mod request;
pub mod status;
pub mod version;

pub use output::{Format, OUTPUTS, Output, View, render};

#[cfg(test)]
mod fixtures;
