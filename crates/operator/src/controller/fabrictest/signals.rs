//! The node signals of the folded runs, written once the test's status (and with it every
//! quarantine) is: those the fold decided, and, when the status names a last run whose
//! signals this process did not write (it started or took the lead since the fold), those
//! decided again from the folded status.

use super::fold::results_of;
use crate::context::Context;
use crate::quarantine::Breaker;
use crate::signals::pending::{self, Pending};
use gpufabric_api::run::{FabricTestRun, NodeRunResult};
use gpufabric_api::test::{FabricTest, FabricTestStatus};
use kube::{Resource, ResourceExt};

/// Writes the signals of the runs folded into `status` (written already) that this
/// process has not written: `decided`, the fold's own, when the signals of the run folded
/// before (`previous`) were written here; else every node's decided again from `status`
/// first (the fold's own for its runs). Nothing decided again while the breaker is open.
pub(super) async fn write_after_status(
    test: &FabricTest,
    status: &FabricTestStatus,
    previous: Option<&str>,
    decided: Vec<Pending>,
    runs: &[FabricTestRun],
    ctx: &Context,
) {
    let (Some(uid), Some(last)) = (test.uid(), status.last_run.as_ref()) else {
        return;
    };
    let written = &ctx.signals_written;
    if written.holds(&uid, &last.name) {
        return;
    }
    let caught_up = previous.is_none_or(|p| written.holds(&uid, p));
    let mut batches = Vec::new();
    if !caught_up && !Breaker::from_conditions(&status.conditions).open {
        let began = std::time::Instant::now();
        let finished: Vec<(FabricTestRun, Vec<NodeRunResult>)> = runs
            .iter()
            .filter(|r| !decided.iter().any(|d| d.run == r.name_any()))
            .filter(|r| r.status.as_ref().is_some_and(|s| s.phase.is_finished()))
            .filter_map(|r| Some((r.clone(), results_of(ctx, r)?)))
            .collect();
        let again = pending::redecided(test, status, &finished, &ctx.nodes);
        tracing::info!(
            runs = again.len(),
            nodes = again.iter().map(|p| p.signals.len()).sum::<usize>(),
            took_ms = began.elapsed().as_millis(),
            "node signals decided again from the folded status"
        );
        batches.extend(again);
    }
    batches.extend(decided);
    for batch in batches {
        write_batch(test, batch, ctx).await;
    }
    written.record(&uid, &last.name);
}

/// Writes one run's signals ([`crate::signals::write`], a bounded number of nodes at
/// once, each under its node's resourceVersion) and its trend records without signals. A
/// node that cannot be written is logged and reported in one Event; nothing else waits on
/// it. A trend record is best effort: one not written misses a point.
async fn write_batch(test: &FabricTest, batch: Pending, ctx: &Context) {
    let began = std::time::Instant::now();
    let Pending {
        run,
        signals,
        trends,
    } = batch;
    let (nodes, metadata, conditions) = (
        signals.len(),
        signals.iter().filter(|s| s.metadata.is_some()).count(),
        signals.iter().filter(|s| s.condition.is_some()).count(),
    );
    let published = crate::signals::write(&ctx.client, &ctx.nodes, signals).await;
    tracing::info!(
        run = %run,
        nodes,
        metadata,
        conditions,
        took_ms = began.elapsed().as_millis(),
        "node signals written"
    );
    for failure in crate::trend::write(&ctx.client, trends).await {
        tracing::warn!(%failure, "trend point not recorded");
    }
    if published.failures.is_empty() {
        return;
    }
    let note = format!(
        "{run}: could not write the signals of {} node(s): {}",
        published.failures.len(),
        published.failures.join("; ")
    );
    tracing::warn!(%note, "node signals not written");
    ctx.events
        .warning(&test.object_ref(&()), "SignalsNotWritten", "Signal", note)
        .await;
}
