//! `deploy/release.sh`, the version bump, on a copy of the repository (never on the
//! repository itself): its dry run prints every change and makes none; its run moves the
//! crates, the lock file, the chart, the manifests and CHANGELOG's "Unreleased" together.

use gpufabric_tests::workspace_root;
use std::path::Path;
use std::process::Command;

/// The repository's tracked and new files, copied into `to`.
fn copy_repository(to: &Path) {
    let root = workspace_root();
    let files = Command::new("git")
        .args(["ls-files", "-co", "--exclude-standard", "-z"])
        .current_dir(&root)
        .output()
        .expect("git ls-files runs");
    assert!(files.status.success(), "git ls-files failed");
    for name in files.stdout.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let rel = Path::new(std::str::from_utf8(name).expect("utf-8 path"));
        let from = root.join(rel);
        if !from.is_file() {
            continue; // deleted in the work tree
        }
        let dest = to.join(rel);
        std::fs::create_dir_all(dest.parent().expect("a parent")).expect("dir");
        std::fs::copy(&from, &dest).expect("copied");
    }
}

fn release(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new("bash")
        .arg(dir.join("deploy/release.sh"))
        .args(args)
        .env("RELEASE_DATE", "2031-01-02")
        .current_dir(dir)
        .output()
        .expect("deploy/release.sh runs")
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// Where the section of `version` starts: `## 0.2.0`, or `## 0.3.0 (2026-11-29)` as this
/// script writes it.
fn section_of(changelog: &str, version: &str) -> Option<usize> {
    [format!("\n## {version}\n"), format!("\n## {version} (")]
        .iter()
        .filter_map(|heading| changelog.find(heading.as_str()))
        .min()
}

const FILES: [&str; 6] = [
    "Cargo.toml",
    "Cargo.lock",
    "charts/gpufabric/Chart.yaml",
    "deploy/operator.yaml",
    "deploy/examples/full.yaml",
    "CHANGELOG.md",
];

#[test]
fn the_release_step_bumps_every_version_together_and_its_dry_run_changes_nothing() {
    let old = env!("CARGO_PKG_VERSION");
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path();
    copy_repository(dir);
    // A note in "Unreleased", whatever the repository's holds now, for the release to move.
    let changelog = read(dir, "CHANGELOG.md").replacen(
        "## Unreleased\n",
        "## Unreleased\n\n**A note of this release.** It moves under the version.\n",
        1,
    );
    std::fs::write(dir.join("CHANGELOG.md"), changelog).expect("CHANGELOG.md written");
    let before: Vec<String> = FILES.iter().map(|f| read(dir, f)).collect();

    let dry = release(dir, &["9.8.7", "--dry-run"]);
    let out = String::from_utf8_lossy(&dry.stdout);
    let err = String::from_utf8_lossy(&dry.stderr);
    assert!(dry.status.success(), "{out}\n{err}");
    for f in FILES {
        assert!(
            out.contains(&format!("+++ b/{f}")),
            "the dry run shows no change to {f}\n{out}"
        );
    }
    assert!(
        out.contains("+version: 9.8.7") && out.contains("+## 9.8.7 (2031-01-02)"),
        "{out}"
    );
    assert!(
        err.contains(&format!("{old} -> 9.8.7 would change")),
        "{err}"
    );
    let after: Vec<String> = FILES.iter().map(|f| read(dir, f)).collect();
    assert_eq!(before, after, "the dry run changed a file");

    let run = release(dir, &["9.8.7"]);
    let said = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{said}");
    // The tag the chart's NOTES.txt links (v<appVersion>) is the one it says to make.
    assert!(said.contains("tag v9.8.7"), "{said}");
    let chart: serde_json::Value =
        serde_yaml::from_str(&read(dir, "charts/gpufabric/Chart.yaml")).expect("Chart.yaml");
    assert_eq!(chart["version"], "9.8.7");
    assert_eq!(chart["appVersion"], "9.8.7");
    let cargo = read(dir, "Cargo.toml");
    assert!(cargo.contains("\nversion = \"9.8.7\"\n"), "Cargo.toml");
    let lock = read(dir, "Cargo.lock");
    for krate in [
        "gpufabric-api",
        "gpufabric-operator",
        "gpufabric-kubectl",
        "gpufabric-agent",
    ] {
        assert!(
            lock.contains(&format!("name = \"{krate}\"\nversion = \"9.8.7\"")),
            "Cargo.lock: {krate}"
        );
    }
    let manifests = read(dir, "deploy/operator.yaml");
    assert!(
        !manifests.contains(&format!("\"{old}\"")),
        "deploy/operator.yaml keeps {old}"
    );
    assert!(read(dir, "deploy/examples/full.yaml").contains("fabric-agent:v9.8.7"));
    // The notes that were Unreleased are now the version's; Unreleased starts empty.
    let changelog = read(dir, "CHANGELOG.md");
    let unreleased = changelog.find("## Unreleased\n").expect("Unreleased");
    let section = changelog
        .find("## 9.8.7 (2031-01-02)\n")
        .expect("the version's section");
    let previous = section_of(&changelog, old).expect("the old version's section");
    assert!(
        unreleased < section && section < previous,
        "sections out of order"
    );
    assert_eq!(changelog[unreleased..section].trim(), "## Unreleased");
    let notes = |text: &str, heading: &str| -> String {
        let from = text.find(heading).expect("heading") + heading.len();
        let to = section_of(text, old).expect("the old version's section");
        text[from..to].trim().to_string()
    };
    let moved = notes(&before[5], "## Unreleased\n");
    assert!(
        moved.contains("A note of this release"),
        "Unreleased had notes: {moved}"
    );
    assert_eq!(
        notes(&changelog, "## 9.8.7 (2031-01-02)\n"),
        moved,
        "every Unreleased note moved, none lost"
    );

    // Once is enough: the same version again, or a version not a.b.c, is refused.
    for (args, why) in [
        (&["9.8.7"][..], "already 9.8.7"),
        (&["v1.0.0"], "not MAJOR.MINOR.PATCH"),
    ] {
        let again = release(dir, args);
        assert!(!again.status.success(), "{args:?} accepted");
        assert!(
            String::from_utf8_lossy(&again.stderr).contains(why),
            "{args:?}"
        );
    }
}
