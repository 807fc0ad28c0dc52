//! `validate()`: every rule of the CRD schema again (so a test created before a schema change
//! still gets a clear error), plus what the schema cannot express: schedules that never
//! fire, time zones, node selectors no node can carry, duplicate collectives, and suites
//! that cannot finish within the agent's timeout. The operator calls it before it acts on a
//! FabricTest, and its admission webhook before the API server stores one; `warnings()`
//! says what is allowed but likely to go wrong.

pub mod estimate;
pub mod labels;
pub mod memory;

use crate::policy::Thresholds;
use crate::test::{CRON_MESSAGE, FabricTestSpec};
use chrono::{Datelike, NaiveDate};
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use estimate::{FASTEST, TYPICAL, estimate, seconds};
use std::collections::{BTreeMap, BTreeSet};

/// One problem with a FabricTest spec: the field (as a JSON path under `spec`) and what is
/// wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub field: String,
    pub message: String,
}

/// All problems found in a spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid FabricTest: {}", .problems.iter().map(|p| format!("{}: {}", p.field, p.message)).collect::<Vec<_>>().join("; "))]
pub struct ValidationError {
    pub problems: Vec<Problem>,
}

/// Why a schedule or its time zone cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("{} (got {:?})", CRON_MESSAGE, .0)]
    NotFiveFields(String),
    #[error("{} (got {:?}: {})", CRON_MESSAGE, .schedule, .reason)]
    Unparsable { schedule: String, reason: String },
    #[error(
        "schedule {0:?} never fires: none of its months has that day of the month (e.g. 31 February or 31 April); pick a day those months have"
    )]
    NeverFires(String),
    #[error(
        "timeZone {0:?} is not a known IANA time zone (for example \"UTC\" or \"Europe/Berlin\")"
    )]
    UnknownTimeZone(String),
}

/// Parses a schedule the way the operator runs it: 5 fields (no seconds, no year) or a
/// macro such as `@daily`; refuses one that never fires.
pub fn parse_schedule(schedule: &str) -> Result<Cron, ScheduleError> {
    let trimmed = schedule.trim();
    if !trimmed.starts_with('@') && trimmed.split_whitespace().count() != 5 {
        return Err(ScheduleError::NotFiveFields(schedule.to_string()));
    }
    let cron = CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
        .parse(trimmed)
        .map_err(|e| ScheduleError::Unparsable {
            schedule: schedule.to_string(),
            reason: e.to_string(),
        })?;
    if fires_on_some_day(&cron) {
        Ok(cron)
    } else {
        Err(ScheduleError::NeverFires(schedule.to_string()))
    }
}

/// Years searched for a matching day: 28 years repeat every (date, weekday) pair of the
/// Gregorian calendar between century years, leap days included.
/// Most graph launches per size (`suite.ncclSweep.graphLaunches`), as the CRD's schema says.
pub const MAX_GRAPH_LAUNCHES: u32 = 1000;

const SCHEDULE_YEARS: std::ops::RangeInclusive<i32> = 2024..=2051;

/// Whether some day of [`SCHEDULE_YEARS`] matches the day-of-month, month and day-of-week
/// fields, with croner's own rule (either day field when both are restricted). Every hour
/// and minute field that parses names at least one time of day, so a matching day fires.
fn fires_on_some_day(cron: &Cron) -> bool {
    let p = &cron.pattern;
    let Some(mut day) = NaiveDate::from_ymd_opt(*SCHEDULE_YEARS.start(), 1, 1) else {
        return true;
    };
    while SCHEDULE_YEARS.contains(&day.year()) {
        if p.month_match(day.month()).unwrap_or(false)
            && p.day_match(day.year(), day.month(), day.day())
                .unwrap_or(false)
        {
            return true;
        }
        match day.succ_opt() {
            Some(next) => day = next,
            None => return true,
        }
    }
    false
}

/// Parses a time zone name (IANA, e.g. "Europe/Berlin"); absent means UTC.
pub fn parse_time_zone(tz: Option<&str>) -> Result<chrono_tz::Tz, ScheduleError> {
    match tz {
        None => Ok(chrono_tz::UTC),
        Some(name) => name
            .parse::<chrono_tz::Tz>()
            .map_err(|_| ScheduleError::UnknownTimeZone(name.to_string())),
    }
}

struct Checker {
    problems: Vec<Problem>,
}

impl Checker {
    fn check(&mut self, ok: bool, field: &str, message: impl FnOnce() -> String) {
        if !ok {
            self.problems.push(Problem {
                field: field.to_string(),
                message: message(),
            });
        }
    }
}

/// `suite.ncclNodes`: a node count the termination message can carry, the collectives the
/// multi-node sweep runs, and a range of sizes.
fn check_nccl_nodes(c: &mut Checker, n: &crate::suite::NcclNodes) {
    use crate::suite::NcclNodes;
    c.check(
        (2..=MAX_NCCL_NODES).contains(&n.max_nodes),
        "suite.ncclNodes.maxNodes",
        || {
            format!(
                "must be 2 to {MAX_NCCL_NODES} (got {}): each rank's document carries every node count's summaries",
                n.max_nodes
            )
        },
    );
    c.check(
        !n.collectives.is_empty(),
        "suite.ncclNodes.collectives",
        || "must name at least one collective".into(),
    );
    if let Some(other) = n
        .collectives
        .iter()
        .find(|c| !NcclNodes::COLLECTIVES.contains(c))
    {
        c.check(false, "suite.ncclNodes.collectives", || {
            format!(
                "{} is not run over nodes; use allReduce, allGather, reduceScatter or allToAll",
                other.api_name()
            )
        });
    }
    c.check(
        n.min_bytes >= 1 && n.min_bytes <= n.max_bytes,
        "suite.ncclNodes.minBytes",
        || {
            format!(
                "must be between 1 and maxBytes ({}), got {}",
                n.max_bytes, n.min_bytes
            )
        },
    );
    c.check(n.step_factor >= 2, "suite.ncclNodes.stepFactor", || {
        format!("must be at least 2 (got {})", n.step_factor)
    });
    c.check(n.large_bytes >= 1, "suite.ncclNodes.largeBytes", || {
        "must be at least 1".into()
    });
    c.check(n.iters >= 1, "suite.ncclNodes.iters", || {
        "must be at least 1".into()
    });
}

/// Most nodes of the multi-node NCCL sweep: its document, with every node count's summaries,
/// still fits a termination message at this many.
pub const MAX_NCCL_NODES: u32 = 1024;

/// Checks a FabricTest spec. Returns every problem at once, each with its field.
pub fn validate(spec: &FabricTestSpec) -> Result<(), ValidationError> {
    let mut c = Checker {
        problems: Vec::new(),
    };
    check_when_and_where(&mut c, spec);
    check_suite(&mut c, spec);
    check_thresholds(&mut c, &spec.thresholds);
    check_bandwidth_reach(&mut c, spec);
    check_copy_reach(&mut c, spec);
    check_quarantine_and_agent(&mut c, spec);
    check_limits(&mut c, spec);
    if c.problems.is_empty() {
        Ok(())
    } else {
        Err(ValidationError {
            problems: c.problems,
        })
    }
}

/// What is allowed but likely to go wrong, one sentence each: a suite whose typical time
/// on a node comes close to `agent.timeoutSeconds` (see [`estimate`]).
pub fn warnings(spec: &FabricTestSpec) -> Vec<String> {
    let mut said = suite_warnings(spec);
    if let Some(d) = spec.limits.max_duration_seconds
        && d < spec.agent.timeout_seconds
    {
        said.push(format!(
            "limits.maxDurationSeconds ({d} s) is below agent.timeoutSeconds ({} s): a run may stop before its slowest node is done, and that node is not measured",
            spec.agent.timeout_seconds
        ));
    }
    said
}

fn suite_warnings(spec: &FabricTestSpec) -> Vec<String> {
    let timeout = f64::from(spec.agent.timeout_seconds);
    let typical = estimate(&spec.suite, &TYPICAL);
    let total = typical.total_s();
    let said = format!(
        "suite: estimated at {} on {} ({})",
        seconds(total),
        TYPICAL.name,
        typical.breakdown()
    );
    if total > timeout {
        vec![format!(
            "{said}, more than agent.timeoutSeconds ({timeout} s): the benchmark pods will likely time out; lower the suite's sizes, iterations or steps, or raise agent.timeoutSeconds"
        )]
    } else if total > timeout / 2.0 {
        vec![format!(
            "{said}, over half of agent.timeoutSeconds ({timeout} s): a slow pod start or a slower node may time out"
        )]
    } else {
        Vec::new()
    }
}

fn check_when_and_where(c: &mut Checker, spec: &FabricTestSpec) {
    if let Some(schedule) = &spec.schedule
        && let Err(e) = parse_schedule(schedule)
    {
        c.check(false, "schedule", || e.to_string());
    }
    if let Err(e) = parse_time_zone(spec.time_zone.as_deref()) {
        c.check(false, "timeZone", || e.to_string());
    }
    for (key, value) in &spec.node_selector {
        if let Some(p) = labels::label_key_problem(key) {
            c.check(false, "nodeSelector", || p);
        }
        if let Some(p) = labels::label_value_problem(value) {
            c.check(false, &format!("nodeSelector[{key}]"), || p);
        }
    }
    if let Some(nodes) = &spec.nodes {
        c.check(!nodes.is_empty(), "nodes", || {
            "nodes must not be empty when set; remove it to use the nodeSelector alone".into()
        });
        c.check(nodes.iter().all(|n| !n.trim().is_empty()), "nodes", || {
            "node names must not be empty".into()
        });
        for name in nodes.iter().filter(|n| !n.trim().is_empty()) {
            if let Some(p) = labels::node_name_problem(name) {
                c.check(false, "nodes", || p);
            }
        }
    }
    if let Some(d) = spec.starting_deadline_seconds {
        c.check(d >= 1, "startingDeadlineSeconds", || {
            format!("must be at least 1 (got {d})")
        });
    }
    if let Some(w) = spec.wait_for_busy_nodes_seconds {
        c.check((1..=86_400).contains(&w), "waitForBusyNodesSeconds", || {
            format!("must be 1 to 86400 (got {w})")
        });
        c.check(!spec.include_busy_nodes, "waitForBusyNodesSeconds", || {
            "has no effect with includeBusyNodes (busy nodes are then tested at once): set one of the two".into()
        });
    }
}

/// `spec.limits`: a run tests at least one node and runs 10 s to a week.
fn check_limits(c: &mut Checker, spec: &FabricTestSpec) {
    if let Some(n) = spec.limits.max_nodes {
        c.check(n >= 1, "limits.maxNodes", || {
            format!("must be at least 1 (got {n}); remove it for no limit")
        });
    }
    if let Some(d) = spec.limits.max_duration_seconds {
        c.check(
            (10..=604_800).contains(&d),
            "limits.maxDurationSeconds",
            || format!("must be 10 to 604800 (a week; got {d}); remove it for no limit"),
        );
    }
}

fn check_suite(c: &mut Checker, spec: &FabricTestSpec) {
    let nccl = &spec.suite.nccl_sweep;
    c.check(
        !nccl.collectives.is_empty(),
        "suite.ncclSweep.collectives",
        || "must name at least one collective".into(),
    );
    let unique: BTreeSet<_> = nccl.collectives.iter().collect();
    c.check(
        unique.len() == nccl.collectives.len(),
        "suite.ncclSweep.collectives",
        || "names a collective twice".into(),
    );
    c.check(nccl.min_bytes >= 1, "suite.ncclSweep.minBytes", || {
        "must be at least 1".into()
    });
    c.check(
        nccl.min_bytes <= nccl.max_bytes,
        "suite.ncclSweep.minBytes",
        || {
            format!(
                "ncclSweep.minBytes must not be larger than ncclSweep.maxBytes ({} > {})",
                nccl.min_bytes, nccl.max_bytes
            )
        },
    );
    c.check(nccl.step_factor >= 2, "suite.ncclSweep.stepFactor", || {
        format!("must be at least 2 (got {})", nccl.step_factor)
    });
    c.check(nccl.iters >= 1, "suite.ncclSweep.iters", || {
        "must be at least 1".into()
    });
    c.check(
        nccl.graph_launches <= MAX_GRAPH_LAUNCHES,
        "suite.ncclSweep.graphLaunches",
        || {
            format!(
                "must be at most {MAX_GRAPH_LAUNCHES} (got {}): each size runs iters times this many iterations",
                nccl.graph_launches
            )
        },
    );

    let pairs = &spec.suite.gpu_pairs;
    c.check(pairs.bytes >= 1, "suite.gpuPairs.bytes", || {
        "must be at least 1".into()
    });
    c.check(
        spec.suite.node_pairs.bytes >= 1,
        "suite.nodePairs.bytes",
        || "must be at least 1".into(),
    );
    if let Some(key) = &spec.suite.node_pairs.topology_key
        && let Some(problem) = labels::label_key_problem(key)
    {
        c.check(false, "suite.nodePairs.topologyKey", || {
            format!("{key:?} is not a label key: {problem}")
        });
    }

    let max_nodes = spec.suite.ddp_nodes.max_nodes;
    c.check(
        (2..=16).contains(&max_nodes),
        "suite.ddpNodes.maxNodes",
        || format!("must be 2 to 16 (got {max_nodes})"),
    );

    check_nccl_nodes(c, &spec.suite.nccl_nodes);

    let ddp = &spec.suite.ddp_probe;
    c.check(ddp.hidden >= 1, "suite.ddpProbe.hidden", || {
        "must be at least 1".into()
    });
    c.check(ddp.layers >= 1, "suite.ddpProbe.layers", || {
        "must be at least 1".into()
    });
    c.check(ddp.batch_per_gpu >= 1, "suite.ddpProbe.batchPerGpu", || {
        "must be at least 1".into()
    });
    c.check(ddp.steps >= 1, "suite.ddpProbe.steps", || {
        "must be at least 1".into()
    });
    if let Some(counts) = &ddp.gpu_counts {
        c.check(!counts.is_empty(), "suite.ddpProbe.gpuCounts", || {
            "must list at least one GPU count; remove it for 1, 2, 4, ... all GPUs".into()
        });
        c.check(
            counts.iter().all(|&n| n >= 1),
            "suite.ddpProbe.gpuCounts",
            || "every GPU count must be at least 1".into(),
        );
    }
    c.check(
        ddp.first_bucket_bytes >= 1,
        "suite.ddpProbe.firstBucketBytes",
        || "must be at least 1".into(),
    );
    c.check(
        ddp.first_bucket_bytes <= ddp.bucket_bytes,
        "suite.ddpProbe.firstBucketBytes",
        || "ddpProbe.firstBucketBytes must not be larger than ddpProbe.bucketBytes".into(),
    );

    check_compute(c, &spec.suite.compute);

    let timeout = spec.agent.timeout_seconds;
    let least = estimate(&spec.suite, &FASTEST);
    c.check(least.total_s() <= f64::from(timeout), "suite", || {
        format!(
            "cannot finish within agent.timeoutSeconds ({timeout} s): even {} needs at least {} ({}); lower the sizes, iterations or steps, or raise agent.timeoutSeconds",
            FASTEST.name,
            seconds(least.total_s()),
            least.breakdown()
        )
    });
}

/// The compute checks' sizes: square sizes in whole tiles of 256, memory copies larger than
/// any GPU's caches, and at least one timed iteration each.
fn check_compute(c: &mut Checker, compute: &crate::suite::Compute) {
    let square = |c: &mut Checker, n: u32, max: u32, field: &str| {
        c.check(
            (256..=max).contains(&n) && n.is_multiple_of(256),
            field,
            || format!("must be a multiple of 256 from 256 to {max} (got {n})"),
        );
    };
    let g = &compute.gemm;
    if g.enabled {
        square(c, g.size, 32768, "suite.compute.gemm.size");
        c.check(g.iters >= 1, "suite.compute.gemm.iters", || {
            "must be at least 1".into()
        });
    }
    let m = &compute.memory;
    if m.enabled {
        c.check(m.bytes >= 64 << 20, "suite.compute.memory.bytes", || {
            format!(
                "must be at least 64 MiB (67108864), larger than any GPU's caches (got {})",
                m.bytes
            )
        });
        c.check(m.iters >= 1, "suite.compute.memory.iters", || {
            "must be at least 1".into()
        });
    }
    let d = &compute.sdc;
    if d.enabled {
        square(c, d.size, 16384, "suite.compute.sdc.size");
        c.check(d.repeats >= 1, "suite.compute.sdc.repeats", || {
            "must be at least 1".into()
        });
    }
}

fn check_quarantine_and_agent(c: &mut Checker, spec: &FabricTestSpec) {
    let q = &spec.quarantine;
    if let Err(e) = q.budget(0) {
        c.check(false, "quarantine.maxQuarantined", || {
            format!(
                "quarantine.maxQuarantined must be a count >= 0 or a percent from 0% to 100% ({e})"
            )
        });
    }
    c.check(
        q.failures_to_quarantine >= 1,
        "quarantine.failuresToQuarantine",
        || "must be at least 1".into(),
    );
    c.check(
        q.passes_to_release >= 1,
        "quarantine.passesToRelease",
        || "must be at least 1".into(),
    );
    c.check(
        (1..=100).contains(&q.storm_threshold_percent),
        "quarantine.stormThresholdPercent",
        || {
            format!(
                "must be between 1 and 100 (100 turns the storm rule off; got {})",
                q.storm_threshold_percent
            )
        },
    );
    c.check(q.storm_min_nodes >= 1, "quarantine.stormMinNodes", || {
        "must be at least 1".into()
    });

    let agent = &spec.agent;
    c.check(agent.image.trim() == agent.image, "agent.image", || {
        "must not start or end with spaces (leave it out for the operator's --agent-image)".into()
    });
    let names = [
        (
            "agent.runtimeClassName",
            agent.runtime_class_name.as_deref(),
        ),
        (
            "agent.priorityClassName",
            agent.priority_class_name.as_deref(),
        ),
    ];
    for (field, name) in names {
        if let Some(name) = name {
            c.check(labels::is_dns_subdomain(name), field, || {
                format!("{name:?} is not a valid object name (a DNS subdomain: lowercase letters, digits, '-' and '.', at most 253)")
            });
        }
    }
    for (i, secret) in agent.image_pull_secrets.iter().enumerate() {
        c.check(
            labels::is_dns_subdomain(&secret.name),
            "agent.imagePullSecrets",
            || {
                format!(
                    "entry {i} ({:?}) is not a valid Secret name (a DNS subdomain)",
                    secret.name
                )
            },
        );
    }
    check_pod_annotations(c, &agent.pod_annotations);
    if let Some(resources) = &agent.resources {
        check_resources(c, resources);
    }
    c.check(
        (10..=86400).contains(&agent.timeout_seconds),
        "agent.timeoutSeconds",
        || {
            format!(
                "must be between 10 and 86400 (got {})",
                agent.timeout_seconds
            )
        },
    );
}

/// Most bytes of a pod's annotations, keys and values together (the API server's limit).
pub const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;

/// `agent.podAnnotations`: keys the API server accepts, none of the operator's own, within
/// the API server's size limit.
fn check_pod_annotations(c: &mut Checker, annotations: &BTreeMap<String, String>) {
    let field = "agent.podAnnotations";
    for key in annotations.keys() {
        if let Some(p) = labels::label_key_problem(key) {
            c.check(false, field, || {
                p.replacen("label key", "annotation key", 1)
            });
        }
        let ours = key.split_once('/').is_some_and(|(prefix, _)| {
            prefix == "gpufabric.io" || prefix.ends_with(".gpufabric.io")
        });
        c.check(!ours, field, || {
            format!(
                "{key:?} is the operator's: keys under gpufabric.io/ are set by the operator only"
            )
        });
    }
    let size: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    c.check(size <= ANNOTATIONS_MAX_BYTES, field, || {
        format!(
            "{size} bytes in all, more than the {ANNOTATIONS_MAX_BYTES} a pod's annotations may hold"
        )
    });
}

/// Whether `name` is an extended resource (a device plugin's, e.g. `rdma/hca` or
/// `nvidia.com/gpu`), as the API server tells them from the built-in ones.
fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.starts_with("kubernetes.io/") && !name.starts_with("requests.")
}

/// `agent.resources`: no GPUs (the operator requests all of the node's), and extended
/// resources (RDMA devices) as the API server admits them: whole numbers, the request
/// equal to the limit. Refused here, a pod the API server would refuse never gets made.
fn check_resources(c: &mut Checker, r: &k8s_openapi::api::core::v1::ResourceRequirements) {
    let empty = BTreeMap::new();
    let requests = r.requests.as_ref().unwrap_or(&empty);
    let limits = r.limits.as_ref().unwrap_or(&empty);
    let names: BTreeSet<&String> = requests.keys().chain(limits.keys()).collect();
    for name in names {
        let field = format!("agent.resources[{name}]");
        if name == crate::keys::RESOURCE_GPU {
            c.check(false, &field, || {
                format!(
                    "{name} is always every GPU of the node, requested by the operator; remove it"
                )
            });
            continue;
        }
        if let Some(p) = labels::label_key_problem(name) {
            c.check(false, &field, || {
                p.replacen("label key", "resource name", 1)
            });
            continue;
        }
        if !is_extended_resource(name) {
            continue;
        }
        let (req, lim) = (requests.get(name), limits.get(name));
        for q in [req, lim].into_iter().flatten() {
            c.check(
                !q.0.is_empty() && q.0.bytes().all(|b| b.is_ascii_digit()),
                &field,
                || format!("{:?} is not a whole number: an extended resource is counted in whole devices (e.g. 1)", q.0),
            );
        }
        if let (Some(req), Some(lim)) = (req, lim) {
            c.check(req.0 == lim.0, &field, || {
                format!(
                    "request {} differs from limit {}: an extended resource cannot be overcommitted; set the limit alone (the request follows it)",
                    req.0, lim.0
                )
            });
        }
    }
}

/// A bus bandwidth threshold needs a sweep that reaches the sizes where busbw is bandwidth
/// ([`crate::result::BANDWIDTH_BYTES`]); below them the evaluation cannot judge it.
fn check_bandwidth_reach(c: &mut Checker, spec: &FabricTestSpec) {
    let nccl = &spec.suite.nccl_sweep;
    let judged = nccl.enabled
        && spec.thresholds.nccl_bus_bw_gbps.is_some()
        && nccl
            .collectives
            .contains(&crate::suite::Collective::AllReduce);
    let Some(&largest) = nccl.sizes().last() else {
        return;
    };
    let min = crate::result::BANDWIDTH_BYTES;
    c.check(
        !judged || largest >= min,
        "thresholds.ncclBusBwGbps",
        || {
            format!(
                "needs a sweep that reaches {} MiB, where busbw nears what the links carry; suite.ncclSweep ends at {largest} bytes: raise suite.ncclSweep.maxBytes, or drop the threshold",
                min >> 20
            )
        },
    );
}

/// Copy bandwidth thresholds need copies long enough to show the links
/// ([`crate::result::COPY_BYTES`]).
fn check_copy_reach(c: &mut Checker, spec: &FabricTestSpec) {
    let pairs = &spec.suite.gpu_pairs;
    let t = &spec.thresholds;
    let min = crate::result::COPY_BYTES;
    if !pairs.enabled || pairs.bytes >= min {
        return;
    }
    for (field, set) in [
        (
            "thresholds.pairBandwidthGbps",
            t.pair_bandwidth_gbps.is_some(),
        ),
        (
            "thresholds.pairBidirBandwidthGbps",
            t.pair_bidir_bandwidth_gbps.is_some(),
        ),
        (
            "thresholds.hostBandwidthGbps",
            t.host_bandwidth_gbps.is_some(),
        ),
    ] {
        c.check(!set, field, || {
            format!(
                "needs copies of at least {} MiB, where they near what the links carry; suite.gpuPairs.bytes is {}: raise it, or drop the threshold",
                min >> 20,
                pairs.bytes
            )
        });
    }
}

fn check_thresholds(c: &mut Checker, t: &Thresholds) {
    let floors = [
        ("thresholds.ncclBusBwGbps", t.nccl_bus_bw_gbps),
        ("thresholds.ncclLatencyUs", t.nccl_latency_us),
        ("thresholds.pairBandwidthGbps", t.pair_bandwidth_gbps),
        (
            "thresholds.pairBidirBandwidthGbps",
            t.pair_bidir_bandwidth_gbps,
        ),
        ("thresholds.hostBandwidthGbps", t.host_bandwidth_gbps),
        ("thresholds.maxTemperatureC", t.max_temperature_c),
    ];
    for (field, value) in floors {
        if let Some(v) = value {
            c.check(v.is_finite() && v >= 0.0, field, || {
                format!("must be a number >= 0 (got {v})")
            });
        }
    }
    if let Some(g) = t.nvlink_error_growth {
        c.check(g >= 1, "thresholds.nvlinkErrorGrowth", || {
            format!("must be at least 1 (got {g})")
        });
    }
    if let Some(e) = t.ddp_scaling_efficiency {
        c.check(
            (0.0..=1.0).contains(&e),
            "thresholds.ddpScalingEfficiency",
            || format!("must be between 0 and 1 (got {e})"),
        );
    }
    c.check(
        t.straggler_ratio.is_finite() && t.straggler_ratio >= 1.0,
        "thresholds.stragglerRatio",
        || format!("must be at least 1.0 (got {})", t.straggler_ratio),
    );
    c.check(
        (0.0..=1.0).contains(&t.fleet_min_relative_gap),
        "thresholds.fleetMinRelativeGap",
        || format!("must be between 0 and 1 (got {})", t.fleet_min_relative_gap),
    );
    c.check(
        t.fleet_outlier_score.is_finite() && t.fleet_outlier_score >= 0.0,
        "thresholds.fleetOutlierScore",
        || format!("must be a number >= 0 (got {})", t.fleet_outlier_score),
    );
    c.check(t.fleet_min_nodes >= 2, "thresholds.fleetMinNodes", || {
        format!("must be at least 2 (got {})", t.fleet_min_nodes)
    });
    check_trend(c, &t.trend);
}

/// The drift rule's settings: a record it can judge from.
fn check_trend(c: &mut Checker, t: &crate::policy::TrendPolicy) {
    let most = crate::trend::MAX_POINTS as u32;
    c.check(
        (2..=most).contains(&t.window),
        "thresholds.trend.window",
        || format!("must be from 2 to {most} runs (got {})", t.window),
    );
    c.check(
        t.min_runs >= 2 && t.min_runs <= t.window,
        "thresholds.trend.minRuns",
        || {
            format!(
                "must be at least 2 and at most window ({}): the record keeps no more (got {})",
                t.window, t.min_runs
            )
        },
    );
    c.check(
        t.drift_percent.is_finite() && (1.0..=50.0).contains(&t.drift_percent),
        "thresholds.trend.driftPercent",
        || format!("must be from 1 to 50 (got {})", t.drift_percent),
    );
    c.check(
        (1..=10).contains(&t.sustained_runs),
        "thresholds.trend.sustainedRuns",
        || format!("must be from 1 to 10 (got {})", t.sustained_runs),
    );
}
