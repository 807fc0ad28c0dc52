//! `kubectl-gpufabric`: the kubectl plugin of gpufabric (`kubectl gpufabric ...` once the
//! binary is on PATH). Reads FabricTests, their runs and the nodes; asks the operator to
//! act only through the annotations it documents.

#![forbid(unsafe_code)]

use anyhow::Context;
use clap::{Parser, Subcommand};
use gpufabric_api::shard::FabricTestRunShard;
use gpufabric_api::{FabricTest, FabricTestRun, keys};
use gpufabric_kubectl::exit::{self, Exit};
use gpufabric_kubectl::findings::Findings;
use gpufabric_kubectl::node::NodeView;
use gpufabric_kubectl::report::{Quarantine, Report, pair_rows};
use gpufabric_kubectl::request::{self, Refusal};
use gpufabric_kubectl::status::Status;
use gpufabric_kubectl::{Format, View, render};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::path::PathBuf;
use std::process::ExitCode;

const COMMANDS: &str = "Commands at a glance:
  status                        every FabricTest: schedule, last run, quarantined and held-back nodes, breaker
  findings [RUN]                the findings of RUN (default: each test's latest run)
  node NODE                     its history in each test, quarantine record, findings, why it is or is not acted on
  run TEST [--nodes a,b] [--selector k=v]
                                run TEST now (gpufabric.io/run-now), or over those nodes (gpufabric.io/run-nodes, -selector)
  release NODE [--note TEXT]    mark a quarantined node repaired (gpufabric.io/repaired): tested now, one pass releases it
  report RUN                    the run's per-node results, findings, node pairs, DDP probe, quarantine, nodes not measured";

/// What gpufabric found and holds (FabricTests, runs, findings, quarantined nodes), and the
/// requests it takes (run now, a repaired node). Reads the cluster of the current kubeconfig
/// context.
#[derive(Parser, Debug)]
#[command(
    name = "kubectl-gpufabric",
    bin_name = "kubectl gpufabric",
    version,
    about,
    after_help = format!("{COMMANDS}\n\n{}", exit::help())
)]
struct Cli {
    /// Output: table (for people), json or yaml (for scripts).
    #[arg(short, long, global = true, value_enum, default_value_t = Format::Table)]
    output: Format,
    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or the in-cluster account).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: the current one).
    #[arg(long, global = true)]
    context: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Every FabricTest: schedule, last run and its phase, passed, failed and not measured
    /// nodes, quarantined nodes, held-back nodes and repeat offenders, breaker.
    Status,
    /// The findings of a run: node, subject, kind, severity, message.
    Findings {
        /// The FabricTestRun (default: the latest run of each FabricTest).
        run: Option<String>,
    },
    /// A node: its history in each FabricTest, its quarantine record, the gate and repair
    /// marks, the findings of the latest runs that name it, and why each test does or does
    /// not act on it.
    Node { node: String },
    /// Run a FabricTest now: over every node it selects, or (targeted) over the nodes named
    /// or matched, among those it selects.
    Run {
        test: String,
        /// Nodes to test, comma-separated (annotation gpufabric.io/run-nodes).
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
        /// Label selector of nodes to test, key=value[,key=value] (annotation
        /// gpufabric.io/run-selector).
        #[arg(long)]
        selector: Option<String>,
    },
    /// Mark a node gpufabric quarantined as back from repair (annotation
    /// gpufabric.io/repaired): every test that selects it tests it now and one pass releases
    /// it. Refused for a node without a gpufabric quarantine record.
    Release {
        node: String,
        /// The annotation's value: what was repaired, a ticket.
        #[arg(long, default_value = "released with kubectl gpufabric")]
        note: String,
    },
    /// A run's tables: per-node results, findings, node pairs, the multi-node DDP probe, its
    /// test's quarantined and held-back nodes, the nodes not measured.
    Report { run: String },
}

/// How a command failed, and the exit code that says so.
struct Failure {
    exit: Exit,
    error: anyhow::Error,
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure {
            exit: Exit::Error,
            error: e.into(),
        }
    }
}

fn not_found(what: String) -> Failure {
    Failure {
        exit: Exit::NotFound,
        error: anyhow::anyhow!(what),
    }
}

fn refused(r: Refusal) -> Failure {
    Failure {
        exit: match r {
            Refusal::Usage(_) => Exit::Usage,
            _ => Exit::Refused,
        },
        error: r.into(),
    }
}

/// `api.get(name)`, a missing object as [`Exit::NotFound`].
async fn get<K>(api: &Api<K>, kind: &str, name: &str) -> Result<K, Failure>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name)
        .await
        .with_context(|| format!("reading {kind} {name}"))?
        .ok_or_else(|| not_found(format!("{kind} {name} not found")))
}

async fn client(cli: &Cli) -> anyhow::Result<kube::Client> {
    let options = KubeConfigOptions {
        context: cli.context.clone(),
        ..Default::default()
    };
    let config = match &cli.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options).await?
        }
        None if cli.context.is_some() => kube::Config::from_kubeconfig(&options).await?,
        None => kube::Config::infer()
            .await
            .context("no kubeconfig found (set KUBECONFIG or --kubeconfig)")?,
    };
    Ok(kube::Client::try_from(config)?)
}

/// The runs named, skipping those that are gone.
async fn runs_named(
    runs: &Api<FabricTestRun>,
    names: impl IntoIterator<Item = String>,
) -> anyhow::Result<Vec<FabricTestRun>> {
    let mut out = Vec::new();
    for name in names {
        if let Some(r) = runs
            .get_opt(&name)
            .await
            .with_context(|| format!("reading FabricTestRun {name}"))?
        {
            out.push(r);
        }
    }
    Ok(out)
}

/// Writes `view` to stdout; a reader that went away (`| head`) is no error.
fn print<V: View>(view: &V, format: Format) -> Result<(), Failure> {
    use std::io::Write;
    let text = render(view, format)?;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("writing to stdout").into())
        }
        _ => Ok(()),
    }
}

async fn execute(cli: &Cli) -> Result<(), Failure> {
    let client = client(cli).await?;
    let tests: Api<FabricTest> = Api::all(client.clone());
    let runs: Api<FabricTestRun> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let lp = ListParams::default();
    match &cli.command {
        Command::Status => {
            let all = tests.list(&lp).await.context("listing FabricTests")?.items;
            print(&Status::of(&all), cli.output)
        }
        Command::Findings { run: Some(run) } => {
            let r = get(&runs, "FabricTestRun", run).await?;
            print(&Findings::of(&[r]), cli.output)
        }
        Command::Findings { run: None } => {
            let mut all = tests.list(&lp).await.context("listing FabricTests")?.items;
            all.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            let latest = all
                .iter()
                .filter_map(|t| t.status.as_ref()?.last_run.as_ref().map(|l| l.name.clone()));
            let latest = runs_named(&runs, latest).await?;
            print(&Findings::of(&latest), cli.output)
        }
        Command::Node { node } => {
            let n = get(&nodes, "Node", node).await?;
            let all = tests.list(&lp).await.context("listing FabricTests")?.items;
            let mut last: Vec<String> = all
                .iter()
                .filter_map(|t| t.status.as_ref())
                .flat_map(|s| &s.nodes)
                .filter(|h| &h.node == node)
                .filter_map(|h| h.last_run.clone())
                .collect();
            last.sort();
            last.dedup();
            let latest = runs_named(&runs, last).await?;
            print(&NodeView::of(&n, &all, &latest), cli.output)
        }
        Command::Run {
            test,
            nodes: named,
            selector,
        } => {
            let req = request::run(
                test,
                named,
                selector.as_deref(),
                &chrono::Utc::now().to_rfc3339(),
            )
            .map_err(refused)?;
            get(&tests, "FabricTest", test).await?;
            if let Some(listed) = req.annotations.get(keys::ANNOTATION_RUN_NODES) {
                for n in listed.split(',') {
                    get(&nodes, "Node", n).await?;
                }
            }
            tests
                .patch(test, &PatchParams::default(), &Patch::Merge(&req.patch()))
                .await
                .with_context(|| format!("annotating FabricTest {test}"))?;
            print(&req, cli.output)
        }
        Command::Release { node, note } => {
            let n = get(&nodes, "Node", node).await?;
            let req = request::release(&n, note).map_err(refused)?;
            nodes
                .patch(node, &PatchParams::default(), &Patch::Merge(&req.patch()))
                .await
                .with_context(|| format!("annotating Node {node}"))?;
            print(&req, cli.output)
        }
        Command::Report { run } => {
            let r = get(&runs, "FabricTestRun", run).await?;
            let shards: Api<FabricTestRunShard> = Api::all(client.clone());
            let of_run = ListParams::default().labels(&format!("{}={run}", keys::LABEL_RUN));
            let shards = shards
                .list(&of_run)
                .await
                .context("listing the run's FabricTestRunShards")?
                .items;
            let quarantine = match tests
                .get_opt(&r.spec.test)
                .await
                .with_context(|| format!("reading FabricTest {}", r.spec.test))?
            {
                Some(t) => {
                    let all = nodes.list(&lp).await.context("listing Nodes")?.items;
                    Some(Quarantine::of(&t, &all))
                }
                None => None,
            };
            let report = Report {
                pairs: pair_rows(&shards),
                run: r,
                quarantine,
            };
            print(&report, cli.output)
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // clap exits 2 on a usage error and 0 on --help, as the exit-code table says.
    let cli = Cli::parse();
    match execute(&cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("kubectl gpufabric: {:#}", f.error);
            ExitCode::from(f.exit.code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent_and_its_help_lists_commands_and_exit_codes() {
        Cli::command().debug_assert();
        let help = Cli::command().render_long_help().to_string();
        for needle in ["release NODE", "report RUN", "Exit codes", "  4  refused"] {
            assert!(help.contains(needle), "{needle:?} in {help}");
        }
    }

    #[test]
    fn nodes_are_taken_comma_separated_or_repeated() {
        let cli = Cli::try_parse_from([
            "kubectl-gpufabric",
            "run",
            "nightly",
            "--nodes",
            "a,b",
            "--nodes",
            "c",
            "-o",
            "json",
        ])
        .expect("parses");
        assert_eq!(cli.output, Format::Json);
        match cli.command {
            Command::Run { nodes, .. } => assert_eq!(nodes, ["a", "b", "c"]),
            other => panic!("{other:?}"),
        }
        let err =
            Cli::try_parse_from(["kubectl-gpufabric", "status", "-o", "xml"]).expect_err("no xml");
        assert_eq!(err.exit_code(), i32::from(Exit::Usage.code()));
    }
}
