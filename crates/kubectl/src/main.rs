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
use gpufabric_kubectl::html::{self, HtmlReport, Sources};
use gpufabric_kubectl::node::NodeView;
use gpufabric_kubectl::report::{Quarantine, Report, pair_rows};
use gpufabric_kubectl::request::{self, Refusal};
use gpufabric_kubectl::status::Status;
use gpufabric_kubectl::version::Version;
use gpufabric_kubectl::{Format, OUTPUTS, Output, View, render};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
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
  report RUN                    the run's per-node results, findings, node pairs, DDP probe, quarantine, nodes not measured
  report RUN -o report.html     the same run as one self-contained page: the fleet, each failing node's GPU pairs and
                                collectives against their floors, the node-pair matrix, the DDP probe, each node's trend
  completion bash|zsh|fish      a completion script: source <(kubectl-gpufabric completion bash)
  version                       the plugin's version

Outputs (-o): table, wide (more columns), json, yaml, name (kind/name a line),
  jsonpath=TEMPLATE (as kubectl's: -o jsonpath='{range .tests[*]}{.name}{\"\\n\"}{end}'),
  html or FILE.html (report only)";

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
    /// Output: table or wide (for people), json, yaml, name or jsonpath=TEMPLATE (for
    /// scripts, as kubectl's); for `report` also html (to stdout) or a file name ending in
    /// .html (one self-contained page).
    #[arg(
        short,
        long,
        global = true,
        default_value = "table",
        value_name = OUTPUTS
    )]
    output: Output,
    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or the in-cluster account).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: the current one).
    #[arg(long, global = true)]
    context: Option<String>,
    /// Kubeconfig cluster (default: the context's).
    #[arg(long, global = true)]
    cluster: Option<String>,
    /// Kubeconfig user (default: the context's).
    #[arg(long, global = true)]
    user: Option<String>,
    /// Namespace of the operator's benchmark pods, where it keeps each node's full result
    /// (`report`); FabricTests, runs and nodes are cluster-scoped. Default: the kubeconfig
    /// context's namespace, as kubectl's (`default` when it names none).
    #[arg(short, long, global = true)]
    namespace: Option<String>,
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
    /// test's quarantined and held-back nodes, the nodes not measured. With `-o FILE.html`
    /// (or `-o html`, to stdout) one self-contained page of the run, drawn also from the full
    /// results the operator keeps in ConfigMaps and the nodes' trend annotations.
    Report { run: String },
    /// A FabricTest's baseline: what its passing nodes measured in its recent complete runs,
    /// per GPU product, suite and NCCL settings.
    Baseline {
        #[command(subcommand)]
        action: BaselineAction,
    },
    /// A completion script for SHELL, to source or install where the shell reads them:
    /// `source <(kubectl-gpufabric completion bash)`.
    Completion { shell: Shell },
    /// The plugin's version (`clientVersion.gitVersion` with -o json|yaml).
    Version,
}

/// What `baseline` does.
#[derive(Subcommand, Debug)]
enum BaselineAction {
    /// Write TEST's baseline as a JSON file (stdout without `--file`), for `fabric-agent
    /// node-check --verdict --baseline FILE` on a node judged away from the cluster.
    Export {
        test: String,
        /// The file to write.
        #[arg(short, long)]
        file: Option<PathBuf>,
    },
}

/// The file `baseline export` writes of `test`: refused (not found) while it has none.
fn baseline_file(test: &FabricTest) -> Result<String, Failure> {
    let name = test.metadata.name.as_deref().unwrap_or_default();
    match test.status.as_ref().map(|s| &s.baseline) {
        Some(b) if !b.entries.is_empty() => Ok(b.to_json() + "\n"),
        _ => Err(not_found(format!(
            "FabricTest {name} has no baseline yet: it forms when the test folds a complete run with passing nodes"
        ))),
    }
}

/// The shells `completion` writes for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Shell {
    Bash,
    Zsh,
    Fish,
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

/// The client of the kubeconfig, context, cluster and user asked for, and the namespace:
/// `-n`, else the one the kubeconfig's context (or the in-cluster account) names.
async fn client(cli: &Cli) -> anyhow::Result<(kube::Client, String)> {
    let (config, namespace) = config(cli).await?;
    Ok((kube::Client::try_from(config)?, namespace))
}

/// The configuration [`client`] connects with, read without contacting the cluster.
async fn config(cli: &Cli) -> anyhow::Result<(kube::Config, String)> {
    let options = KubeConfigOptions {
        context: cli.context.clone(),
        cluster: cli.cluster.clone(),
        user: cli.user.clone(),
    };
    let chosen = cli.context.is_some() || cli.cluster.is_some() || cli.user.is_some();
    let config = match &cli.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options).await?
        }
        None if chosen => kube::Config::from_kubeconfig(&options).await?,
        None => kube::Config::infer()
            .await
            .context("no kubeconfig found (set KUBECONFIG or --kubeconfig)")?,
    };
    let namespace = cli
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    Ok((config, namespace))
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
    write_out(&render(view, &format)?, None)
}

/// The format of a command that prints a view: an HTML page is `report`'s only.
fn format_of(output: &Output) -> Result<Format, Failure> {
    match output {
        Output::Format(f) => Ok(f.clone()),
        Output::Html(_) => Err(Failure {
            exit: Exit::Usage,
            error: anyhow::anyhow!("-o html and -o FILE.html are for `report RUN` only"),
        }),
    }
}

/// Writes `text` to `to`, or to stdout; says where a file went.
fn write_out(text: &str, to: Option<&std::path::Path>) -> Result<(), Failure> {
    use std::io::Write;
    let Some(path) = to else {
        let mut out = std::io::stdout().lock();
        return match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                Err(anyhow::Error::new(e).context("writing to stdout").into())
            }
            _ => Ok(()),
        };
    };
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// The objects of `run`'s HTML page beyond the run and its shards, and the page itself:
/// the nodes (their trend annotations), the full results kept in `namespace`, the run
/// that confirmed this one's suspects, and the GPUs its test holds out of service.
async fn html_report(
    client: &kube::Client,
    r: &FabricTestRun,
    shards: &[FabricTestRunShard],
    nodes: Vec<Node>,
    gpus_out: &[gpufabric_kubectl::gpus_out::GpuOut],
    namespace: &str,
) -> Result<String, Failure> {
    let run = r.metadata.name.clone().unwrap_or_default();
    let of_test = ListParams::default().labels(&format!("{}={}", keys::LABEL_TEST, r.spec.test));
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    // Without them the page still draws what the run and its shards hold, and says why.
    let (kept, kept_note) = match config_maps.list(&of_test).await {
        Ok(l) => (l.items, None),
        Err(e) => (
            Vec::new(),
            Some(format!(
                "full result not read: listing the ConfigMaps of namespace {namespace} failed: {e}"
            )),
        ),
    };
    let runs: Api<FabricTestRun> = Api::all(client.clone());
    let confirmation = runs
        .list(&of_test)
        .await
        .context("listing the test's FabricTestRuns")?
        .items
        .into_iter()
        .find(|c| {
            c.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(keys::ANNOTATION_CONFIRMS))
                == Some(&run)
        })
        .and_then(|c| c.metadata.name);
    let now = gpufabric_api::rfc3339::now();
    let model = HtmlReport::of(&Sources {
        run: r,
        shards,
        nodes: &nodes,
        kept: &kept,
        kept_note: kept_note.as_deref(),
        confirmation: confirmation.as_deref(),
        generated_at: &now,
        gpus_out,
    });
    Ok(html::render(&model))
}

async fn execute(cli: &Cli) -> Result<(), Failure> {
    if !matches!(cli.command, Command::Report { .. }) {
        format_of(&cli.output)?;
    }
    match &cli.command {
        Command::Completion { shell } => return write_out(&completion(*shell), None),
        Command::Version => return print(&Version::current(), format_of(&cli.output)?),
        _ => {}
    }
    let (client, namespace) = client(cli).await?;
    let tests: Api<FabricTest> = Api::all(client.clone());
    let runs: Api<FabricTestRun> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let lp = ListParams::default();
    match &cli.command {
        Command::Status => {
            let all = tests.list(&lp).await.context("listing FabricTests")?.items;
            print(&Status::of(&all), format_of(&cli.output)?)
        }
        Command::Findings { run: Some(run) } => {
            let r = get(&runs, "FabricTestRun", run).await?;
            print(&Findings::of(&[r]), format_of(&cli.output)?)
        }
        Command::Findings { run: None } => {
            let mut all = tests.list(&lp).await.context("listing FabricTests")?.items;
            all.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            let read = runs_named(&runs, gpufabric_kubectl::findings::runs_to_read(&all)).await?;
            print(&Findings::of_tests(&all, &read), format_of(&cli.output)?)
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
            print(&NodeView::of(&n, &all, &latest), format_of(&cli.output)?)
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
                &gpufabric_api::rfc3339::now(),
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
            print(&req, format_of(&cli.output)?)
        }
        Command::Release { node, note } => {
            let n = get(&nodes, "Node", node).await?;
            let req = request::release(&n, note).map_err(refused)?;
            nodes
                .patch(node, &PatchParams::default(), &Patch::Merge(&req.patch()))
                .await
                .with_context(|| format!("annotating Node {node}"))?;
            print(&req, format_of(&cli.output)?)
        }
        Command::Baseline {
            action: BaselineAction::Export { test, file },
        } => {
            let t = get(&tests, "FabricTest", test).await?;
            write_out(&baseline_file(&t)?, file.as_deref())
        }
        Command::Completion { .. } | Command::Version => Ok(()),
        Command::Report { run } => {
            let r = get(&runs, "FabricTestRun", run).await?;
            let shards: Api<FabricTestRunShard> = Api::all(client.clone());
            let of_run = ListParams::default().labels(&format!("{}={run}", keys::LABEL_RUN));
            let shards = shards
                .list(&of_run)
                .await
                .context("listing the run's FabricTestRunShards")?
                .items;
            let test = tests
                .get_opt(&r.spec.test)
                .await
                .with_context(|| format!("reading FabricTest {}", r.spec.test))?;
            if let Output::Html(to) = &cli.output {
                let all = nodes.list(&lp).await.context("listing Nodes")?.items;
                let gpus_out = test
                    .as_ref()
                    .map(gpufabric_kubectl::gpus_out::of_test)
                    .unwrap_or_default();
                let page = html_report(&client, &r, &shards, all, &gpus_out, &namespace).await?;
                return write_out(&page, to.as_deref());
            }
            let quarantine = match test {
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
            print(&report, format_of(&cli.output)?)
        }
    }
}

/// The completion script for `shell`, for the binary's own name (`kubectl-gpufabric`):
/// kubectl completes only its own commands.
fn completion(shell: Shell) -> String {
    use clap::CommandFactory;
    use clap_complete::Shell as S;
    let shell = match shell {
        Shell::Bash => S::Bash,
        Shell::Zsh => S::Zsh,
        Shell::Fish => S::Fish,
    };
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "kubectl-gpufabric", &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // clap exits 2 on a usage error and 0 on --help, as the exit-code table says.
    let cli = Cli::parse();
    match execute(&cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            // A client error the user can act on is one line that says what to do.
            match gpufabric_kubectl::reach::explain(f.error.chain()) {
                Some(line) => eprintln!("kubectl gpufabric: {line}"),
                None => eprintln!("kubectl gpufabric: {:#}", f.error),
            }
            ExitCode::from(f.exit.code())
        }
    }
}

#[cfg(test)]
mod tests;
