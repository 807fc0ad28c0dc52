//! The GPU, not the node: which of a node plan's quarantines and releases act on single GPUs
//! through DRA device taints, and which GPUs to taint. Pure: the operator's device-taint
//! writer carries it out.
//!
//! It runs after [`crate::quarantine::plan_guarded`], so that every rule of the node plan
//! (breaker, budget, confirmation, hysteresis, ownership, cluster cap) holds for a GPU as for
//! a node. The budget is counted in both: the node plan was told which candidates taint
//! GPUs instead ([`GpuNode::taints_instead`], [`crate::quarantine::GpuHold`]), so that a
//! GPU tainted alone takes one GPU of the GPU budget and no node, and a node quarantined as
//! a node one node. Rules, in the order they apply:
//! 1. **Per GPU** is a node whose GPUs are DRA devices ([`GpuNode::devices`] not empty: the
//!    cluster serves DeviceTaintRules and the GPU driver publishes the node's GPUs). Every
//!    other node is handled per node, as the node plan says.
//! 2. **Quarantine**: a node the node plan quarantines, per GPU, whose run found only
//!    GPU-level faults ([`GpuNode::faults`]), each on a GPU that is a device, has those GPUs
//!    tainted and leaves the node plan's quarantine list: the node stays schedulable.
//! 3. **Half**: when the node's tainted GPUs would be more than half of its GPUs, the node is
//!    quarantined as a node instead ([`Escalation::MoreThanHalf`]), and its GPU taints go.
//! 4. **Release**: a node the node plan releases that the test holds per GPU has its GPU
//!    taints removed, and leaves the node plan's release list (nothing on the node changes).
//! 5. **Held and failing again**: a node the test holds per GPU that this run measured
//!    failing (at the node plan's hysteresis) while the plan may act: new GPU-level faults
//!    taint their GPUs too (rule 3 applies); a fault that is not GPU-level quarantines the
//!    node ([`Escalation::NodeLevel`]) and its GPU taints go.
//! 6. **Budget of a held node**: the new taints of rule 5 need room in the GPU budget, all
//!    of them or none ([`Hold::OverGpuBudget`]); its escalation to a node needs a node of the
//!    node budget and of the cluster cap ([`Hold::OverBudget`], [`Hold::ClusterCap`]). A
//!    node refused keeps the GPUs it has tainted, and the refusal is in the plan's
//!    `held_back`, reported as any node's.

use crate::quarantine::{Hold, Plan};
use std::collections::{BTreeMap, BTreeSet};

/// A GPU as a DRA device: the driver, the pool and the device's name in it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeviceRef {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

impl std::fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// A GPU-level fault of one GPU in this run: the taint's value and the finding's sentence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuFault {
    pub word: &'static str,
    pub reason: String,
}

/// What the GPU planner knows about one node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuNode {
    pub node: String,
    /// The node's GPUs, by index, as DRA devices; empty when the node is handled per node.
    pub devices: BTreeMap<u32, DeviceRef>,
    /// How many GPUs the node has (the most of its devices and its measured count).
    pub gpus: u32,
    /// The node's GPUs this test holds tainted now.
    pub tainted: BTreeSet<u32>,
    /// This run's faults of the node, by GPU, when every critical finding of the node is a
    /// GPU-level fault the run lists; None when any is not (a pair, the node, a crash) or
    /// the run did not list them all.
    pub faults: Option<BTreeMap<u32, GpuFault>>,
    /// The node was measured in this run and is failing at the policy's hysteresis.
    pub failing: bool,
    /// The test also holds the node as a node (its quarantine record is on the node).
    pub node_record: bool,
}

impl GpuNode {
    /// Rule 1: the node is handled per GPU.
    pub fn per_gpu(&self) -> bool {
        !self.devices.is_empty()
    }

    /// The faults of this run that rule 2 acts on per GPU: Some only when every faulty GPU
    /// is a device.
    fn gpu_faults(&self) -> Option<&BTreeMap<u32, GpuFault>> {
        self.faults
            .as_ref()
            .filter(|f| !f.is_empty() && f.keys().all(|g| self.devices.contains_key(g)))
    }

    /// Rule 3: tainting `more` GPUs would leave more than half the node's GPUs tainted.
    fn over_half(&self, more: usize) -> bool {
        (self.tainted.len() + more) * 2 > self.gpus as usize
    }

    /// Rules 1 to 3 for a node the node plan would quarantine now: how many more of its GPUs
    /// are tainted instead of the node; None when the node would be quarantined as a node.
    /// What the node plan counts against the GPU budget.
    pub fn taints_instead(&self) -> Option<u32> {
        let faults = self.gpu_faults().filter(|_| self.per_gpu())?;
        let new = faults.keys().filter(|g| !self.tainted.contains(g)).count();
        (!self.over_half(new)).then(|| u32::try_from(new).unwrap_or(u32::MAX))
    }
}

/// One GPU to taint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuTaint {
    pub node: String,
    pub gpu: u32,
    pub device: DeviceRef,
    pub fault: GpuFault,
}

/// Why a node handled per GPU is quarantined as a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Escalation {
    /// More than half its GPUs would be tainted (rule 3).
    MoreThanHalf { tainted: usize, gpus: u32 },
    /// A fault of the node that no one GPU explains (rule 5).
    NodeLevel,
}

impl Escalation {
    /// A short sentence for the node's Event.
    pub fn describe(self) -> String {
        match self {
            Escalation::MoreThanHalf { tainted, gpus } => format!(
                "{tainted} of its {gpus} GPUs at fault, more than half: the node is quarantined instead of its GPUs"
            ),
            Escalation::NodeLevel => {
                "a fault no single GPU explains: the node is quarantined instead of its GPUs"
                    .to_string()
            }
        }
    }
}

/// What to do per GPU now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuPlan {
    /// GPUs to taint now.
    pub taint: Vec<GpuTaint>,
    /// Nodes whose GPU taints (all of this test's on the node) go now.
    pub release: Vec<String>,
    /// Nodes quarantined as a node instead of per GPU, and why.
    pub escalated: Vec<(String, Escalation)>,
    /// Nodes handled per GPU (rule 1).
    pub per_gpu: Vec<String>,
    /// Nodes handled per node.
    pub per_node: Vec<String>,
    /// GPUs the test holds tainted once the plan is applied.
    pub tainted_after: usize,
    /// The GPU budget: most GPUs the test may hold tainted.
    pub budget: usize,
}

/// Splits `plan` (the node plan, after [`crate::quarantine::plan_guarded`]) into what acts
/// on GPUs and what acts on nodes, by the module's rules; `plan` keeps only what acts on
/// nodes. `nodes`: every node the node plan knows, with what DRA says of it.
pub fn split(plan: &mut Plan, nodes: &[GpuNode]) -> GpuPlan {
    let mut out = GpuPlan::default();
    let quarantine: BTreeSet<String> = plan.quarantine.iter().cloned().collect();
    let release: BTreeSet<String> = plan.release.iter().cloned().collect();
    let mut taint_instead: BTreeSet<String> = BTreeSet::new();
    let mut release_instead: BTreeSet<String> = BTreeSet::new();
    let mut tainted_after = 0usize;
    for n in nodes {
        if n.per_gpu() {
            out.per_gpu.push(n.node.clone());
        } else {
            out.per_node.push(n.node.clone());
        }
        let held = !n.tainted.is_empty();
        if release.contains(&n.node) {
            if held {
                out.release.push(n.node.clone());
                if !n.node_record {
                    release_instead.insert(n.node.clone());
                }
            }
            continue;
        }
        let newly = quarantine.contains(&n.node);
        let again = held && !newly && !n.node_record && n.failing && plan.enforcement.is_some();
        if !(newly || again) {
            tainted_after += n.tainted.len();
            continue;
        }
        let faults = n.gpu_faults().filter(|_| n.per_gpu());
        let new: Vec<(u32, &GpuFault)> = faults
            .map(|f| {
                f.iter()
                    .filter(|(g, _)| !n.tainted.contains(g))
                    .map(|(g, f)| (*g, f))
                    .collect()
            })
            .unwrap_or_default();
        let escalation = match faults {
            None if again => Some(Escalation::NodeLevel),
            None => None,
            Some(_) if n.over_half(new.len()) => Some(Escalation::MoreThanHalf {
                tainted: n.tainted.len() + new.len(),
                gpus: n.gpus,
            }),
            Some(_) => None,
        };
        match (faults, escalation) {
            (_, Some(e)) if again => match node_room(plan) {
                Some(hold) => {
                    plan.held_back.push((n.node.clone(), hold));
                    tainted_after += n.tainted.len();
                }
                None => {
                    out.escalated.push((n.node.clone(), e));
                    plan.quarantine.push(n.node.clone());
                    plan.quarantined_after += 1;
                    plan.held_in_cluster_after += 1;
                    plan.gpus_held_after = plan.gpus_held_after.saturating_sub(n.tainted.len());
                    out.release.push(n.node.clone());
                }
            },
            (_, Some(e)) => {
                out.escalated.push((n.node.clone(), e));
                if held {
                    out.release.push(n.node.clone());
                }
            }
            (Some(_), None)
                if again
                    && !new.is_empty()
                    && plan.gpus_held_after + new.len() > plan.gpu_budget =>
            {
                plan.held_back.push((n.node.clone(), Hold::OverGpuBudget));
                tainted_after += n.tainted.len();
            }
            (Some(_), None) => {
                if again {
                    plan.gpus_held_after += new.len();
                }
                if newly {
                    taint_instead.insert(n.node.clone());
                }
                tainted_after += n.tainted.len() + new.len();
                out.taint
                    .extend(new.into_iter().map(|(gpu, fault)| GpuTaint {
                        node: n.node.clone(),
                        gpu,
                        device: n.devices[&gpu].clone(),
                        fault: fault.clone(),
                    }));
            }
            // A node-level fault of a node not held: the node plan quarantines it.
            (None, None) => tainted_after += n.tainted.len(),
        }
    }
    plan.quarantine.retain(|n| !taint_instead.contains(n));
    plan.release.retain(|n| !release_instead.contains(n));
    plan.held_back.sort();
    out.tainted_after = tainted_after;
    out.budget = plan.gpu_budget;
    out
}

/// Rule 6: why a node held per GPU may not be quarantined as a node now, if it may not: the
/// node budget or the cluster cap is spent.
fn node_room(plan: &Plan) -> Option<Hold> {
    if plan.quarantined_after >= plan.budget {
        Some(Hold::OverBudget)
    } else if plan
        .cluster_cap
        .is_some_and(|cap| plan.held_in_cluster_after >= cap)
    {
        Some(Hold::ClusterCap)
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
