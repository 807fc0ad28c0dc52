//! The demo of README's "Two commands", run as a user runs it (`fabric-demo --once`, with
//! what `tests/run.sh` built): it must end well and show what README says it shows, and the
//! HTML report it writes where it says by default must render in a browser (Debian's headless
//! Chromium) with each injected fault marked where it belongs. And `cargo run -p
//! gpufabric-tests --bin fabric-demo` must resolve its dependencies as the workspace build
//! does, so that a second demo compiles nothing.
//!
//! Build the binaries first: `cargo build --bins`, then
//! `cargo test -p gpufabric-tests --test demo`. Needs `chromium` on PATH
//! (`apt-get install chromium fonts-dejavu-core`; .ci/run installs it).

use gpufabric_tests::cluster::ENV_BIN;
use gpufabric_tests::workspace_root;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The lines of `out` that start with `prefix` (table rows start with the node name).
fn rows<'a>(out: &'a str, prefix: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.starts_with(prefix)).collect()
}

/// Where the demo program at `exe` writes its report when not told: `fabric-demo-report/`
/// in the target dir, as its `--help` says.
fn default_report(exe: &Path) -> PathBuf {
    let target = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/debug/fabric-demo");
    target.join("fabric-demo-report").join("report.html")
}

#[test]
fn the_demo_refuses_bad_input_finds_every_injected_fault_and_cordons_within_the_budget() {
    // Before the demo's minutes: a machine without a browser fails at once, saying why.
    let chromium = browser::chromium();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("demo-report");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a dir for the screenshot");
    // No --report: the default path, beside target/debug/fabric-demo (the program itself).
    let exe = Path::new(env!("CARGO_BIN_EXE_fabric-demo"));
    let page = default_report(exe);
    let _ = std::fs::remove_file(&page);
    let mut cmd = Command::new(exe);
    cmd.args(["--once", "--no-build", "--timeout", "300"]);
    if let Ok(dir) = std::env::var(ENV_BIN) {
        cmd.env(ENV_BIN, dir);
    }
    let out = cmd.output().expect("fabric-demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let shown = |needle: &str| {
        assert!(
            stdout.contains(needle),
            "missing {needle:?} in:\n{stdout}\n{stderr}"
        )
    };

    // The admission webhook the operator serves refuses a FabricTest that cannot work, at
    // `kubectl apply`.
    shown("refused: Error from server");
    shown("admission webhook \"fabrictests.gpufabric.io\" denied the request");
    shown("schedule \"0 2 31 2 *\" never fires");

    // The four faults, each where it belongs: two node checks, a node found against its
    // partners, a path that blames neither node.
    shown("Critical  h200-05  gpu 6");
    shown("Critical  h100-03  gpu 2<->5");
    shown("Critical  h200-02  node         nodePairBusBw");
    shown("Info      h100-05  <-> h100-06  nodePairBusBw");
    shown("round 4 retests 1 suspect(s)");
    shown("4 (retest)  h200-02 <-> ");
    // The multi-node probe over four nodes that passed both, at 1, 2 and 4 nodes.
    shown(": multi-node DDP probe over ");
    assert_eq!(rows(&stdout, "4      32 ").len(), 1, "{stdout}");

    // One node cordoned (the budget), the other two failures held back, the busy node
    // skipped and never blamed.
    shown("nightly holds 1 node(s) in quarantine: h200-02");
    let held = rows(&stdout, "h100-03  would quarantine");
    assert_eq!(held.len(), 1, "{stdout}");
    assert!(held[0].contains("budget"), "{}", held[0]);
    shown("h200-07  nightly-manual-");
    shown("skipped: Busy");
    // A node's life: the busy node, free and gated, passes and its gate opens; the node
    // nightly cordoned is repaired, and one targeted run releases it.
    shown("h200-07: gated false, cordoned false; ValidationPassed: passed run nightly-t");
    shown("h200-02: gated false, cordoned false; Released: released by FabricTest nightly");
    shown("RepairPassed: passed its repair test in run nightly-t");
    for healthy in ["h100-00", "h100-05", "h100-06", "h200-07"] {
        assert!(
            rows(&stdout, &format!("{healthy}  true")).is_empty(),
            "{healthy} cordoned:\n{stdout}"
        );
    }

    // The report of the run, written before the status, as the demo says.
    shown(&format!("-o {}", page.display()));
    let report_at = stdout
        .find("kubectl gpufabric report ")
        .expect("the report step");
    let status_at = stdout
        .rfind("==> kubectl gpufabric status")
        .expect("the status step");
    assert!(report_at < status_at, "the report comes before the status");
    browser::check_report(&chromium, &page, &dir.join("report.png"));
}

/// Each package of `cargo tree ARGS -e no-dev` (name and version) with its feature sets (one
/// per build: a package a build script or proc macro also uses may have two).
fn features(args: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(workspace_root())
        .args(["tree", "--locked", "--offline", "-q", "-e", "no-dev"])
        .args(["--prefix", "none", "--format", "{p}|{f}"])
        .args(args)
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((pkg, feats)) = line.split_once('|') else {
            continue;
        };
        // "name v1.2.3 (path or (*) or (proc-macro))": name and version.
        let pkg: Vec<&str> = pkg.split_whitespace().take(2).collect();
        let feats = feats.split(" (").next().unwrap_or(feats).trim();
        map.entry(pkg.join(" "))
            .or_default()
            .insert(feats.to_string());
    }
    map
}

#[test]
fn the_demo_builds_its_dependencies_with_the_features_the_workspace_build_gives_them() {
    // The demo is `cargo run -p gpufabric-tests --bin fabric-demo`, and it builds the agent,
    // the operator and the plugin with `cargo build --workspace --bins` (as tests/run.sh
    // does). A dependency whose features differ between the two is compiled twice, and so is
    // everything above it.
    let demo = features(&["-p", "gpufabric-tests"]);
    let workspace = features(&["--workspace"]);
    assert!(
        demo.len() > 100,
        "{} packages: cargo tree said little",
        demo.len()
    );
    let differ: Vec<String> = demo
        .iter()
        .filter(|(pkg, f)| workspace.get(*pkg) != Some(f))
        .map(|(pkg, f)| {
            format!(
                "{pkg}: {f:?} for the demo, {:?} in the workspace",
                workspace.get(pkg)
            )
        })
        .collect();
    assert!(
        differ.is_empty(),
        "these dependencies would be compiled twice, once for fabric-demo and once for the \
         programs it builds; give gpufabric-tests (tests/Cargo.toml) a dependency that enables \
         the same features:\n{}",
        differ.join("\n")
    );
}

/// The report in Debian's headless Chromium: it loads and renders (exit 0, every section in
/// the DOM it built, no load or parse error said), its screenshot is a picture and not a
/// blank page, and each of the demo's faults is marked where it belongs.
mod browser {
    use std::io::Read;
    use std::path::{Path, PathBuf};
    use std::process::{Command, Output, Stdio};
    use std::time::{Duration, Instant};

    /// Width the page is rendered at; the screenshot is docs/report.png's.
    pub const WIDTH: u32 = 1200;
    /// Height of the screenshot: the fleet and the first failing node (docs/report.png).
    pub const HEIGHT: u32 = 1800;

    /// Chromium on PATH, or a failure that says how to install it.
    pub fn chromium() -> PathBuf {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .flat_map(|d| ["chromium", "chromium-browser"].map(|n| d.join(n)))
            .find(|p| p.is_file())
            .unwrap_or_else(|| {
                panic!(
                    "chromium not found on PATH: the demo's HTML report is checked in headless \
                     Chromium. Install it: apt-get install chromium fonts-dejavu-core \
                     (.ci/run installs them)"
                )
            })
    }

    /// Runs `cmd`, killing it after `limit`.
    fn run(mut cmd: Command, limit: Duration) -> Output {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("chromium starts");
        let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
        let reader = std::thread::spawn(move || {
            let mut o = Vec::new();
            if let Some(s) = out.as_mut() {
                let _ = s.read_to_end(&mut o);
            }
            o
        });
        let err_reader = std::thread::spawn(move || {
            let mut e = Vec::new();
            if let Some(s) = err.as_mut() {
                let _ = s.read_to_end(&mut e);
            }
            e
        });
        let end = Instant::now() + limit;
        let status = loop {
            if let Some(status) = child.try_wait().expect("waiting for chromium") {
                break status;
            }
            if Instant::now() > end {
                let _ = child.kill();
                let _ = child.wait();
                panic!("chromium did not finish within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        Output {
            status,
            stdout: reader.join().unwrap_or_default(),
            stderr: err_reader.join().unwrap_or_default(),
        }
    }

    fn chromium_cmd(chromium: &Path, profile: &Path) -> Command {
        let mut cmd = Command::new(chromium);
        // --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()));
        cmd
    }

    /// What Chromium says on stderr when a page or a part of it did not load or parse
    /// (its other lines, D-Bus and the like, say nothing about the page).
    fn load_errors(stderr: &str) -> Vec<&str> {
        stderr
            .lines()
            .filter(|l| {
                [
                    "net::ERR_",
                    "Failed to load",
                    "Not allowed to load",
                    "Uncaught",
                    "SyntaxError",
                    "Refused to",
                ]
                .iter()
                .any(|e| l.contains(e))
            })
            .collect()
    }

    /// The opening tags of `html` that contain `needle`.
    fn tags<'a>(html: &'a str, needle: &str) -> Vec<&'a str> {
        html.match_indices(needle)
            .filter_map(|(i, _)| {
                let start = html[..i].rfind('<')?;
                let end = i + html[i..].find('>')?;
                Some(&html[start..=end])
            })
            .collect()
    }

    /// `html` from the element that starts with `open` to the first `close` after it.
    fn part<'a>(html: &'a str, open: &str, close: &str) -> &'a str {
        let at = html
            .find(open)
            .unwrap_or_else(|| panic!("{open} not in the page"));
        let rest = &html[at..];
        &rest[..rest.find(close).unwrap_or(rest.len())]
    }

    pub fn check_report(chromium: &Path, page: &Path, png: &Path) {
        assert!(
            page.is_file(),
            "the demo wrote no report at {}",
            page.display()
        );
        let url = format!("file://{}", page.display());
        let profile = png.with_extension("profile");
        let mut shot = chromium_cmd(chromium, &profile);
        shot.arg(format!("--screenshot={}", png.display()))
            .arg(format!("--window-size={WIDTH},{HEIGHT}"))
            .arg(&url);
        let out = run(shot, Duration::from_secs(120));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "chromium --screenshot: {}\n{err}",
            out.status
        );
        assert!(load_errors(&err).is_empty(), "{:?}", load_errors(&err));
        check_png(png);
        println!("screenshot of the report: {}", png.display());

        let mut dump = chromium_cmd(chromium, &profile);
        dump.arg("--dump-dom").arg(&url);
        let out = run(dump, Duration::from_secs(120));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "chromium --dump-dom: {}\n{err}",
            out.status
        );
        assert!(load_errors(&err).is_empty(), "{:?}", load_errors(&err));
        check_dom(&String::from_utf8_lossy(&out.stdout));
    }

    fn check_dom(dom: &str) {
        for id in [
            "summary",
            "fleet",
            "failing-nodes",
            "node-pairs",
            "ddp-nodes",
            "nccl-nodes",
            "trends",
        ] {
            assert!(
                dom.contains(&format!(r#"id="{id}""#)),
                "no section {id} in:\n{dom}"
            );
        }
        // h100-03's slow NVLink pair, outlined in its own heatmap, both directions.
        let heat = part(dom, r#"<svg id="heatmap-h100-03""#, "</svg>");
        for pair in ["2-5", "5-2"] {
            let cell = tags(heat, &format!(r#"data-pair="{pair}""#));
            assert_eq!(cell.len(), 1, "{pair} in h100-03's heatmap:\n{heat}");
            assert!(cell[0].contains(r#"data-suspect="true""#), "{}", cell[0]);
        }
        assert_eq!(tags(heat, r#"data-suspect="true""#).len(), 2, "{heat}");
        assert!(
            dom.contains(r#"id="busbw-h100-03""#),
            "h100-03's busbw curve"
        );
        // h200-02, slow to every partner: the suspect of the node-pair matrix, retested.
        let matrix = part(dom, r#"<table id="pair-matrix""#, "</table>");
        let row = tags(matrix, r#"<th data-node="h200-02""#);
        assert_eq!(row.len(), 1, "{matrix}");
        assert!(row[0].contains(r#"data-suspect="true""#), "{}", row[0]);
        assert!(row[0].contains(r#"data-retested="true""#), "{}", row[0]);
        let retests = tags(matrix, r#"data-retest="true""#);
        assert!(
            !retests.is_empty() && retests.iter().all(|t| t.contains("h200-02")),
            "h200-02's retest: {retests:?}"
        );
        // The path h100-05 <-> h100-06: marked as a path, neither node a suspect.
        let path = tags(matrix, r#"data-pair="h100-05 h100-06""#);
        assert!(!path.is_empty(), "{matrix}");
        assert!(
            path.iter().all(|t| t.contains(r#"data-fault="path""#)),
            "{path:?}"
        );
        for node in ["h100-05", "h100-06"] {
            let row = tags(matrix, &format!(r#"<th data-node="{node}""#));
            assert_eq!(row.len(), 1, "{node}");
            assert!(!row[0].contains("data-suspect"), "{}", row[0]);
        }
        assert_eq!(
            tags(matrix, r#"data-suspect="true""#).len(),
            2,
            "h200-02 only, row and column"
        );
        // The busy node, skipped and not blamed; the DDP probe at 1, 2 and 4 nodes.
        let busy = tags(dom, r#"data-skipped="Busy""#);
        assert!(
            busy.iter().any(|t| t.contains(r#"data-node="h200-07""#)),
            "{busy:?}"
        );
        assert!(dom.contains(r#"<svg id="ddp-scaling""#));
        assert_eq!(tags(dom, "<tr data-nodes=").len(), 3, "1, 2 and 4 nodes");
    }

    /// The PNG's width and height, from its header.
    fn png_size(bytes: &[u8]) -> (u32, u32) {
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
        assert_eq!(&bytes[12..16], b"IHDR");
        let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        (be(&bytes[16..20]), be(&bytes[20..24]))
    }

    /// The PNG's distinct colours (8-bit RGB or RGBA, not interlaced), counted up to `max`.
    fn png_colours(bytes: &[u8], max: usize) -> usize {
        let (w, h) = png_size(bytes);
        let (depth, kind, interlace) = (bytes[24], bytes[25], bytes[28]);
        assert_eq!((depth, interlace), (8, 0), "8-bit, not interlaced");
        let channels = match kind {
            2 => 3,
            6 => 4,
            other => panic!("PNG colour type {other}"),
        };
        let mut idat = Vec::new();
        let mut at = 8;
        while at + 8 <= bytes.len() {
            let len = u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
                as usize;
            let kind = &bytes[at + 4..at + 8];
            let data = &bytes[at + 8..(at + 8 + len).min(bytes.len())];
            if kind == b"IDAT" {
                idat.extend_from_slice(data);
            }
            at += 12 + len;
        }
        let mut raw = Vec::new();
        flate2::read::ZlibDecoder::new(&idat[..])
            .read_to_end(&mut raw)
            .expect("the PNG's image data inflates");
        let stride = w as usize * channels;
        assert_eq!(raw.len(), (stride + 1) * h as usize, "every row");
        let mut prev = vec![0u8; stride];
        let mut colours = std::collections::HashSet::new();
        for row in raw.chunks(stride + 1) {
            let (filter, line) = (row[0], &row[1..]);
            let mut cur = vec![0u8; stride];
            for i in 0..stride {
                let a = if i >= channels { cur[i - channels] } else { 0 };
                let (b, c) = (prev[i], if i >= channels { prev[i - channels] } else { 0 });
                let predict = match filter {
                    0 => 0,
                    1 => a,
                    2 => b,
                    3 => ((u16::from(a) + u16::from(b)) / 2) as u8,
                    4 => {
                        let p = i16::from(a) + i16::from(b) - i16::from(c);
                        let (pa, pb, pc) = (
                            (p - i16::from(a)).abs(),
                            (p - i16::from(b)).abs(),
                            (p - i16::from(c)).abs(),
                        );
                        if pa <= pb && pa <= pc {
                            a
                        } else if pb <= pc {
                            b
                        } else {
                            c
                        }
                    }
                    other => panic!("PNG filter {other}"),
                };
                cur[i] = line[i].wrapping_add(predict);
            }
            for px in cur.chunks(channels) {
                colours.insert([px[0], px[1], px[2]]);
            }
            if colours.len() >= max {
                return colours.len();
            }
            prev = cur;
        }
        colours.len()
    }

    fn check_png(png: &Path) {
        let bytes = std::fs::read(png).unwrap_or_else(|e| panic!("{}: {e}", png.display()));
        assert_eq!(png_size(&bytes), (WIDTH, HEIGHT), "the window's size");
        assert!(bytes.len() > 20_000, "{} bytes: a blank page?", bytes.len());
        // Text, the heatmap's greens and reds, the bars: a blank page has one colour.
        let colours = png_colours(&bytes, 64);
        assert!(colours >= 64, "{colours} colours: a blank page?");
    }
}
