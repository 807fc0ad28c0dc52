//! The probe's optional timeline of one step, for comparing it with a profiler trace of
//! PyTorch DDP.

use crate::cuda::gpu::Event;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;

/// One step's operations on one GPU, each between two events on its stream.
pub(super) struct Trace {
    pub(super) on: AtomicBool,
    pub(super) ops: Mutex<Vec<TracedOp>>,
}

pub(super) struct TracedOp {
    pub(super) name: String,
    pub(super) comm: bool,
    pub(super) start: Event,
    pub(super) end: Event,
}

/// One traced operation: on the comm stream or the compute stream, start and duration
/// in ms from the step's start.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TraceLine {
    pub name: String,
    pub comm: bool,
    pub start_ms: f64,
    pub dur_ms: f64,
}

/// The trace as text: one line per operation, then the total time per kind of operation
/// (the name up to its index: `fwd`, `wgrad`, `allreduce b`, ...).
pub(crate) fn trace_lines(ops: &[TraceLine]) -> Vec<String> {
    let mut lines = Vec::new();
    let mut sums: Vec<(String, f64, u32)> = Vec::new();
    for op in ops {
        let stream = if op.comm { "comm" } else { "compute" };
        lines.push(format!(
            "{stream:<7} {:<14} start {:8.3} ms  dur {:7.3} ms",
            op.name, op.start_ms, op.dur_ms
        ));
        let kind: String = op
            .name
            .chars()
            .take_while(|c| c.is_alphabetic() || *c == '-')
            .collect();
        match sums.iter_mut().find(|(k, _, _)| *k == kind) {
            Some(e) => {
                e.1 += op.dur_ms;
                e.2 += 1;
            }
            None => sums.push((kind, op.dur_ms, 1)),
        }
    }
    for (kind, total, n) in sums {
        lines.push(format!("sum     {kind:<14} {n:2} x  total {total:7.3} ms"));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_lines_list_every_operation_then_the_time_per_kind() {
        let op = |name: &str, comm, start_ms, dur_ms| TraceLine {
            name: name.into(),
            comm,
            start_ms,
            dur_ms,
        };
        let lines = trace_lines(&[
            op("wgrad 1", false, 0.0, 1.0),
            op("allreduce b0", true, 1.0, 2.0),
            op("wgrad 0", false, 1.0, 0.5),
        ]);
        assert_eq!(lines.len(), 5);
        assert!(lines[1].starts_with("comm    allreduce b0"), "{}", lines[1]);
        assert!(lines[1].contains("start    1.000 ms  dur   2.000 ms"));
        assert!(lines[3].contains("wgrad") && lines[3].contains(" 2 x  total   1.500 ms"));
        assert!(lines[4].contains("allreduce") && lines[4].contains(" 1 x  total   2.000 ms"));
    }
}
