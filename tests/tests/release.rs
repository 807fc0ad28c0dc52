//! What a release ships, checked before it ships. `deploy/release.sh`, the version bump, on
//! a copy of the repository (never on the repository itself): its dry run prints every
//! change and makes none; its run moves the crates, the lock file, the chart, the manifests
//! and CHANGELOG's "Unreleased" together. Its output: each image with its SBOM (which names
//! what the image holds), the chart and their checksums. And the docs of the release: the
//! field reference generated from the CRD schema, NOTES.txt's links, and what runs each
//! command of the docs.

use gpufabric_tests::tools::{Image, images};
use gpufabric_tests::workspace_root;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
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

/// What an image archive holds, read from its layers: the Debian packages (the
/// `var/lib/dpkg/status.d/NAME` files, as distroless writes them, with their version), the
/// wheels (a licence file each under `opt/gpufabric/licenses/`, their versions from the
/// image's own `opt/gpufabric/versions.env`) and the crates whose source paths the binary
/// carries (`registry/src/index.crates.io-*/NAME-VERSION/`).
#[derive(Debug, Default)]
struct Holds {
    debs: BTreeMap<String, String>,
    wheels: BTreeMap<String, String>,
    crate_dirs: BTreeSet<String>,
    /// `crate NAME VERSION SOURCE` lines of the image's `usr/share/gpufabric/packages.txt`.
    crates_listed: BTreeSet<(String, String)>,
}

fn sh(script: &str, args: &[&str]) -> Vec<u8> {
    let out = Command::new("bash")
        .args(["-o", "pipefail", "-c", script, "sh"])
        .args(args)
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "{script} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Where each member of a tar archive lies: name -> (offset of its data, size). Reads the
/// headers only (ustar, as oci.py writes the archive: names of blobs fit its 100 bytes).
fn tar_members(archive: &Path) -> BTreeMap<String, (u64, u64)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file =
        std::fs::File::open(archive).unwrap_or_else(|e| panic!("{}: {e}", archive.display()));
    let mut members = BTreeMap::new();
    let mut header = [0u8; 512];
    let mut at = 0u64;
    loop {
        file.read_exact(&mut header).expect("a tar header");
        if header.iter().all(|b| *b == 0) {
            return members;
        }
        let field = |from: usize, to: usize| {
            let raw = &header[from..to];
            let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
            String::from_utf8_lossy(&raw[..end]).trim().to_string()
        };
        let size = u64::from_str_radix(&field(124, 136), 8).expect("an octal size");
        let prefix = field(345, 500);
        let name = match prefix.is_empty() {
            true => field(0, 100),
            false => format!("{prefix}/{}", field(0, 100)),
        };
        members.insert(name.trim_start_matches("./").to_string(), (at + 512, size));
        at += 512 + size.div_ceil(512) * 512;
        file.seek(SeekFrom::Start(at)).expect("seek");
    }
}

/// Reads what `image` holds: the small layers unpacked, the large ones (the wheels'
/// libraries) listed, all at once.
fn holds(image: &Image) -> Holds {
    let archive = image.archive.to_str().expect("utf-8 path");
    let members = tar_members(&image.archive);
    let blob = |digest: &str| {
        let name = format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"));
        *members
            .get(&name)
            .unwrap_or_else(|| panic!("{archive} has no {name}"))
    };
    // A blob's bytes, read from where they lie in the archive, into a shell command.
    let from_blob = |(offset, size): (u64, u64), then: &str, args: &[&str]| {
        let script = format!(
            r#"dd if="$1" bs=1M iflag=skip_bytes,count_bytes skip="$2" count="$3" status=none | {then}"#
        );
        let (offset, size) = (offset.to_string(), size.to_string());
        sh(&script, &[&[archive, &offset, &size][..], args].concat())
    };
    let index: Value =
        serde_json::from_slice(&from_blob(members["index.json"], "cat", &[])).expect("index");
    let manifest = index["manifests"][0]["digest"]
        .as_str()
        .expect("a manifest");
    assert_eq!(manifest, image.digest, "images.env names another digest");
    let manifest: Value =
        serde_json::from_slice(&from_blob(blob(manifest), "cat", &[])).expect("manifest");
    let layers: Vec<(u64, u64)> = manifest["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .map(|l| blob(l["digest"].as_str().expect("digest")))
        .collect();
    let tmp = tempfile::tempdir().expect("temp dir");
    let root = tmp.path().to_str().expect("utf-8 path").to_string();
    let listed: Vec<String> = std::thread::scope(|scope| {
        let jobs: Vec<_> = layers
            .iter()
            .enumerate()
            .map(|(i, &(offset, size))| {
                let root = format!("{root}/{i}");
                let from_blob = &from_blob;
                scope.spawn(move || {
                    // The small layers unpacked (their files are read below), the wheels'
                    // libraries listed.
                    if size < 64 << 20 {
                        std::fs::create_dir_all(&root).expect("layer dir");
                        from_blob(
                            (offset, size),
                            r#"tar -xz -C "$4" && (cd "$4" && find . -mindepth 1 | sed 's|^\./||')"#,
                            &[&root],
                        )
                    } else {
                        from_blob((offset, size), "tar -tz", &[])
                    }
                })
            })
            .collect();
        jobs.into_iter()
            .flat_map(|j| {
                String::from_utf8(j.join().expect("a layer read"))
                    .expect("utf-8 names")
                    .lines()
                    .map(|l| l.trim_end_matches('/').to_string())
                    .collect::<Vec<_>>()
            })
            .collect()
    });
    // A file as the image shows it: the topmost layer that has it.
    let file = |path: &str| -> Option<Vec<u8>> {
        (0..layers.len())
            .rev()
            .find_map(|i| std::fs::read(format!("{root}/{i}/{path}")).ok())
    };
    let mut holds = Holds::default();
    for name in &listed {
        if let Some(pkg) = name.strip_prefix("var/lib/dpkg/status.d/") {
            let status = String::from_utf8(file(name).expect("status file")).expect("utf-8");
            let field = |key: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{key}: ")))
                    .unwrap_or_else(|| panic!("{name} has no {key}"))
                    .to_string()
            };
            assert_eq!(field("Package"), pkg, "{name}");
            holds.debs.insert(pkg.to_string(), field("Version"));
        }
        if let Some(wheel) = name
            .strip_prefix("opt/gpufabric/licenses/")
            .and_then(|n| n.strip_suffix(".txt"))
        {
            holds.wheels.insert(wheel.to_string(), String::new());
        }
    }
    if !holds.wheels.is_empty() {
        let env = String::from_utf8(file("opt/gpufabric/versions.env").expect("versions.env"))
            .expect("utf-8");
        let vars: BTreeMap<&str, &str> = env
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .collect();
        for (key, wheel) in vars.iter().filter(|(k, _)| k.ends_with("_WHEEL")) {
            let version = vars[format!("{}_VERSION", key.trim_end_matches("_WHEEL")).as_str()];
            if let Some(v) = holds.wheels.get_mut(*wheel) {
                *v = version.to_string();
            }
        }
    }
    let binary = listed
        .iter()
        .find(|n| n.starts_with("usr/local/bin/fabric-"))
        .expect("the image's binary");
    let binary = file(binary).expect("binary");
    // Searched with std's string search (compiled optimised, unlike this test).
    let binary = String::from_utf8_lossy(&binary);
    for (at, marker) in binary.match_indices("registry/src/index.crates.io-") {
        let rest = &binary[at + marker.len()..];
        let Some((_, after)) = rest.split_once('/') else {
            continue;
        };
        let dir = after
            .split(|c: char| c == '/' || !c.is_ascii_graphic())
            .next()
            .unwrap_or("");
        holds.crate_dirs.insert(dir.to_string());
    }
    let listed = String::from_utf8(file("usr/share/gpufabric/packages.txt").expect("packages.txt"))
        .expect("utf-8");
    for line in listed.lines() {
        if let ["crate", name, version, ..] = line.split_whitespace().collect::<Vec<_>>()[..] {
            holds
                .crates_listed
                .insert((name.to_string(), version.to_string()));
        }
    }
    holds
}

/// What the SBOM gets wrong about the image: each package it holds that the SBOM does not
/// name (or names with another version), each the SBOM names that it does not hold.
fn sbom_errors(sbom: &Value, image: &Image, holds: &Holds) -> Vec<String> {
    let mut errors = Vec::new();
    if sbom["spdxVersion"] != "SPDX-2.3" || sbom["dataLicense"] != "CC0-1.0" {
        errors.push("not an SPDX 2.3 document".to_string());
    }
    let packages = sbom["packages"].as_array().cloned().unwrap_or_default();
    let described = sbom["documentDescribes"][0].as_str().unwrap_or("");
    let Some(top) = packages.iter().find(|p| p["SPDXID"] == described) else {
        return vec!["the document describes no package".into()];
    };
    if top["name"] != image.reference.as_str()
        || top["checksums"][0]["checksumValue"] != image.digest.trim_start_matches("sha256:")
    {
        errors.push(format!(
            "it describes {} {}, not {} {}",
            top["name"], top["checksums"][0]["checksumValue"], image.reference, image.digest
        ));
    }
    // Each package named, by its purl's type: deb, pypi or cargo.
    let mut named: BTreeMap<&str, BTreeSet<(String, String)>> = BTreeMap::new();
    for p in packages.iter().filter(|p| p["SPDXID"] != described) {
        let purl = p["externalRefs"][0]["referenceLocator"]
            .as_str()
            .unwrap_or("");
        let kind = purl.strip_prefix("pkg:").and_then(|p| p.split('/').next());
        let (Some(kind), Some(name), Some(version)) =
            (kind, p["name"].as_str(), p["versionInfo"].as_str())
        else {
            errors.push(format!("a package without purl, name or version: {p}"));
            continue;
        };
        named
            .entry(kind)
            .or_default()
            .insert((name.to_string(), version.to_string()));
        let contained = sbom["relationships"].as_array().is_some_and(|r| {
            r.iter().any(|r| {
                r["spdxElementId"] == described
                    && r["relationshipType"] == "CONTAINS"
                    && r["relatedSpdxElement"] == p["SPDXID"]
            })
        });
        if !contained {
            errors.push(format!("{name} {version}: not CONTAINED by the image"));
        }
    }
    let compare = |errors: &mut Vec<String>, kind: &str, held: BTreeSet<(String, String)>| {
        let said = named.get(kind).cloned().unwrap_or_default();
        for (name, version) in held.difference(&said) {
            errors.push(format!(
                "the image holds {kind} {name} {version}; the SBOM does not say so"
            ));
        }
        for (name, version) in said.difference(&held) {
            errors.push(format!(
                "the SBOM names {kind} {name} {version}; the image does not hold it"
            ));
        }
    };
    let pairs = |m: &BTreeMap<String, String>| -> BTreeSet<(String, String)> {
        m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    compare(&mut errors, "deb", pairs(&holds.debs));
    compare(&mut errors, "pypi", pairs(&holds.wheels));
    compare(&mut errors, "cargo", holds.crates_listed.clone());
    let crates: BTreeSet<String> = named
        .get("cargo")
        .into_iter()
        .flatten()
        .map(|(n, v)| format!("{n}-{v}"))
        .collect();
    for dir in holds.crate_dirs.difference(&crates) {
        errors.push(format!(
            "the binary was compiled from crate {dir}; the SBOM does not name it"
        ));
    }
    errors
}

#[test]
fn each_images_sbom_names_every_package_the_image_holds_and_no_other() {
    let images = images();
    for image in [images.operator, images.agent] {
        let path = image.archive.with_file_name(
            image
                .archive
                .file_name()
                .and_then(|n| n.to_str())
                .expect("archive name")
                .replace(".oci.tar", ".spdx.json"),
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}: deploy/images/build.sh writes it beside the image",
                path.display()
            )
        });
        let mut sbom: Value = serde_json::from_str(&text).expect("SPDX JSON");
        let holds = holds(&image);
        assert!(
            !holds.debs.is_empty()
                && !holds.crate_dirs.is_empty()
                && !holds.crates_listed.is_empty(),
            "{}: read nothing from the image: {holds:?}",
            image.reference
        );
        if image.reference.contains("fabric-agent") {
            assert_eq!(
                holds.wheels.keys().collect::<Vec<_>>(),
                ["nvidia-cublas", "nvidia-nccl-cu13"],
                "the agent's wheels"
            );
            assert!(holds.debs.contains_key("libibverbs1"), "{holds:?}");
        }
        let errors = sbom_errors(&sbom, &image, &holds);
        assert!(
            errors.is_empty(),
            "{}:\n{}",
            path.display(),
            errors.join("\n")
        );

        // An SBOM that leaves out a package the image holds, or names one it does not, is
        // caught.
        let packages = sbom["packages"].as_array_mut().expect("packages");
        let at = packages
            .iter()
            .position(|p| p["name"] == "libc6")
            .expect("libc6 named");
        packages[at]["versionInfo"] = "2.99-1".into();
        let errors = sbom_errors(&sbom, &image, &holds);
        assert!(
            errors.iter().any(|e| e.contains("holds deb libc6 "))
                && errors.iter().any(|e| e.contains("names deb libc6 2.99-1")),
            "{errors:?}"
        );
    }
}

/// Fields whose type is Kubernetes' own (a container's env, tolerations, resources, pull
/// secrets): named, not described again field by field.
const KUBERNETES_TYPES: [(&str, &str); 4] = [
    (
        "spec.agent.env",
        "[EnvVar](https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#environment-variables)",
    ),
    (
        "spec.agent.tolerations",
        "[Toleration](https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#scheduling)",
    ),
    (
        "spec.agent.resources",
        "[ResourceRequirements](https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#resources)",
    ),
    (
        "spec.agent.imagePullSecrets",
        "[LocalObjectReference](https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/local-object-reference/)",
    ),
];

/// A schema's type as a reader says it: `integer (uint32, 1 to 100)`, `string: one of A, B`.
fn type_of(node: &Value) -> String {
    let number = |v: &Value| {
        v.as_f64()
            .map(|f| {
                if f.fract() == 0.0 {
                    format!("{}", f as i64)
                } else {
                    f.to_string()
                }
            })
            .unwrap_or_default()
    };
    let mut text = if node["x-kubernetes-int-or-string"] == true {
        "integer or string".to_string()
    } else if node["type"] == "array" {
        format!("list of {}", type_of(&node["items"]))
    } else if node["type"] == "object" && node["additionalProperties"].is_object() {
        format!(
            "map of string to {}",
            type_of(&node["additionalProperties"])
        )
    } else {
        node["type"].as_str().unwrap_or("any").to_string()
    };
    let mut notes = Vec::new();
    match (node.get("minimum"), node.get("maximum")) {
        (Some(lo), Some(hi)) => notes.push(format!("{} to {}", number(lo), number(hi))),
        (Some(lo), None) => notes.push(format!("at least {}", number(lo))),
        (None, Some(hi)) => notes.push(format!("at most {}", number(hi))),
        (None, None) => {}
    }
    for (key, say) in [("minItems", "at least"), ("maxItems", "at most")] {
        if let Some(n) = node.get(key) {
            notes.push(format!("{say} {} items", number(n)));
        }
    }
    if let Some(n) = node.get("maxLength") {
        notes.push(format!("at most {} characters", number(n)));
    }
    if !notes.is_empty() {
        text = format!("{text} ({})", notes.join(", "));
    }
    if let Some(values) = node["enum"].as_array() {
        let values: Vec<String> = values
            .iter()
            .map(|v| format!("`{}`", v.as_str().unwrap_or("")))
            .collect();
        text = format!("{text}: one of {}", values.join(", "));
    }
    text
}

/// One line of a table cell: newlines joined, pipes escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// The rows of `node`'s fields, depth first in the schema's (alphabetical) order.
fn field_rows(path: &str, node: &Value, parent_default: Option<&Value>, rows: &mut Vec<String>) {
    let (props, prefix) = if node["type"] == "array" && node["items"]["properties"].is_object() {
        (&node["items"]["properties"], format!("{path}[]"))
    } else {
        (&node["properties"], path.to_string())
    };
    let Some(props) = props.as_object() else {
        return;
    };
    let required: BTreeSet<&str> = node["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str())
        .collect();
    for (name, field) in props {
        let path = format!("{prefix}.{name}");
        let default = field
            .get("default")
            .or_else(|| parent_default.and_then(|d| d.get(name)));
        let kubernetes = KUBERNETES_TYPES.iter().find(|(p, _)| *p == path);
        let mut description = cell(field["description"].as_str().unwrap_or(""));
        if let Some((_, link)) = kubernetes {
            description = format!("{description} Kubernetes' {link}.");
        }
        for rule in field["x-kubernetes-validations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(message) = rule["message"].as_str() {
                description = format!(
                    "{description} Refused unless: {}.",
                    cell(message).trim_end_matches('.')
                );
            }
        }
        rows.push(format!(
            "| `{path}`{} | {} | {} | {} |",
            if required.contains(name.as_str()) {
                " (required)"
            } else {
                ""
            },
            cell(&type_of(field)),
            default
                .map(|d| format!("`{}`", cell(&d.to_string())))
                .unwrap_or_default(),
            description
        ));
        if kubernetes.is_none() {
            field_rows(&path, field, default, rows);
        }
    }
}

/// docs/reference/fabrictest.md, from the FabricTest CRD's schema.
fn field_reference() -> String {
    let (file, crd) = gpufabric_api::crds()
        .into_iter()
        .find(|(file, _)| *file == "fabrictests.yaml")
        .expect("the FabricTest CRD");
    let crd = serde_json::to_value(&crd).expect("CRD as JSON");
    let version = &crd["spec"]["versions"][0];
    let schema = &version["schema"]["openAPIV3Schema"];
    let mut text = format!(
        "# FabricTest field reference\n\n\
         <!-- Generated from the CRD schema (crds/{file}) by tests/tests/release.rs; do not edit.\n     \
         Regenerate: GPUFABRIC_WRITE_DOCS=1 cargo test -p gpufabric-tests --test release field_reference -->\n\n\
         `{}/{}`, kind `{}`, cluster-scoped (short name `{}`). {}\n\n\
         Every field, its type and bounds, its default and what it means, as the API server \
         checks them (`kubectl explain fabrictest.spec.FIELD` says the same). A guide to the \
         fields, with examples: [the FabricTest guide](../fabrictest.md).\n",
        crd["spec"]["group"].as_str().unwrap_or(""),
        version["name"].as_str().unwrap_or(""),
        crd["spec"]["names"]["kind"].as_str().unwrap_or(""),
        crd["spec"]["names"]["shortNames"][0].as_str().unwrap_or(""),
        cell(schema["description"].as_str().unwrap_or("")),
    );
    for part in ["spec", "status"] {
        let node = &schema["properties"][part];
        let mut rows = Vec::new();
        field_rows(part, node, node.get("default"), &mut rows);
        text.push_str(&format!(
            "\n## {part}\n\n{}\n\n| Field | Type | Default | Description |\n|---|---|---|---|\n{}\n",
            cell(node["description"].as_str().unwrap_or("")),
            rows.join("\n")
        ));
    }
    text
}

#[test]
fn the_field_reference_is_the_one_the_crd_schema_gives() {
    let path = workspace_root().join("docs/reference/fabrictest.md");
    let generated = field_reference();
    if std::env::var_os("GPUFABRIC_WRITE_DOCS").is_some() {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("docs/reference");
        std::fs::write(&path, &generated).expect("written");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/reference/fabrictest.md differs from the CRD schema: regenerate it with \
         `GPUFABRIC_WRITE_DOCS=1 cargo test -p gpufabric-tests --test release field_reference` \
         and commit the result"
    );
    // Every field of the spec is in it, by its path.
    for field in [
        "spec.schedule",
        "spec.agent.podAnnotations",
        "spec.quarantine.maxQuarantined",
        "spec.suite.ncclSweep.collectives",
    ] {
        assert!(committed.contains(&format!("| `{field}` ")), "{field}");
    }
}

/// GitHub anchors of a Markdown file's headings: lower case, spaces as `-`, other
/// punctuation dropped.
fn anchors(markdown: &str) -> BTreeSet<String> {
    markdown
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|h| {
            h.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

#[test]
fn the_install_notes_link_files_of_the_release_tag_that_exist() {
    let root = workspace_root();
    let notes = std::fs::read_to_string(root.join("charts/gpufabric/templates/NOTES.txt"))
        .expect("NOTES.txt");
    // The template's version, one word here: v{{ .Chart.AppVersion }} is the release's tag.
    let notes = notes.replace("{{ .Chart.AppVersion }}", "APP_VERSION");
    let tag = "vAPP_VERSION";
    let links: Vec<&str> = notes
        .split_whitespace()
        .map(|w| w.trim_matches(|c| "().,'\"".contains(c)))
        .filter(|w| w.starts_with("https://"))
        .collect();
    assert!(links.len() >= 2, "{links:?}");
    for link in links {
        let rest = [
            "https://raw.githubusercontent.com/gpufabric/gpufabric/",
            "https://github.com/gpufabric/gpufabric/blob/",
            "https://github.com/gpufabric/gpufabric/tree/",
        ]
        .iter()
        .find_map(|p| link.strip_prefix(p))
        .unwrap_or_else(|| panic!("{link}: not a file of the repository"));
        let path = rest
            .strip_prefix(&format!("{tag}/"))
            .unwrap_or_else(|| panic!("{link}: not at the release's tag {tag}"));
        let (path, anchor) = path.split_once('#').unwrap_or((path, ""));
        let file = root.join(path);
        assert!(file.exists(), "{link}: {path} is not in the repository");
        if !anchor.is_empty() {
            let text = std::fs::read_to_string(&file).expect("linked file");
            assert!(
                anchors(&text).contains(anchor),
                "{link}: {path} has no heading #{anchor}"
            );
        }
    }
}

/// The `sh` blocks of the README and of docs/ (runbooks included): each block's page and
/// its commands, one a line (comments dropped, continued lines joined).
fn sh_blocks() -> Vec<(String, Vec<String>)> {
    let root = workspace_root();
    let mut pages = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("docs/").flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    let mut blocks = Vec::new();
    for page in pages {
        let name = page
            .strip_prefix(&root)
            .expect("in the repository")
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(&page).expect("page");
        let mut block: Option<Vec<String>> = None;
        let mut line = String::new();
        for l in text.lines() {
            if let Some(lang) = l.strip_prefix("```") {
                match block.take() {
                    Some(commands) => blocks.push((name.clone(), commands)),
                    None if lang.trim() == "sh" => block = Some(Vec::new()),
                    None => {}
                }
                continue;
            }
            let Some(commands) = block.as_mut() else {
                continue;
            };
            let l = l.trim();
            if line.is_empty() && (l.is_empty() || l.starts_with('#')) {
                continue;
            }
            let l = match l.find("  #") {
                Some(at) => l[..at].trim_end(),
                None => l,
            };
            line.push_str(l.trim_end_matches('\\').trim_end());
            if l.ends_with('\\') {
                line.push(' ');
                continue;
            }
            commands.push(std::mem::take(&mut line));
        }
    }
    blocks
}

/// The rows of docs/README.md's table of which commands run: page, first command, what runs
/// it.
fn command_ledger() -> Vec<(String, String, String)> {
    let text =
        std::fs::read_to_string(workspace_root().join("docs/README.md")).expect("docs/README.md");
    let (_, table) = text
        .split_once("| page | block starting with | what runs it |")
        .expect("docs/README.md has the table of which commands run");
    table
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|row| {
            let cells: Vec<String> = row
                .replace("\\|", "\u{1}")
                .split('|')
                .map(|c| c.trim().replace('\u{1}', "|"))
                .collect();
            assert_eq!(cells.len(), 5, "a row of 3 cells: {row}");
            let first = cells[2]
                .strip_prefix('`')
                .and_then(|c| c.strip_suffix('`'))
                .unwrap_or_else(|| panic!("the block's first command in backquotes: {row}"))
                .to_string();
            (cells[1].clone(), first, cells[3].clone())
        })
        .collect()
}

/// The commands of the docs that need no cluster, GPU or registry, as written; run by the
/// test below from the repository's root with the built binaries, helm and kubectl on PATH.
const RUN_AS_WRITTEN: [(&str, &str); 5] = [
    (
        "docs/fabrictest.md",
        "helm template gpufabric charts/gpufabric -n gpufabric --set webhook.certManager.enabled=true",
    ),
    ("docs/agent.md", "fabric-agent node-check --help"),
    ("docs/kubectl.md", "kubectl plugin list"),
    (
        "docs/kubectl.md",
        "source <(kubectl-gpufabric completion bash)",
    ),
    ("docs/kubectl.md", "kubectl gpufabric version"),
];

#[test]
fn every_sh_block_of_the_docs_says_what_runs_it_and_ci_runs_what_it_claims() {
    let blocks = sh_blocks();
    let ledger = command_ledger();
    let ci = std::fs::read_to_string(workspace_root().join(".ci/run")).expect(".ci/run");
    let mut wrong = Vec::new();
    for (page, commands) in &blocks {
        let Some(first) = commands.first() else {
            continue;
        };
        match ledger
            .iter()
            .find(|(p, f, _)| p == page && first.starts_with(f.as_str()))
        {
            None => wrong.push(format!(
                "{page}: the block starting with `{first}` is not in docs/README.md's table"
            )),
            Some((_, _, runs)) if runs.starts_with("`.ci/run`, as written") => {
                for c in commands
                    .iter()
                    .filter(|c| !ci.lines().any(|l| l.trim() == c.as_str()))
                {
                    wrong.push(format!(
                        "{page}: `{c}` is said to run in .ci/run, which does not run it as written"
                    ));
                }
            }
            Some(_) => {}
        }
    }
    for (page, first, _) in &ledger {
        if !blocks
            .iter()
            .any(|(p, c)| p == page && c.first().is_some_and(|c| c.starts_with(first.as_str())))
        {
            wrong.push(format!(
                "docs/README.md names a block of {page} starting with `{first}`, which is not there"
            ));
        }
    }
    for (page, command) in RUN_AS_WRITTEN {
        if !blocks
            .iter()
            .any(|(p, c)| p == page && c.iter().any(|c| c == command))
        {
            wrong.push(format!("{page} no longer has `{command}`"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_docs_commands_that_need_no_cluster_run_as_written() {
    let root = workspace_root();
    let cluster_bin =
        gpufabric_tests::cluster::bin_dir().expect("the control plane's binaries (kubectl)");
    // The two binaries alone, as a user installs them: the target dir also holds cargo's
    // `kubectl-gpufabric.d`, which `kubectl plugin list` would take for a plugin.
    let bin = tempfile::tempdir().expect("a bin dir");
    for name in ["fabric-agent", "kubectl-gpufabric"] {
        std::os::unix::fs::symlink(
            gpufabric_tests::kubelet::default_agent_bin_dir().join(name),
            bin.path().join(name),
        )
        .expect("linked");
    }
    let path = std::env::join_paths(
        [
            bin.path().to_path_buf(),
            gpufabric_tests::tools::bin_dir(),
            cluster_bin,
        ]
        .into_iter()
        .chain(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        )),
    )
    .expect("PATH");
    let home = tempfile::tempdir().expect("a HOME");
    for (page, command) in RUN_AS_WRITTEN {
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", command])
            .current_dir(&root)
            .env("PATH", &path)
            .env("HOME", home.path())
            .env_remove("KUBECONFIG")
            .output()
            .expect("bash runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{page}: `{command}` failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        // Each says what its page says it does.
        let shows = match command {
            c if c.starts_with("helm template") => "kind: Certificate",
            "fabric-agent node-check --help" => "--verdict",
            "kubectl plugin list" => "kubectl-gpufabric",
            "kubectl gpufabric version" => env!("CARGO_PKG_VERSION"),
            _ => "",
        };
        assert!(
            stdout.contains(shows),
            "{page}: `{command}` does not show {shows:?}:\n{stdout}"
        );
    }
}

#[test]
fn the_release_output_holds_each_image_with_its_sbom_the_chart_and_their_checksums() {
    let version = env!("CARGO_PKG_VERSION");
    let images = images();
    let from = images
        .operator
        .archive
        .parent()
        .expect("the images' directory");
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let helm = gpufabric_tests::tools::bin_dir().join("helm");
    let release = |args: &[&str]| {
        Command::new("bash")
            .arg(workspace_root().join("deploy/release.sh"))
            .args(args)
            .env("HELM", &helm)
            .current_dir(workspace_root())
            .output()
            .expect("deploy/release.sh runs")
    };
    let out = tmp.path().join("release");
    let out_str = out.to_str().expect("utf-8 path");
    let from_str = from.to_str().expect("utf-8 path");

    let dry = release(&[
        "--artifacts",
        out_str,
        "--images",
        from_str,
        "--push",
        "registry.example.com/infra",
        "--dry-run",
    ]);
    let said = String::from_utf8_lossy(&dry.stderr);
    assert!(dry.status.success(), "{said}");
    assert!(
        said.contains("fabric-agent.spdx.json") && !out.exists(),
        "{said}"
    );
    // What it would push, where users pull it from; tests/tests/installed.rs pushes for real.
    assert!(
        said.contains(&format!(
            "would push registry.example.com/infra/fabric-operator:v{version} \
             registry.example.com/infra/fabric-agent:v{version} \
             oci://registry.example.com/infra/charts/gpufabric:{version}"
        )),
        "{said}"
    );

    let run = release(&["--artifacts", out_str, "--images", from_str]);
    let said = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{said}");
    let mut files: Vec<String> = std::fs::read_dir(&out)
        .expect("the release's files")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let chart = format!("gpufabric-{version}.tgz");
    assert_eq!(
        files,
        [
            "SHA256SUMS",
            "fabric-agent.oci.tar",
            "fabric-agent.spdx.json",
            "fabric-operator.oci.tar",
            "fabric-operator.spdx.json",
            chart.as_str(),
            "images.env",
        ]
    );
    for name in ["fabric-operator.spdx.json", "fabric-agent.spdx.json"] {
        assert_eq!(
            read(&out, name),
            read(from, name),
            "{name} is the one beside the image"
        );
    }
    let sums = Command::new("sha256sum")
        .args(["--check", "--strict", "SHA256SUMS"])
        .current_dir(&out)
        .output()
        .expect("sha256sum runs");
    let checked = String::from_utf8_lossy(&sums.stdout);
    assert!(sums.status.success(), "{checked}");
    assert_eq!(
        checked.lines().count(),
        6,
        "every file summed once: {checked}"
    );
    let env = read(&out, "images.env");
    assert!(
        env.contains(&format!("AGENT_SBOM={out_str}/fabric-agent.spdx.json"))
            && env.contains(&format!("OPERATOR_DIGEST={}", images.operator.digest)),
        "{env}"
    );

    // An image without its SBOM is not released.
    let bare = tmp.path().join("bare");
    std::fs::create_dir(&bare).expect("dir");
    std::fs::copy(from.join("images.env"), bare.join("images.env")).expect("images.env");
    for name in ["fabric-operator.oci.tar", "fabric-agent.oci.tar"] {
        std::fs::hard_link(from.join(name), bare.join(name))
            .or_else(|_| std::os::unix::fs::symlink(from.join(name), bare.join(name)))
            .expect("linked");
    }
    let refused = release(&[
        "--artifacts",
        tmp.path().join("again").to_str().expect("utf-8"),
        "--images",
        bare.to_str().expect("utf-8"),
    ]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "released without an SBOM: {said}"
    );
    assert!(said.contains("spdx.json is missing"), "{said}");
}
