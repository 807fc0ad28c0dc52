//! `fabric-operator uninstall`, the chart's pre-delete hook: deletes the FabricTests this
//! installation acts on and waits until their finalizers have released what the operator
//! made on the nodes; when no operator runs, releases them here with the finalizer's code.
//!
//! [`next`] decides from one look at the tests and the operator's leader Lease; [`run`]
//! only reads, acts on the decision and reports.

use gpufabric_api::FabricTest;
use gpufabric_api::keys;
use gpufabric_operator::events::{Events, Reporter};
use gpufabric_operator::leader::Observer;
use gpufabric_operator::quarantine::{self, QuarantineError, QuarantineMetrics};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::collections::BTreeSet;
use std::fmt;
use std::time::{Duration, Instant};

/// How often the tests and the Lease are read again.
const POLL: Duration = Duration::from_secs(2);
/// How often an unchanged wait is reported again.
const REPORT_EVERY: Duration = Duration::from_secs(15);
/// Who the Lease is judged for: never its holder, so a held Lease is someone else's.
const IDENTITY: &str = "fabric-operator-uninstall";

/// What `fabric-operator uninstall` was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// The FabricTests to delete (a label selector; None: all of them).
    pub selector: Option<String>,
    /// How long to wait for their finalizers.
    pub timeout: Duration,
    /// Where the operator's leader Lease lives, and its name.
    pub lease_namespace: String,
    pub lease_name: String,
}

/// One selected FabricTest, as one look at the API server finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestSeen {
    pub name: String,
    /// Marked for deletion (`metadata.deletionTimestamp`).
    pub deleting: bool,
    /// Still carries the operator's finalizer (`gpufabric.io/release-quarantine`).
    pub finalizer: bool,
}

impl TestSeen {
    fn of(test: &FabricTest) -> TestSeen {
        TestSeen {
            name: test.name_any(),
            deleting: test.metadata.deletion_timestamp.is_some(),
            finalizer: test.finalizers().iter().any(|f| f == keys::FINALIZER),
        }
    }
}

/// Whether an operator acts on the FabricTests, as its leader Lease tells (the chart always
/// runs the operator with leader election).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operator {
    /// A replica holds the Lease and renews it: its finalizer releases the nodes.
    Acting { holder: String },
    /// No replica acts: no Lease, a released one, or one whose holder has not renewed it for
    /// its whole duration (as seen by this process's clock, as a standby replica judges it).
    Gone,
    /// The Lease could not be read: an operator may be acting.
    Unknown { error: String },
}

/// Why [`next`] waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// The running operator's finalizer releases the nodes.
    Operator { holder: String },
    /// Nobody can tell whether an operator runs; nothing is released beside one that may.
    Unknown { error: String },
    /// Our finalizer has run; these tests wait only for finalizers of others.
    OtherFinalizers(Vec<String>),
}

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Waiting::Operator { holder } => {
                write!(
                    f,
                    "waiting for the operator (Lease holder {holder}) to run their finalizers"
                )
            }
            Waiting::Unknown { error } => write!(
                f,
                "cannot tell whether the operator runs ({error}); waiting, nothing is released here"
            ),
            Waiting::OtherFinalizers(names) => write!(
                f,
                "released; waiting for other finalizers on {}",
                names.join(", ")
            ),
        }
    }
}

/// What to do after one look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// No selected FabricTest is left: their finalizers have run.
    Done,
    /// Delete these (not yet marked for deletion), then look again.
    Delete(Vec<String>),
    /// Look again later.
    Wait(Waiting),
    /// No operator acts: release what these tests made, here, and remove their finalizer.
    ReleaseHere(Vec<String>),
    /// Time is up and these tests are still there.
    TimedOut(Vec<String>),
}

/// What to do after one look at the selected FabricTests and the operator's Lease.
///
/// 1. No selected test is left: done.
/// 2. Past the deadline: time out, naming the tests left.
/// 3. Tests not yet marked for deletion: delete them.
/// 4. An operator acts: wait for its finalizer. Releasing here as well would race its
///    reconcile of the test in flight, which may still quarantine a node.
/// 5. Unknown whether an operator acts: wait, for the same reason.
/// 6. No operator acts: release here the tests that still carry the finalizer; when none
///    does (only others' finalizers are left), wait for those.
///
/// Releasing here never undoes what the operator did not make: it is the finalizer's own
/// code, which undoes only what each node's `gpufabric.io/quarantine` record names.
pub fn next(tests: &[TestSeen], operator: &Operator, timed_out: bool) -> Next {
    let names = |keep: &dyn Fn(&TestSeen) -> bool| -> Vec<String> {
        tests
            .iter()
            .filter(|t| keep(t))
            .map(|t| t.name.clone())
            .collect()
    };
    if tests.is_empty() {
        return Next::Done;
    }
    if timed_out {
        return Next::TimedOut(names(&|_| true));
    }
    let undeleted = names(&|t| !t.deleting);
    if !undeleted.is_empty() {
        return Next::Delete(undeleted);
    }
    match operator {
        Operator::Acting { holder } => Next::Wait(Waiting::Operator {
            holder: holder.clone(),
        }),
        Operator::Unknown { error } => Next::Wait(Waiting::Unknown {
            error: error.clone(),
        }),
        Operator::Gone => {
            let ours = names(&|t| t.finalizer);
            if ours.is_empty() {
                Next::Wait(Waiting::OtherFinalizers(names(&|_| true)))
            } else {
                Next::ReleaseHere(ours)
            }
        }
    }
}

/// A FabricTest still there when time ran out.
#[derive(Debug)]
pub struct Left {
    pub test: String,
    /// The finalizers it still waits for.
    pub finalizers: Vec<String>,
    /// The nodes whose quarantine record names it, or why they could not be read.
    pub nodes: Result<Vec<String>, QuarantineError>,
}

/// The error of a timed-out uninstall: which tests still hold which nodes, why, and what
/// to do.
pub fn timeout_message(
    opts: &Options,
    left: &[Left],
    operator: &Operator,
    last_error: Option<&str>,
) -> String {
    let lease = format!("{}/{}", opts.lease_namespace, opts.lease_name);
    let mut out = format!(
        "gave up after {}s: {} FabricTest(s) still there, waiting for their finalizers:\n",
        opts.timeout.as_secs(),
        left.len()
    );
    for l in left {
        let holds = match &l.nodes {
            Ok(n) if n.is_empty() => "holds no node".to_string(),
            Ok(n) => format!("still holds {}", n.join(", ")),
            Err(e) => format!("nodes unknown ({e})"),
        };
        let waits = match l.finalizers.as_slice() {
            [] => "no finalizer left".to_string(),
            f => format!("finalizer {}", f.join(", ")),
        };
        out.push_str(&format!("  FabricTest {}: {holds}; {waits}\n", l.test));
    }
    let first = left.first().map_or("NAME", |l| l.test.as_str());
    match operator {
        Operator::Acting { holder } => out.push_str(&format!(
            "The operator runs (Lease {lease} held by {holder}) but has not finished them; its \
             log and the tests' Events say why: kubectl -n {ns} logs {holder}; kubectl \
             describe fabrictest {first}.\n",
            ns = opts.lease_namespace
        )),
        Operator::Unknown { error } => out.push_str(&format!(
            "Could not tell whether the operator runs (reading Lease {lease}: {error}), so \
             nothing was released here.\n"
        )),
        Operator::Gone => out.push_str(&format!(
            "No operator runs (Lease {lease} absent, released or not renewed); releasing here \
             did not finish.\n"
        )),
    }
    if let Some(e) = last_error {
        out.push_str(&format!("Last error: {e}\n"));
    }
    out.push_str(
        "Nothing was forced: a node still held keeps its quarantine. Fix the cause and run `helm \
         uninstall` again (this hook runs again and finishes what is left). To uninstall now \
         and keep these quarantines, run `helm uninstall --no-hooks`: the FabricTests stay, \
         marked for deletion, until an operator runs again.",
    );
    out
}

/// Parses a timeout: `90`, `90s`, `5m` or `1h`, more than zero.
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (digits, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 120s, 5m or 1h"))?;
    let secs = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        _ => return Err(format!("{s:?}: the unit must be s, m or h (e.g. 120s)")),
    };
    if secs == 0 {
        return Err("the timeout must be more than 0s".into());
    }
    Ok(Duration::from_secs(secs))
}

/// Deletes the selected FabricTests and waits, as [`next`] decides, printing progress on
/// stdout; an error with [`timeout_message`] when time runs out.
pub async fn run(client: Client, opts: &Options) -> anyhow::Result<()> {
    let tests: Api<FabricTest> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), &opts.lease_namespace);
    let events = Events::new(
        client.clone(),
        Reporter {
            controller: keys::MANAGER.into(),
            instance: Some(IDENTITY.into()),
        },
    );
    let metrics = QuarantineMetrics::default();
    let selector = opts.selector.clone().filter(|s| !s.trim().is_empty());
    let list = match &selector {
        Some(s) => ListParams::default().labels(s),
        None => ListParams::default(),
    };
    println!(
        "deleting the FabricTests {}, waiting up to {}s for their finalizers to release the \
         nodes they quarantined",
        selector
            .as_deref()
            .map_or("(all of them)".to_string(), |s| format!("matching {s:?}")),
        opts.timeout.as_secs()
    );

    let start = Instant::now();
    let mut observer = Observer::default();
    let mut progress = Progress::default();
    let mut last_error: Option<String> = None;
    loop {
        let timed_out = start.elapsed() >= opts.timeout;
        let listed = match tests.list(&list).await {
            Ok(l) => l.items,
            Err(e) if timed_out => {
                anyhow::bail!(
                    "gave up after {}s: could not list the FabricTests: {e}",
                    opts.timeout.as_secs()
                )
            }
            Err(e) => {
                progress.error(&mut last_error, format!("listing the FabricTests: {e}"));
                tokio::time::sleep(POLL).await;
                continue;
            }
        };
        let seen: Vec<TestSeen> = listed.iter().map(TestSeen::of).collect();
        progress.gone(&seen);
        let operator = lease_state(&leases, &opts.lease_name, &mut observer).await;
        match next(&seen, &operator, timed_out) {
            Next::Done => {
                println!(
                    "done: every selected FabricTest is gone and its nodes are released ({}s)",
                    start.elapsed().as_secs()
                );
                return Ok(());
            }
            Next::Delete(names) => {
                for test in listed.iter().filter(|t| names.contains(&t.name_any())) {
                    // Read before the delete: a running operator may release at once.
                    let holds = holds(&client, test).await;
                    match delete(&tests, test).await {
                        Ok(()) => println!(
                            "deleted FabricTest {}; {}",
                            test.name_any(),
                            describe(&holds)
                        ),
                        Err(e) => progress.error(
                            &mut last_error,
                            format!("deleting FabricTest {}: {e}", test.name_any()),
                        ),
                    }
                }
            }
            Next::Wait(why) => progress.waiting(&why, opts.timeout.saturating_sub(start.elapsed())),
            Next::ReleaseHere(names) => {
                for test in listed.iter().filter(|t| names.contains(&t.name_any())) {
                    let name = test.name_any();
                    match release_here(&client, &events, &metrics, &tests, test).await {
                        Ok(released) if released.is_empty() => println!(
                            "no operator runs: FabricTest {name} released here (no node to release)"
                        ),
                        Ok(released) => println!(
                            "no operator runs: FabricTest {name} released here: {}",
                            released.join(", ")
                        ),
                        Err(e) => progress.error(
                            &mut last_error,
                            format!("releasing FabricTest {name} here: {e}"),
                        ),
                    }
                }
            }
            Next::TimedOut(names) => {
                let mut left = Vec::new();
                for test in listed.iter().filter(|t| names.contains(&t.name_any())) {
                    left.push(Left {
                        test: test.name_any(),
                        finalizers: test.finalizers().to_vec(),
                        nodes: holds(&client, test).await,
                    });
                }
                anyhow::bail!(timeout_message(
                    opts,
                    &left,
                    &operator,
                    last_error.as_deref()
                ));
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The operator's state from its Lease, judged as a standby replica would judge it.
async fn lease_state(leases: &Api<Lease>, name: &str, observer: &mut Observer) -> Operator {
    match leases.get_opt(name).await {
        Ok(lease) => {
            let spec = lease.as_ref().and_then(|l| l.spec.as_ref());
            if observer.may_hold(spec, IDENTITY, Instant::now()) {
                Operator::Gone
            } else {
                Operator::Acting {
                    holder: spec
                        .and_then(|s| s.holder_identity.clone())
                        .unwrap_or_default(),
                }
            }
        }
        Err(e) => Operator::Unknown {
            error: e.to_string(),
        },
    }
}

/// Deletes `test` (only the object listed: a test created again under its name stays).
async fn delete(api: &Api<FabricTest>, test: &FabricTest) -> Result<(), kube::Error> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: test.uid(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(&test.name_any(), &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// What the finalizer does, done here: release with the operator's own code, then remove
/// the finalizer with the resourceVersion it was listed at (a test that changed meanwhile
/// is looked at again).
async fn release_here(
    client: &Client,
    events: &Events,
    metrics: &QuarantineMetrics,
    api: &Api<FabricTest>,
    test: &FabricTest,
) -> anyhow::Result<Vec<String>> {
    let released =
        gpufabric_operator::controller::fabrictest::release(client, events, metrics, test).await?;
    let finalizers: Vec<&String> = test
        .finalizers()
        .iter()
        .filter(|f| *f != keys::FINALIZER)
        .collect();
    let patch = json!({"metadata": {
        "resourceVersion": test.resource_version(),
        "finalizers": finalizers,
    }});
    match api
        .patch(
            &test.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(released),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(released),
        Err(e) => {
            // The webhook is served by the operator's replicas: with none running and
            // failurePolicy Fail, every change of a FabricTest is refused.
            let hint = if e.to_string().contains("failed calling webhook") {
                " (no operator replica answers the admission webhook: scale the operator up, \
                 or set webhook.failurePolicy=Ignore, and run helm uninstall again)"
            } else {
                ""
            };
            Err(anyhow::anyhow!(
                "its nodes are released, but removing its finalizer failed: {e}{hint}"
            ))
        }
    }
}

/// The nodes whose quarantine record names `test`.
async fn holds(client: &Client, test: &FabricTest) -> Result<Vec<String>, QuarantineError> {
    quarantine::quarantined_by(client, test)
        .await
        .map(|r| r.into_keys().collect())
}

fn describe(holds: &Result<Vec<String>, QuarantineError>) -> String {
    match holds {
        Ok(n) if n.is_empty() => "it holds no node".into(),
        Ok(n) => format!("its finalizer releases {}", n.join(", ")),
        Err(e) => format!("could not read which nodes it holds: {e}"),
    }
}

/// What has been printed, so that a long wait prints a line when something changes and
/// otherwise every [`REPORT_EVERY`].
#[derive(Default)]
struct Progress {
    present: BTreeSet<String>,
    said: Option<(String, Instant)>,
}

impl Progress {
    /// Prints each test that was there at the last look and is gone now.
    fn gone(&mut self, seen: &[TestSeen]) {
        let now: BTreeSet<String> = seen.iter().map(|t| t.name.clone()).collect();
        for name in self.present.difference(&now) {
            println!("FabricTest {name} is gone");
        }
        self.present = now;
    }

    fn waiting(&mut self, why: &Waiting, left: Duration) {
        let line = why.to_string();
        let due = match &self.said {
            Some((said, at)) => *said != line || at.elapsed() >= REPORT_EVERY,
            None => true,
        };
        if due {
            println!("{line} ({}s left)", left.as_secs());
            self.said = Some((line, Instant::now()));
        }
    }

    fn error(&mut self, last: &mut Option<String>, error: String) {
        if last.as_deref() != Some(error.as_str()) {
            println!("error (tried again): {error}");
        }
        *last = Some(error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(name: &str, deleting: bool, finalizer: bool) -> TestSeen {
        TestSeen {
            name: name.into(),
            deleting,
            finalizer,
        }
    }

    fn acting() -> Operator {
        Operator::Acting {
            holder: "fabric-operator-0".into(),
        }
    }

    #[test]
    fn nothing_left_is_done_whatever_the_operator() {
        for op in [acting(), Operator::Gone] {
            assert_eq!(next(&[], &op, false), Next::Done);
            assert_eq!(next(&[], &op, true), Next::Done);
        }
    }

    #[test]
    fn tests_not_yet_deleted_are_deleted_first() {
        let tests = [seen("a", true, true), seen("b", false, true)];
        assert_eq!(
            next(&tests, &Operator::Gone, false),
            Next::Delete(vec!["b".into()])
        );
        assert_eq!(
            next(&tests, &acting(), false),
            Next::Delete(vec!["b".into()])
        );
    }

    #[test]
    fn a_running_operator_releases_and_nothing_is_released_here() {
        let tests = [seen("a", true, true)];
        assert_eq!(
            next(&tests, &acting(), false),
            Next::Wait(Waiting::Operator {
                holder: "fabric-operator-0".into()
            })
        );
    }

    #[test]
    fn an_unreadable_lease_never_releases_here() {
        let op = Operator::Unknown {
            error: "forbidden".into(),
        };
        let tests = [seen("a", true, true)];
        assert!(matches!(
            next(&tests, &op, false),
            Next::Wait(Waiting::Unknown { .. })
        ));
    }

    #[test]
    fn with_no_operator_the_tests_with_the_finalizer_are_released_here() {
        let tests = [seen("a", true, true), seen("b", true, false)];
        assert_eq!(
            next(&tests, &Operator::Gone, false),
            Next::ReleaseHere(vec!["a".into()])
        );
    }

    #[test]
    fn only_others_finalizers_left_is_a_wait_not_a_release() {
        let tests = [seen("b", true, false)];
        assert_eq!(
            next(&tests, &Operator::Gone, false),
            Next::Wait(Waiting::OtherFinalizers(vec!["b".into()]))
        );
    }

    #[test]
    fn the_deadline_names_every_test_left_and_never_releases() {
        let tests = [seen("a", true, true), seen("b", false, true)];
        for op in [acting(), Operator::Gone] {
            assert_eq!(
                next(&tests, &op, true),
                Next::TimedOut(vec!["a".into(), "b".into()])
            );
        }
    }

    fn options() -> Options {
        Options {
            selector: None,
            timeout: Duration::from_secs(120),
            lease_namespace: "gpufabric".into(),
            lease_name: "fabric-operator".into(),
        }
    }

    #[test]
    fn the_timeout_says_which_test_holds_which_nodes_and_what_to_do() {
        let ours = vec![keys::FINALIZER.to_string()];
        let left = vec![
            Left {
                test: "nightly".into(),
                finalizers: ours.clone(),
                nodes: Ok(vec!["gpu-02".into(), "gpu-05".into()]),
            },
            Left {
                test: "idle".into(),
                finalizers: vec!["example.com/hold".into()],
                nodes: Ok(vec![]),
            },
            Left {
                test: "odd".into(),
                finalizers: ours,
                nodes: Err(QuarantineError::Unnamed),
            },
        ];
        let m = timeout_message(&options(), &left, &acting(), Some("conflict"));
        assert!(m.starts_with("gave up after 120s: 3 FabricTest(s)"), "{m}");
        assert!(
            m.contains(
                "FabricTest nightly: still holds gpu-02, gpu-05; finalizer gpufabric.io/release-quarantine"
            ),
            "{m}"
        );
        assert!(
            m.contains("FabricTest idle: holds no node; finalizer example.com/hold"),
            "{m}"
        );
        assert!(
            m.contains("FabricTest odd: nodes unknown (the FabricTest has no name)"),
            "{m}"
        );
        assert!(
            m.contains("kubectl -n gpufabric logs fabric-operator-0"),
            "{m}"
        );
        assert!(m.contains("kubectl describe fabrictest nightly"), "{m}");
        assert!(m.contains("Last error: conflict"), "{m}");
        assert!(m.contains("helm uninstall --no-hooks"), "{m}");
    }

    #[test]
    fn the_timeout_says_when_nothing_was_released_because_the_operator_was_unknown() {
        let op = Operator::Unknown {
            error: "leases is forbidden".into(),
        };
        let left = [Left {
            test: "a".into(),
            finalizers: vec![],
            nodes: Ok(vec![]),
        }];
        let m = timeout_message(&options(), &left, &op, None);
        assert!(
            m.contains("reading Lease gpufabric/fabric-operator: leases is forbidden"),
            "{m}"
        );
        assert!(m.contains("nothing was released here"), "{m}");
        assert!(!m.contains("Last error"), "{m}");
    }

    #[test]
    fn timeouts_parse_with_or_without_a_unit() {
        assert_eq!(parse_timeout("120s"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_timeout("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_timeout("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_timeout("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "0s", "s", "2d", "-1s", "1.5m"] {
            assert!(parse_timeout(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
