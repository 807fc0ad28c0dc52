//! `fabric-operator`: runs the controllers, or writes the CRDs.

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// Tests the GPU fabric of a Kubernetes cluster on a schedule and quarantines failing nodes.
#[derive(Parser, Debug)]
#[command(name = "fabric-operator", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
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

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crdgen { out } => crdgen(out),
    }
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
