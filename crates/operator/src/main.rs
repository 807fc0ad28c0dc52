//! `fabric-operator`: runs the controllers, writes the CRDs, or releases what the operator
//! made before an uninstall.

#![forbid(unsafe_code)]

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

mod uninstall;

/// Tests the GPU fabric of a Kubernetes cluster on a schedule and quarantines failing nodes.
#[derive(Parser, Debug)]
#[command(name = "fabric-operator", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up; boxing the flags of `run` would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Run the controllers against a cluster.
    ///
    /// Connects with --kubeconfig, else $KUBECONFIG, else ~/.kube/config, else the in-cluster
    /// service account. Watches every FabricTest and FabricTestRun (cluster-scoped; or those
    /// --selector matches) and creates benchmark pods in --pod-namespace. Serves /metrics, /live and /ready on --admin-addr. Stops cleanly on
    /// SIGINT or SIGTERM; a restarted operator resumes every run from the API server.
    Run {
        /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
        #[arg(long, value_name = "PATH")]
        kubeconfig: Option<PathBuf>,
        /// Namespace of the benchmark pods, and of the leader Lease unless --lease-namespace
        /// names another (the chart sets it to the release namespace).
        #[arg(long, env = "POD_NAMESPACE", value_name = "NS", default_value = gpufabric_operator::DEFAULT_POD_NAMESPACE)]
        pod_namespace: String,
        /// Watch only the FabricTests (and their runs) with these labels, e.g. `team=infra`
        /// (default: all). Runs carry their test's labels.
        #[arg(long, short = 'l', value_name = "SELECTOR")]
        selector: Option<String>,
        /// Removed: FabricTest is cluster-scoped. Refused with a message saying so.
        #[arg(long, short = 'n', value_name = "NS", hide = true)]
        namespace: Option<String>,
        /// Address of the admin server (/metrics, /live, /ready); "off" disables it.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
        admin_addr: String,
        /// Who may read /metrics: `kubernetes` (a bearer token the API server accepts, of an
        /// identity allowed `get` on the non-resource URL /metrics, as kube-rbac-proxy
        /// checks), or `none` (anyone who reaches the port). /live and /ready stay open.
        #[arg(long, value_enum, value_name = "MODE", default_value = "kubernetes")]
        metrics_auth: MetricsAuth,
        /// Log as JSON lines instead of text.
        #[arg(long)]
        log_json: bool,
        /// Run the controllers only while holding the Lease `fabric-operator` (for more than
        /// one replica). Identity: $POD_NAME, else the host name.
        #[arg(long)]
        leader_elect: bool,
        /// Namespace of the leader Lease (default: --pod-namespace).
        #[arg(long, value_name = "NS")]
        lease_namespace: Option<String>,
        /// Image of the benchmark pods when a FabricTest names none in spec.agent.image.
        #[arg(long, env = "FABRIC_AGENT_IMAGE", value_name = "IMAGE", default_value = gpufabric_api::test::DEFAULT_AGENT_IMAGE)]
        agent_image: String,
        /// PriorityClass of the benchmark pods when a FabricTest names none in
        /// spec.agent.priorityClassName.
        #[arg(long, value_name = "NAME")]
        agent_priority_class: Option<String>,
        /// RuntimeClass of the benchmark pods when a FabricTest names none in
        /// spec.agent.runtimeClassName (e.g. nvidia).
        #[arg(long, value_name = "NAME")]
        agent_runtime_class: Option<String>,
        /// Secret (in --pod-namespace) the benchmark pods pull their image with when a
        /// FabricTest lists none in spec.agent.imagePullSecrets; repeated or comma-separated.
        #[arg(long, value_name = "NAME", value_delimiter = ',')]
        agent_image_pull_secret: Vec<String>,
        /// Name of the leader Lease (one per installation; the chart uses the release name).
        #[arg(long, value_name = "NAME", default_value = gpufabric_operator::leader::DEFAULT_LEASE_NAME)]
        lease_name: String,
        /// Most nodes gpufabric holds in quarantine in the whole cluster, over every
        /// FabricTest: a count (e.g. 5) or a percent of the cluster's GPU nodes (e.g. 2%,
        /// rounded down but at least 1). Beyond it nothing new is quarantined. "none": no
        /// cluster-wide cap, only each test's spec.quarantine.maxQuarantined.
        #[arg(long, env = "FABRIC_MAX_QUARANTINED_NODES", value_name = "COUNT|PERCENT|none", default_value_t = gpufabric_health::ClusterCap::DEFAULT.to_string(), value_parser = check_cluster_cap)]
        max_quarantined_nodes: String,
        /// Serve the validating admission webhook (HTTPS) on this address, e.g. 0.0.0.0:9443.
        #[arg(long, value_name = "ADDR", requires_all = ["webhook_cert", "webhook_key"])]
        webhook_addr: Option<std::net::SocketAddr>,
        /// PEM certificate chain of the webhook (read again when the file changes).
        #[arg(long, value_name = "PATH", requires = "webhook_addr")]
        webhook_cert: Option<PathBuf>,
        /// PEM private key of the webhook certificate.
        #[arg(long, value_name = "PATH", requires = "webhook_addr")]
        webhook_key: Option<PathBuf>,
    },
    /// Delete the FabricTests this installation acts on and wait until every node they
    /// quarantined is released (what `helm uninstall` runs first, as a pre-delete hook).
    ///
    /// Deletes the FabricTests --selector matches (all when none), then waits for their
    /// finalizer: the running operator undoes the cordon, taint and label it made on each
    /// node, and only those (a node's `gpufabric.io/quarantine` record names them; a cordon
    /// made by someone else stays). When no operator runs (its leader Lease --lease-name is
    /// absent, released, or not renewed for its duration, e.g. scaled to 0), the same release
    /// runs here, then the finalizer is removed. A test with `releaseOnDelete: false` keeps
    /// its quarantines. Prints progress; after --timeout it names the tests still there and
    /// the nodes they hold, says what to do, and exits 1. Connects as `run` does.
    Uninstall {
        /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
        #[arg(long, value_name = "PATH")]
        kubeconfig: Option<PathBuf>,
        /// Delete only the FabricTests with these labels, e.g. `team=infra`: the operator's
        /// own --selector (default: all).
        #[arg(long, short = 'l', value_name = "SELECTOR")]
        selector: Option<String>,
        /// How long to wait for the finalizers, e.g. 120s, 5m.
        #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = uninstall::parse_timeout)]
        timeout: std::time::Duration,
        /// Namespace of the operator's leader Lease (the chart: the release namespace).
        #[arg(long, env = "POD_NAMESPACE", value_name = "NS", default_value = gpufabric_operator::DEFAULT_POD_NAMESPACE)]
        lease_namespace: String,
        /// Name of the operator's leader Lease (the chart: `<release>-operator`).
        #[arg(long, value_name = "NAME", default_value = gpufabric_operator::leader::DEFAULT_LEASE_NAME)]
        lease_name: String,
    },
    /// Write the CustomResourceDefinitions (FabricTest, FabricTestRun) as YAML.
    ///
    /// With --out DIR, one file per CRD (what `crds/` holds; CI fails when it is stale);
    /// without, all of them to stdout, ready for `kubectl apply -f -`.
    Crdgen {
        /// Directory to write the files into (e.g. `crds`).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// mimalloc gives memory back to the system as the caches churn (thousands of Node and Pod
/// updates a run): with glibc's allocator the operator's resident size kept every peak.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crdgen { out } => crdgen(out),
        Command::Uninstall {
            kubeconfig,
            selector,
            timeout,
            lease_namespace,
            lease_name,
        } => {
            init_tracing(false);
            let opts = uninstall::Options {
                selector,
                timeout,
                lease_namespace,
                lease_name,
            };
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(async move {
                let client = client(kubeconfig).await?;
                uninstall::run(client, &opts).await
            })
        }
        Command::Run {
            kubeconfig,
            pod_namespace,
            selector,
            namespace,
            admin_addr,
            metrics_auth,
            log_json,
            leader_elect,
            lease_namespace,
            lease_name,
            agent_image,
            agent_priority_class,
            agent_runtime_class,
            agent_image_pull_secret,
            max_quarantined_nodes,
            webhook_addr,
            webhook_cert,
            webhook_key,
        } => {
            if let Some(ns) = namespace {
                anyhow::bail!(
                    "--namespace {ns:?} is no longer accepted: FabricTest and FabricTestRun are \
                     cluster-scoped, so the operator watches all of them. Pass \
                     --pod-namespace {ns} to create the benchmark pods there, and --selector \
                     to watch only some FabricTests."
                );
            }
            init_tracing(log_json);
            let admin_addr = match admin_addr.as_str() {
                "off" | "" => None,
                a => Some(a.parse().with_context(|| {
                    format!("--admin-addr {a:?} is not an address like 127.0.0.1:8080")
                })?),
            };
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(async move {
                if let (Some(addr), Some(cert), Some(key)) =
                    (webhook_addr, webhook_cert, webhook_key)
                {
                    start_webhook(addr, cert, key).await?;
                }
                let client = client(kubeconfig).await?;
                let mut options =
                    gpufabric_operator::controller_options(pod_namespace.clone(), admin_addr);
                options.agent_image = agent_image;
                options.pod_defaults = gpufabric_operator::pod_defaults::PodDefaults {
                    priority_class_name: agent_priority_class.filter(|c| !c.is_empty()),
                    runtime_class_name: agent_runtime_class.filter(|c| !c.is_empty()),
                    image_pull_secrets: agent_image_pull_secret
                        .into_iter()
                        .filter(|s| !s.is_empty())
                        .collect(),
                };
                options.selector = selector;
                options.max_quarantined_nodes =
                    gpufabric_health::ClusterCap::setting(&max_quarantined_nodes)
                        .map_err(|e| anyhow::anyhow!("--max-quarantined-nodes: {e}"))?;
                options.metrics_auth = metrics_auth == MetricsAuth::Kubernetes;
                if leader_elect {
                    let ns = lease_namespace.unwrap_or(pod_namespace);
                    let identity = std::env::var("POD_NAME")
                        .ok()
                        .or_else(|| std::env::var("HOSTNAME").ok())
                        .unwrap_or_else(|| format!("fabric-operator-{}", std::process::id()));
                    let mut cfg = gpufabric_operator::leader::LeaderConfig::new(ns, identity);
                    cfg.name = lease_name;
                    options.leader = Some(cfg);
                }
                gpufabric_operator::run(client, options)
                    .await
                    .context("running the controllers")
            })
        }
    }
}

/// Binds the admission webhook (failing now on a bad certificate or address) and serves
/// it in the background on every replica, leader or not.
async fn start_webhook(
    addr: std::net::SocketAddr,
    cert: PathBuf,
    key: PathBuf,
) -> anyhow::Result<()> {
    use gpufabric_operator::webhook::{CertFiles, Webhook};
    let webhook = Webhook::bind(addr, CertFiles { cert, key })
        .await
        .context("starting the admission webhook")?;
    tokio::spawn(async move {
        if let Err(e) = webhook.serve(std::future::pending()).await {
            tracing::error!(error = %e, "the admission webhook stopped");
        }
    });
    Ok(())
}

/// A `--max-quarantined-nodes` value that [`gpufabric_health::ClusterCap::setting`] reads.
fn check_cluster_cap(s: &str) -> Result<String, String> {
    gpufabric_health::ClusterCap::setting(s).map(|_| s.to_string())
}

fn init_tracing(json: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,kube=warn,tower=warn,hyper=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn client(kubeconfig: Option<PathBuf>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(&path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("using kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig found ($KUBECONFIG, ~/.kube/config) and not running in a cluster; pass --kubeconfig PATH")?,
    };
    kube::Client::try_from(config).context("creating the Kubernetes client")
}

fn crdgen(out: Option<PathBuf>) -> anyhow::Result<()> {
    for (file, crd) in gpufabric_api::crds() {
        let yaml = gpufabric_api::crd_yaml(&crd)?;
        match &out {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                let path = dir.join(file);
                std::fs::write(&path, yaml)
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
            None => print!("---\n{yaml}"),
        }
    }
    Ok(())
}

/// `--metrics-auth`: who may read /metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum MetricsAuth {
    /// TokenReview and SubjectAccessReview on the non-resource URL /metrics.
    Kubernetes,
    /// Anyone who reaches the admin port.
    None,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap_of(args: &[&str]) -> Option<gpufabric_health::ClusterCap> {
        let cli = Cli::try_parse_from(["fabric-operator", "run"].iter().chain(args))
            .expect("the flags parse");
        let Command::Run {
            max_quarantined_nodes,
            ..
        } = cli.command
        else {
            panic!("not run");
        };
        gpufabric_health::ClusterCap::setting(&max_quarantined_nodes).expect("a valid cap")
    }

    #[test]
    fn the_cluster_cap_is_on_unless_turned_off_by_name() {
        // The variable would stand in for the flag's default.
        assert!(std::env::var_os("FABRIC_MAX_QUARANTINED_NODES").is_none());
        assert_eq!(cap_of(&[]), Some(gpufabric_health::ClusterCap::Percent(10)));
        assert_eq!(
            cap_of(&["--max-quarantined-nodes", "3"]),
            Some(gpufabric_health::ClusterCap::Nodes(3))
        );
        assert_eq!(cap_of(&["--max-quarantined-nodes", "none"]), None);
        assert!(
            Cli::try_parse_from(["fabric-operator", "run", "--max-quarantined-nodes", ""]).is_err(),
            "an empty value is refused, not read as no cap"
        );
    }
}
