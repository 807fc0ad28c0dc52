//! The exit codes of `kubectl gpufabric`: one table for every command, printed by `--help`
//! and reproduced in docs/kubectl.md (checked by this module's tests), so that scripts can tell a
//! missing object from a failed request.

/// How `kubectl gpufabric` ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Done.
    Success,
    /// The API server could not be reached or refused a request, or another error.
    Error,
    /// The command line is invalid.
    Usage,
    /// The FabricTest, FabricTestRun or Node named does not exist.
    NotFound,
    /// The request would do nothing or the wrong thing, so it was not made.
    Refused,
}

impl Exit {
    /// Every exit code, in the order of the table.
    pub const ALL: [Exit; 5] = [
        Exit::Success,
        Exit::Error,
        Exit::Usage,
        Exit::NotFound,
        Exit::Refused,
    ];

    /// The process's exit status.
    pub const fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::Error => 1,
            Exit::Usage => 2,
            Exit::NotFound => 3,
            Exit::Refused => 4,
        }
    }

    /// What the code means (Markdown: docs/kubectl.md shows it as it is, `--help` without the
    /// backticks).
    pub const fn meaning(self) -> &'static str {
        match self {
            Exit::Success => "success",
            Exit::Error => {
                "the API server could not be reached or refused the request (no kubeconfig, no permission), or another error; the message says what"
            }
            Exit::Usage => "usage error: invalid arguments",
            Exit::NotFound => "the FabricTest, FabricTestRun or Node named does not exist",
            Exit::Refused => {
                "refused: `release` of a node that carries no gpufabric quarantine record (nothing to release), or whose record cannot be read"
            }
        }
    }
}

/// The table as `--help` prints it.
pub fn help() -> String {
    let mut out = String::from("Exit codes (the same for every command):\n");
    for e in Exit::ALL {
        out.push_str(&format!(
            "  {}  {}\n",
            e.code(),
            e.meaning().replace('`', "")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line above docs/kubectl.md's table.
    const README_MARK: &str = "<!-- kubectl gpufabric exit codes: crates/kubectl/src/exit.rs -->";

    fn markdown() -> String {
        let mut out = String::from("| code | meaning |\n| --- | --- |\n");
        for e in Exit::ALL {
            out.push_str(&format!("| {} | {} |\n", e.code(), e.meaning()));
        }
        out
    }

    #[test]
    fn codes_are_distinct_and_the_help_lists_each() {
        let mut codes: Vec<u8> = Exit::ALL.iter().map(|e| e.code()).collect();
        codes.dedup();
        assert_eq!(codes.len(), Exit::ALL.len());
        let help = help();
        for e in Exit::ALL {
            assert!(help.contains(&format!("  {}  ", e.code())), "{help}");
        }
        assert!(!help.contains('`'), "{help}");
    }

    #[test]
    fn readme_shows_the_same_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/kubectl.md");
        let readme = std::fs::read_to_string(path).expect("docs/kubectl.md");
        let at = readme
            .find(README_MARK)
            .expect("docs/kubectl.md marks the exit-code table");
        let table = &readme[at + README_MARK.len()..].trim_start();
        assert!(
            table.starts_with(&markdown()),
            "docs/kubectl.md's table differs from exit.rs; it should read:\n{}",
            markdown()
        );
    }
}
