//! `fabric-agent inject`: real faults on real GPUs, to run beside a `node-check` and see
//! that the check finds them (a slow GPU pair, a straggler GPU).

use anyhow::Context;
use gpufabric_measure::cuda::inject;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// Arguments of `fabric-agent inject`.
#[derive(clap::Args, Debug, Clone)]
pub struct InjectArgs {
    #[command(subcommand)]
    pub fault: Fault,
}

/// The fault to inject.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum Fault {
    /// Continuous copy traffic between two GPUs (both ways): that pair's copies slow down.
    SlowPair {
        /// The two GPUs, e.g. `3,5`.
        #[arg(long, value_delimiter = ',', num_args = 1..)]
        gpus: Vec<u32>,
        /// How long to run.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
    },
    /// Continuous bf16 GEMMs on one GPU: its share of any other work slows down.
    Straggler {
        /// The GPU to load.
        #[arg(long)]
        gpu: u32,
        /// How long to run.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
    },
    /// Continuous copies between host memory and one GPU, both ways: that GPU's
    /// host-to-device and device-to-host bandwidth drops, as on a link trained down.
    HostLoad {
        /// The GPU whose host link to load.
        #[arg(long)]
        gpu: u32,
        /// Copy streams in each direction.
        #[arg(long, default_value_t = 3)]
        streams: usize,
        /// How long to run.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
    },
}

/// The two GPUs of a slow pair, or why the list is not a pair.
pub fn pair_of(gpus: &[u32]) -> anyhow::Result<(u32, u32)> {
    match gpus {
        [a, b] if a != b => Ok((*a, *b)),
        [a, b] => anyhow::bail!("--gpus names GPU {a} twice; a slow pair needs two GPUs ({b})"),
        _ => anyhow::bail!(
            "--gpus needs exactly two GPU indices, like --gpus 3,5 (got {})",
            gpus.len()
        ),
    }
}

/// Runs the injector until its time is up (or the process is killed).
pub fn run(args: InjectArgs) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    match args.fault {
        Fault::SlowPair { gpus, seconds } => {
            let (a, b) = pair_of(&gpus)?;
            eprintln!("fabric-agent: injecting a slow GPU pair {a},{b} for {seconds} s");
            let r = inject::slow_pair(a, b, Duration::from_secs(seconds), &stop)
                .with_context(|| format!("slow pair {a},{b}"))?;
            eprintln!(
                "fabric-agent: slow pair {a},{b} done: {:.0} s, {:.1} GB/s of background copies",
                r.seconds,
                r.work / r.seconds.max(1e-9) / 1e9
            );
        }
        Fault::Straggler { gpu, seconds } => {
            eprintln!("fabric-agent: injecting a straggler on GPU {gpu} for {seconds} s");
            let r = inject::straggler(gpu, Duration::from_secs(seconds), &stop)
                .with_context(|| format!("straggler on GPU {gpu}"))?;
            eprintln!(
                "fabric-agent: straggler on GPU {gpu} done: {:.0} s, {:.0} TFLOP/s of background GEMMs",
                r.seconds,
                r.work / r.seconds.max(1e-9) / 1e12
            );
        }
        Fault::HostLoad {
            gpu,
            streams,
            seconds,
        } => {
            eprintln!(
                "fabric-agent: loading GPU {gpu}'s host link ({streams} streams each way) for {seconds} s"
            );
            let r = inject::host_load(gpu, streams, Duration::from_secs(seconds), &stop)
                .with_context(|| format!("host-link load on GPU {gpu}"))?;
            eprintln!(
                "fabric-agent: host-link load on GPU {gpu} done: {:.0} s, {:.1} GB/s of background copies",
                r.seconds,
                r.work / r.seconds.max(1e-9) / 1e9
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_pair_needs_two_distinct_gpus() {
        assert_eq!(pair_of(&[3, 5]).ok(), Some((3, 5)));
        assert!(pair_of(&[3]).is_err());
        assert!(pair_of(&[3, 3]).is_err());
        assert!(pair_of(&[1, 2, 3]).is_err());
    }
}
