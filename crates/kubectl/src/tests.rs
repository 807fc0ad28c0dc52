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
fn a_baseline_is_exported_as_the_file_the_agent_reads_and_none_is_refused() {
    use gpufabric_api::baseline::{BaselineKey, FleetBaseline, KeyedSample, RunSample};
    let mut t: FabricTest = serde_json::from_value(serde_json::json!({
        "apiVersion": "gpufabric.io/v1alpha1",
        "kind": "FabricTest",
        "metadata": {"name": "nightly"},
        "spec": {"schedule": "0 2 * * *"}
    }))
    .expect("a FabricTest");
    let Err(refused) = baseline_file(&t) else {
        panic!("a test with no baseline yet has none to export");
    };
    assert_eq!(refused.exit, Exit::NotFound);
    assert!(
        refused
            .error
            .to_string()
            .contains("nightly has no baseline yet")
    );
    let key = BaselineKey {
        product: "h100".into(),
        gpus: 8,
        suite: "s".into(),
        settings: "n".into(),
    };
    let sample = RunSample {
        run: "r".into(),
        nodes: 5,
        ..Default::default()
    };
    let b = FleetBaseline::default().with_run(&[KeyedSample { key, sample }], 100);
    t.status = Some(gpufabric_api::FabricTestStatus {
        baseline: b.clone(),
        ..Default::default()
    });
    let Ok(text) = baseline_file(&t) else {
        panic!("a test with a baseline exports it");
    };
    assert_eq!(FleetBaseline::parse(&text).ok(), Some(b));
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
    assert_eq!(cli.output, Output::Format(Format::Json));
    match cli.command {
        Command::Run { nodes, .. } => assert_eq!(nodes, ["a", "b", "c"]),
        other => panic!("{other:?}"),
    }
    let err =
        Cli::try_parse_from(["kubectl-gpufabric", "status", "-o", "xml"]).expect_err("no xml");
    assert_eq!(err.exit_code(), i32::from(Exit::Usage.code()));
}

/// kubectl's flags, before or after the command, and what each sets.
#[test]
fn kubectls_flags_are_taken_where_kubectl_takes_them() {
    type Check = fn(&Cli) -> bool;
    let table: &[(&[&str], Check)] = &[
        (&["status"], |c| {
            c.namespace.is_none() && c.output == Output::Format(Format::Table)
        }),
        (&["-n", "team-a", "report", "r1"], |c| {
            c.namespace.as_deref() == Some("team-a")
        }),
        (&["report", "r1", "--namespace", "team-a"], |c| {
            c.namespace.as_deref() == Some("team-a")
        }),
        (&["report", "r1", "--namespace=team-a"], |c| {
            c.namespace.as_deref() == Some("team-a")
        }),
        (&["--context", "prod", "status"], |c| {
            c.context.as_deref() == Some("prod")
        }),
        (
            &[
                "status",
                "--kubeconfig",
                "/k",
                "--cluster",
                "c",
                "--user",
                "u",
            ],
            |c| {
                c.kubeconfig.as_deref() == Some(std::path::Path::new("/k"))
                    && c.cluster.as_deref() == Some("c")
                    && c.user.as_deref() == Some("u")
            },
        ),
        (&["status", "-o", "wide"], |c| {
            c.output == Output::Format(Format::Wide)
        }),
        (&["status", "-oname"], |c| {
            c.output == Output::Format(Format::Name)
        }),
        (&["findings", "--output=yaml"], |c| {
            c.output == Output::Format(Format::Yaml)
        }),
        (
            &["status", "-o", "jsonpath={.tests[*].name}"],
            |c| matches!(&c.output, Output::Format(Format::JsonPath(t)) if t.to_string() == "{.tests[*].name}"),
        ),
        (&["report", "r1", "-o", "r1.html"], |c| {
            c.output == Output::Html(Some("r1.html".into()))
        }),
        (&["completion", "zsh"], |c| {
            matches!(c.command, Command::Completion { shell: Shell::Zsh })
        }),
        (&["version", "-o", "json"], |c| {
            matches!(c.command, Command::Version)
        }),
    ];
    for (args, check) in table {
        let cli =
            Cli::try_parse_from(std::iter::once("kubectl-gpufabric").chain(args.iter().copied()))
                .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        assert!(check(&cli), "{args:?} gave {cli:?}");
    }
    for bad in [
        &["status", "-o", "jsonpath={.tests"][..],
        &["completion", "tcsh"],
        &["status", "-n"],
    ] {
        let err =
            Cli::try_parse_from(std::iter::once("kubectl-gpufabric").chain(bad.iter().copied()))
                .expect_err(&format!("{bad:?}"));
        assert_eq!(err.exit_code(), i32::from(Exit::Usage.code()), "{bad:?}");
    }
}

const KUBECONFIG: &str = "apiVersion: v1
kind: Config
current-context: a
contexts:
- name: a
  context: {cluster: c, user: u, namespace: team-a}
- name: b
  context: {cluster: c, user: u}
clusters:
- name: c
  cluster: {server: https://127.0.0.1:6443}
users:
- name: u
  user: {token: t}
";

/// `report` reads full results in the namespace kubectl would use, never a fixed one.
#[tokio::test]
async fn the_namespace_is_the_flags_else_the_contexts_else_default() {
    let dir = std::env::temp_dir().join(format!("kubectl-gpufabric-ns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("config");
    std::fs::write(&path, KUBECONFIG).expect("kubeconfig written");
    let kc = path.to_str().expect("utf-8 path");
    for (args, namespace) in [
        (&["report", "r"][..], "team-a"),
        (&["report", "r", "-n", "ops"], "ops"),
        (&["--context", "b", "report", "r"], "default"),
        (&["--context", "b", "-n", "ops", "report", "r"], "ops"),
    ] {
        let cli = Cli::try_parse_from(
            ["kubectl-gpufabric", "--kubeconfig", kc]
                .into_iter()
                .chain(args.iter().copied()),
        )
        .expect("parses");
        let (_, ns) = config(&cli).await.expect("config");
        assert_eq!(ns, namespace, "{args:?}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn completion_scripts_complete_the_commands_for_each_shell() {
    for (shell, marker) in [
        (Shell::Bash, "complete -F"),
        (Shell::Zsh, "#compdef kubectl-gpufabric"),
        (Shell::Fish, "complete -c kubectl-gpufabric"),
    ] {
        let script = completion(shell);
        assert!(script.contains(marker), "{shell:?}: {script}");
        for command in ["status", "findings", "report", "release", "version"] {
            assert!(script.contains(command), "{shell:?} lacks {command}");
        }
    }
}
