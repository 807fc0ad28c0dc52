//! The agent's exit codes: one table for every subcommand, printed by `--help` and
//! reproduced in docs/agent.md ("Exit codes", checked by this module's tests). As nccl-tests does,
//! values are checked by default and wrong values end the program non-zero; `-c 0` turns
//! the check off.

use gpufabric_api::run::NodeVerdict;
use gpufabric_measure::CheckError;

/// How `fabric-agent` ends. Every code a subcommand gives is here, with what it means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Measured, every checked value right (and, with `--verdict`, the node passed).
    Success,
    /// An error no other code names (a document that cannot be written, a bug).
    Error,
    /// The command line, suite, thresholds, fleet or rendezvous address is invalid.
    Usage,
    /// The health rules fail the node (`node-check --verdict`).
    NodeFailed,
    /// A collective produced wrong values.
    WrongValues,
    /// A test over several nodes was not measured for a reason outside this node's fabric.
    NotMeasured,
    /// No GPU found.
    NoGpu,
    /// A CUDA, NCCL or NVML library could not be loaded.
    LibraryMissing,
    /// Fewer GPUs than `--expect-gpus`.
    TooFewGpus,
    /// The check could not run on the GPUs for another reason.
    CheckFailed,
    /// Other work holds this node's GPUs: not measured.
    GpusInUse,
    /// Stopped by SIGTERM (128 + 15, what the signal itself would give).
    Stopped,
}

impl Exit {
    /// Every exit code, in the order of the table.
    pub const ALL: [Exit; 12] = [
        Exit::Success,
        Exit::Error,
        Exit::Usage,
        Exit::NodeFailed,
        Exit::WrongValues,
        Exit::NotMeasured,
        Exit::NoGpu,
        Exit::LibraryMissing,
        Exit::TooFewGpus,
        Exit::CheckFailed,
        Exit::GpusInUse,
        Exit::Stopped,
    ];

    /// The process's exit status.
    pub const fn code(self) -> i32 {
        match self {
            Exit::Success => 0,
            Exit::Error => 1,
            Exit::Usage => 2,
            Exit::NodeFailed => 3,
            Exit::WrongValues => 4,
            Exit::NotMeasured => 5,
            Exit::NoGpu => 10,
            Exit::LibraryMissing => 11,
            Exit::TooFewGpus => 12,
            Exit::CheckFailed => 13,
            Exit::GpusInUse => 14,
            Exit::Stopped => 143,
        }
    }

    /// What the code means (Markdown: docs/agent.md shows it as it is, `--help` without the
    /// backticks).
    pub const fn meaning(self) -> &'static str {
        match self {
            Exit::Success => {
                "success: measured and every checked value right (with `--verdict`: the node passed)"
            }
            Exit::Error => {
                "an error no other code names (the document could not be written, a bug); the message says what"
            }
            Exit::Usage => {
                "usage error: invalid arguments, suite, thresholds, fleet or rendezvous address"
            }
            Exit::NodeFailed => {
                "node failed: the operator's health rules fail the node (`--verdict`); the findings are printed"
            }
            Exit::WrongValues => {
                "wrong values: a collective produced wrong elements (checked unless `-c 0`, as nccl-tests); the document is written"
            }
            Exit::NotMeasured => {
                "not measured: with `--verdict`, a phase asked for could not run (NCCL refused the test's settings, a library is missing) and nothing failed the node, the phases named; a rank never arrived, or other work took the GPUs while a rank waited or measured; the document says why and counts against no node"
            }
            Exit::NoGpu => "no GPU found",
            Exit::LibraryMissing => "a CUDA, NCCL or NVML library could not be loaded",
            Exit::TooFewGpus => "too few GPUs: fewer visible than `--expect-gpus`",
            Exit::CheckFailed => "the check could not run on the GPUs (another failure)",
            Exit::GpusInUse => {
                "GPUs in use: other work holds this node's GPUs (node-check: before or while it measures; a rank: before it meets the others); not measured, see `--shared-gpus`"
            }
            Exit::Stopped => {
                "stopped by SIGTERM; the phase it was in is said on stderr and in the termination message"
            }
        }
    }

    /// The subcommands that end with this code.
    pub const fn from(self) -> &'static str {
        match self {
            Exit::Success | Exit::Error | Exit::Usage | Exit::Stopped => "every subcommand",
            Exit::NodeFailed | Exit::TooFewGpus => "node-check",
            Exit::WrongValues => "node-check, node-pair, nccl-nodes",
            Exit::NotMeasured
            | Exit::NoGpu
            | Exit::LibraryMissing
            | Exit::CheckFailed
            | Exit::GpusInUse => "node-check, node-pair, ddp-nodes, nccl-nodes",
        }
    }

    /// The exit code of an error that stops a subcommand.
    pub fn of(e: &CheckError) -> Exit {
        match e {
            CheckError::NoGpu(_) => Exit::NoGpu,
            CheckError::LibraryMissing { .. } => Exit::LibraryMissing,
            CheckError::TooFewGpus { .. } => Exit::TooFewGpus,
            CheckError::InvalidInput(_) => Exit::Usage,
            CheckError::Other(_) => Exit::CheckFailed,
            CheckError::GpusInUse(_) => Exit::GpusInUse,
        }
    }

    /// The end of a measurement whose document is written, by its verdict (`None` without
    /// `--verdict`): a failed verdict first (its findings name any wrong values too), then
    /// wrong values (`wrong`: the wrong elements the check counted; 0 when the check was
    /// off), then a verdict of a node not measured (a phase it was asked for could not run),
    /// else success.
    pub fn judged(verdict: Option<NodeVerdict>, wrong: u64) -> Exit {
        match verdict {
            Some(NodeVerdict::Failed | NodeVerdict::Errored | NodeVerdict::Timeout) => {
                Exit::NodeFailed
            }
            _ if wrong > 0 => Exit::WrongValues,
            Some(NodeVerdict::NotMeasured) => Exit::NotMeasured,
            _ => Exit::Success,
        }
    }
}

/// The table as `--help` prints it under every subcommand.
pub fn help() -> String {
    let mut out = String::from("Exit codes (the same for every subcommand):\n");
    for e in Exit::ALL {
        out.push_str(&format!(
            "  {:>3}  {} [{}]\n",
            e.code(),
            e.meaning().replace('`', ""),
            e.from()
        ));
    }
    out.push_str(
        "\nA failed verdict (3) wins over wrong values (4), and both over a verdict with a \
         phase not run (5). The sim backend's crash fault \
         exits with the code its fleet file gives.",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line above docs/agent.md's table.
    const README_MARK: &str = "<!-- fabric-agent exit codes: crates/agent/src/exit.rs -->";

    /// The table as docs/agent.md shows it, header included.
    fn markdown() -> String {
        let mut out = String::from("| code | meaning | from |\n| --- | --- | --- |\n");
        for e in Exit::ALL {
            out.push_str(&format!(
                "| {} | {} | {} |\n",
                e.code(),
                e.meaning(),
                e.from()
            ));
        }
        out
    }

    #[test]
    fn codes_are_distinct_and_the_errors_keep_the_measure_crates_codes() {
        let mut codes: Vec<i32> = Exit::ALL.iter().map(|e| e.code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), Exit::ALL.len(), "{codes:?}");
        for e in [
            CheckError::NoGpu("x".into()),
            CheckError::LibraryMissing {
                library: "libcuda.so.1".into(),
                detail: "x".into(),
            },
            CheckError::TooFewGpus {
                found: 7,
                wanted: 8,
            },
            CheckError::InvalidInput("x".into()),
            CheckError::Other("x".into()),
            CheckError::GpusInUse("x".into()),
        ] {
            assert_eq!(Exit::of(&e).code(), e.exit_code(), "{e}");
        }
    }

    #[test]
    fn a_failed_verdict_wins_over_wrong_values_and_wrong_values_fail() {
        assert_eq!(Exit::judged(None, 0), Exit::Success);
        assert_eq!(Exit::judged(Some(NodeVerdict::Passed), 0), Exit::Success);
        assert_eq!(Exit::judged(None, 3), Exit::WrongValues);
        assert_eq!(Exit::judged(Some(NodeVerdict::Failed), 3), Exit::NodeFailed);
        assert_eq!(Exit::judged(Some(NodeVerdict::Failed), 0), Exit::NodeFailed);
        assert_eq!(
            Exit::judged(Some(NodeVerdict::Timeout), 0),
            Exit::NodeFailed
        );
    }

    #[test]
    fn a_verdict_with_a_phase_not_run_is_never_success() {
        assert_eq!(
            Exit::judged(Some(NodeVerdict::NotMeasured), 0),
            Exit::NotMeasured
        );
        assert_eq!(Exit::NotMeasured.code(), 5);
        // Wrong values are still named first, a failure before both.
        assert_eq!(
            Exit::judged(Some(NodeVerdict::NotMeasured), 2),
            Exit::WrongValues
        );
        assert!(Exit::NotMeasured.from().contains("node-check"));
    }

    #[test]
    fn the_help_lists_every_code() {
        let help = help();
        for e in Exit::ALL {
            assert!(
                help.lines()
                    .any(|l| l.trim_start().starts_with(&format!("{}  ", e.code()))),
                "{e:?} missing:\n{help}"
            );
        }
        assert!(!help.contains('`'), "{help}");
    }

    /// docs/agent.md's table is this module's, row for row.
    #[test]
    fn readmes_table_is_this_one() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/agent.md");
        let readme = std::fs::read_to_string(path).expect("docs/agent.md is readable");
        let (_, after) = readme
            .split_once(README_MARK)
            .unwrap_or_else(|| panic!("docs/agent.md has no {README_MARK:?} line"));
        let table: String = after
            .trim_start_matches('\n')
            .lines()
            .take_while(|l| l.starts_with('|'))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            table,
            markdown(),
            "docs/agent.md's exit-code table differs from crates/agent/src/exit.rs; write this there:\n{}",
            markdown()
        );
    }
}
