//! The HTML report on the demo run's objects: what each section marks, where the full
//! results come from, and what the page says when it has none.

use super::model::{HtmlReport, Kept, KeptError, MAX_MATRIX_NODES, Sources, read_kept};
use super::render;
use crate::fixtures;
use gpufabric_api::shard::FabricTestRunShard;
use gpufabric_api::trend::{NodeTrend, TrendPoint};
use gpufabric_api::{FabricTestRun, Finding, FindingKind, Metric, Severity, Subject, keys};
use k8s_openapi::api::core::v1::{ConfigMap, Node};

const RUN: &str = "nightly-manual-1";

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

/// The demo run with h200-02 blamed by its node pairs.
fn run() -> FabricTestRun {
    let mut r = fixtures::run();
    if let Some(s) = r.status.as_mut() {
        s.findings.push(Finding::new(
            FindingKind::Slow,
            Subject::node("h200-02"),
            Metric::NodePairBusBw,
            Severity::Critical,
            "h200-02 is slow to every partner".into(),
        ));
    }
    r
}

struct Fetched {
    run: FabricTestRun,
    shards: Vec<FabricTestRunShard>,
    nodes: Vec<Node>,
    kept: Vec<ConfigMap>,
    confirmation: Option<String>,
    gpus_out: Vec<crate::gpus_out::GpuOut>,
}

impl Fetched {
    fn demo() -> Fetched {
        let doc = fixtures::document("h100-03", (2, 5), 360.0);
        let later = fixtures::document("h200-02", (9, 9), 480.0);
        Fetched {
            run: run(),
            shards: vec![fixtures::shard()],
            nodes: vec![
                fixtures::node("h100-03", None),
                fixtures::node("h200-02", Some(fixtures::RECORD)),
            ],
            kept: vec![
                fixtures::kept("h100-03", RUN, &doc, false),
                fixtures::kept("h200-02", "nightly-t-1", &later, true),
            ],
            confirmation: None,
            gpus_out: Vec::new(),
        }
    }

    fn model(&self) -> HtmlReport {
        HtmlReport::of(&Sources {
            run: &self.run,
            shards: &self.shards,
            nodes: &self.nodes,
            kept: &self.kept,
            kept_note: None,
            confirmation: self.confirmation.as_deref(),
            generated_at: "2026-11-21T03:00:00Z",
            gpus_out: &self.gpus_out,
        })
    }

    fn page(&self) -> String {
        render(&self.model())
    }
}

#[test]
fn the_page_is_one_self_contained_document_with_every_section() {
    let page = Fetched::demo().page();
    assert!(page.starts_with("<!DOCTYPE html>"), "{page}");
    assert!(page.trim_end().ends_with("</html>"));
    for id in [
        "summary",
        "fleet",
        "failing-nodes",
        "node-pairs",
        "ddp-nodes",
        "nccl-nodes",
        "trends",
    ] {
        assert_eq!(
            page.matches(&format!(r#"id="{id}""#)).count(),
            1,
            "section {id}"
        );
    }
    // Nothing fetched, nothing run: no script, link, image, import or remote address.
    for banned in [
        "<script", "<link", "<img", "@import", "url(", "http:", "https:", "src=",
    ] {
        assert!(!page.contains(banned), "{banned} in the page");
    }
    assert!(!page.contains("NaN") && !page.contains("inf\""), "{page}");
}

#[test]
fn the_fleet_counts_every_verdict_and_says_why_nodes_were_not_measured() {
    let page = Fetched::demo().page();
    // The shard's entries join the run's list: h100-05 passed, h200-02 failed.
    for (verdict, count) in [
        ("Failed", 2),
        ("Passed", 2),
        ("NotMeasured", 1),
        ("Errored", 0),
    ] {
        let tag = tags(&page, &format!(r#"id="count-{verdict}""#));
        assert_eq!(tag.len(), 1, "{verdict}");
        assert!(
            tag[0].contains(&format!(r#"data-count="{count}""#)),
            "{verdict}: {}",
            tag[0]
        );
    }
    let evicted = tags(&page, r#"data-not-measured="Evicted""#);
    assert!(evicted[0].contains(r#"data-node="h100-09""#), "{evicted:?}");
    assert!(page.contains("evicted by the kubelet"));
    let busy = tags(&page, r#"data-skipped="Busy""#);
    assert!(busy[0].contains(r#"data-node="h200-07""#), "{busy:?}");
    assert!(page.contains("8 of 8 GPUs in use"));
}

#[test]
fn the_slow_gpu_pair_is_outlined_in_its_nodes_heatmap_and_under_its_floor() {
    let page = Fetched::demo().page();
    let heat = &page[page.find(r#"id="heatmap-h100-03""#).expect("a heatmap")..];
    let heat = &heat[..heat.find("</svg>").expect("its end")];
    for pair in ["2-5", "5-2"] {
        let cell = tags(heat, &format!(r#"data-pair="{pair}""#));
        assert_eq!(cell.len(), 1, "{pair}");
        assert!(cell[0].contains(r#"data-suspect="true""#), "{}", cell[0]);
        assert!(
            cell[0].contains(r#"data-below-floor="true""#),
            "{}",
            cell[0]
        );
        assert!(cell[0].contains(r#"data-gbps="148.0""#), "{}", cell[0]);
    }
    assert_eq!(tags(heat, r#"data-suspect="true""#).len(), 2, "only 2<->5");
    assert_eq!(
        tags(heat, "data-pair=").len(),
        56,
        "every ordered pair of 8 GPUs"
    );
    // A GPU a finding names is marked on both axes.
    let mut f = Fetched::demo();
    if let Some(s) = f.run.status.as_mut() {
        s.findings.push(Finding::new(
            FindingKind::Slow,
            Subject::gpu("h100-03", 6),
            Metric::GemmThroughput,
            Severity::Critical,
            "GPU 6 computes slowly".into(),
        ));
    }
    let page = f.page();
    let gpu6 = tags(&page, r#"data-gpu="6" data-suspect="true""#);
    assert_eq!(gpu6.len(), 2, "{gpu6:?}");
}

#[test]
fn the_busbw_curves_are_drawn_against_the_product_floor_or_the_runs_threshold() {
    let mut f = Fetched::demo();
    let page = f.page();
    let chart = &page[page.find(r#"id="busbw-h100-03""#).expect("a chart")..];
    let chart = &chart[..chart.find("</svg>").expect("its end")];
    assert_eq!(tags(chart, r#"data-series="allReduce""#).len(), 1);
    assert_eq!(tags(chart, r#"data-series="allGather""#).len(), 1);
    assert!(chart.contains(r#"data-rule="floor""#), "{chart}");
    assert!(
        // The fixture's sweep ends at 256 MiB: the floor healthy nodes are held to there.
        chart.contains("all_reduce floor 214 GB/s (H100 80GB HBM3 floor at a sweep to 256 MiB)"),
        "{chart}"
    );
    f.run.spec.thresholds.nccl_bus_bw_gbps = Some(400.0);
    let page = f.page();
    assert!(
        page.contains("all_reduce floor 400 GB/s (thresholds.ncclBusBwGbps)"),
        "the run's threshold first"
    );
}

#[test]
fn a_node_whose_kept_result_is_of_a_later_run_or_missing_says_so_and_draws_none() {
    let mut f = Fetched::demo();
    let page = f.page();
    let h200 = &page[page.find(r#"id="node-h200-02""#).expect("h200-02")..];
    let h200 = &h200[..h200.find("</article>").expect("its end")];
    assert!(
        h200.contains(r#"<p class="note" data-kept="false">full result not kept: the node&#39;s kept document is of run nightly-t-1, not of nightly-manual-1"#),
        "{h200}"
    );
    assert!(!page.contains("heatmap-h200-02"));
    f.kept.clear();
    let page = f.page();
    assert!(page.contains("full result not kept: no ConfigMap holds this node"));
    assert!(!page.contains("heatmap-"));
}

#[test]
fn the_confirmation_runs_result_is_drawn_and_named_gzipped_too() {
    let mut f = Fetched::demo();
    let doc = fixtures::document("h100-03", (2, 5), 360.0);
    f.kept = vec![fixtures::kept(
        "h100-03",
        "nightly-manual-1-confirm",
        &doc,
        true,
    )];
    // Not this run's and not its confirmation's: a note.
    assert!(f.page().contains("not of nightly-manual-1"));
    f.confirmation = Some("nightly-manual-1-confirm".into());
    let model = f.model();
    let h100 = model
        .failing
        .iter()
        .find(|d| d.entry.node == "h100-03")
        .expect("h100-03 failed");
    assert!(
        matches!(&h100.kept, Kept::Document { run, confirmation: true, doc }
            if run == "nightly-manual-1-confirm" && **doc == fixtures::document("h100-03", (2, 5), 360.0)),
        "{:?}",
        h100.kept
    );
    let page = f.page();
    assert!(page.contains(r#"data-kept="confirmation""#));
    assert!(page.contains(r#"id="heatmap-h100-03""#));
}

#[test]
fn a_kept_result_that_cannot_be_read_is_a_note_not_a_panic() {
    let mut f = Fetched::demo();
    let mut bad = fixtures::kept("h100-03", RUN, &fixtures::document("x", (0, 1), 1.0), false);
    bad.data = Some([("result.json".to_string(), "{\"schema\": ".to_string())].into());
    let mut zip = bad.clone();
    zip.data = None;
    zip.binary_data = Some(
        [(
            "result.json.gz".to_string(),
            k8s_openapi::ByteString(b"not gzip".to_vec()),
        )]
        .into(),
    );
    for cm in [bad, zip] {
        f.kept = vec![cm];
        let page = f.page();
        assert!(
            page.contains("full result not readable: ConfigMap"),
            "{page}"
        );
    }
    let model = HtmlReport::of(&Sources {
        kept_note: Some("full result not read: listing the ConfigMaps failed"),
        ..Sources {
            run: &f.run,
            shards: &f.shards,
            nodes: &f.nodes,
            kept: &[],
            kept_note: None,
            confirmation: None,
            generated_at: "",
            gpus_out: &[],
        }
    });
    assert!(render(&model).contains("full result not read: listing the ConfigMaps failed"));
}

#[test]
fn a_kept_config_map_without_a_document_says_which_way_it_failed() {
    let doc = fixtures::document("x", (0, 1), 1.0);
    let mut none = fixtures::kept("h100-03", RUN, &doc, false);
    none.data = None;
    let err = read_kept(&none).expect_err("no document");
    assert!(matches!(err, KeptError::NoDocument), "{err:?}");
    assert_eq!(
        err.to_string(),
        "it has neither result.json nor result.json.gz"
    );
    let mut zip = fixtures::kept("h100-03", RUN, &doc, true);
    zip.binary_data = Some(
        [(
            keys::RESULT_KEY_GZIP.to_string(),
            k8s_openapi::ByteString(b"not gzip".to_vec()),
        )]
        .into(),
    );
    let err = read_kept(&zip).expect_err("not gzip");
    assert!(matches!(err, KeptError::Unzip(_)), "{err:?}");
    let mut bad = fixtures::kept("h100-03", RUN, &doc, false);
    bad.data = Some([(keys::RESULT_KEY.to_string(), "{".to_string())].into());
    let err = read_kept(&bad).expect_err("truncated");
    assert!(matches!(err, KeptError::Parse(_)), "{err:?}");
    assert_eq!(
        read_kept(&fixtures::kept("h100-03", RUN, &doc, true)).ok(),
        Some(doc)
    );
}

#[test]
fn the_node_pair_matrix_marks_the_suspect_its_retest_and_the_slow_path() {
    let page = Fetched::demo().page();
    let matrix = &page[page.find(r#"id="pair-matrix""#).expect("a matrix")..];
    let matrix = &matrix[..matrix.find("</table>").expect("its end")];
    let rows = tags(matrix, r#"<th data-node="h200-02""#);
    assert_eq!(rows.len(), 1, "{matrix}");
    assert!(rows[0].contains(r#"data-suspect="true""#), "{}", rows[0]);
    assert!(rows[0].contains(r#"data-retested="true""#), "{}", rows[0]);
    for healthy in ["h100-05", "h100-00"] {
        let row = tags(matrix, &format!(r#"<th data-node="{healthy}""#));
        assert!(!row[0].contains("data-suspect"), "{}", row[0]);
    }
    // Each pair is drawn both ways round.
    let retest = tags(matrix, r#"data-pair="h100-00 h200-02""#);
    assert_eq!(retest.len(), 2);
    assert!(
        retest.iter().all(|t| t.contains(r#"data-retest="true""#)),
        "{retest:?}"
    );
    let path = tags(matrix, r#"data-pair="h100-05 h200-02""#);
    assert_eq!(path.len(), 2);
    assert!(
        path.iter().all(|t| t.contains(r#"data-fault="path""#)),
        "{path:?}"
    );
    assert!(path.iter().all(|t| !t.contains("data-retest")), "{path:?}");
}

#[test]
fn the_matrix_keeps_the_nodes_worth_a_look_within_its_bound() {
    let mut f = Fetched::demo();
    let n = MAX_MATRIX_NODES + 20;
    let names: Vec<String> = (0..n).map(|i| format!("n{i:03}")).collect();
    let entries: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({"node": names[i], "verdict": "Passed", "pairs": [
                {"round": 1, "index": i, "partner": names[(i + 1) % n], "rank": 0,
                 "state": "Measured", "busbwGbps": 48.0}]})
        })
        .collect();
    f.shards = vec![
        serde_json::from_value(serde_json::json!({
            "apiVersion": "gpufabric.io/v1alpha1", "kind": "FabricTestRunShard",
            "metadata": {"name": "s"}, "spec": {"run": RUN, "index": 0, "nodes": names},
            "status": {"nodes": entries}
        }))
        .expect("a shard"),
    ];
    if let Some(s) = f.run.status.as_mut() {
        s.findings.push(Finding::new(
            FindingKind::Slow,
            Subject::node("n059"),
            Metric::NodePairBusBw,
            Severity::Critical,
            "slow".into(),
        ));
    }
    let m = f.model().pairs.expect("a matrix");
    assert_eq!(m.nodes.len(), MAX_MATRIX_NODES);
    assert_eq!(m.hidden, 20);
    assert!(
        m.nodes.iter().any(|x| x.name == "n059" && x.suspect),
        "the suspect first"
    );
}

#[test]
fn the_ddp_probe_is_drawn_by_node_count_with_its_straggler() {
    let page = Fetched::demo().page();
    assert!(page.contains(r#"<svg id="ddp-scaling""#));
    assert!(page.contains(r#"<svg id="ddp-step""#));
    assert_eq!(tags(&page, "<tr data-nodes=").len(), 2);
    let s = tags(&page, r#"data-straggler="true""#);
    assert!(s[0].contains(r#"data-node="h100-01""#), "{s:?}");
    let mut f = Fetched::demo();
    if let Some(s) = f.run.status.as_mut() {
        s.ddp_nodes = None;
        s.node_pairs = None;
    }
    let page = f.page();
    assert!(page.contains("This run had no multi-node DDP probe"));
    assert!(page.contains("This run had no node-pair phase"));
}

#[test]
fn trends_are_sparklines_of_the_tests_runs_or_no_trend_yet() {
    let mut f = Fetched::demo();
    let mut t = NodeTrend::default();
    for (i, b) in [480.0, 470.0, 361.5].iter().enumerate() {
        let p = TrendPoint {
            at: 1_764_000_000 + i as i64 * 86_400,
            busbw_gbps: Some(*b),
            worst_pair_gbps: Some(370.0),
            host_gbps: Some(52.0),
            ddp_step_ms: Some(41.0),
        };
        t = t.with_point("nightly", "s", p, 14);
    }
    f.nodes[0] = fixtures::with_trend(f.nodes[0].clone(), &t.to_json());
    f.nodes[1] = fixtures::with_trend(f.nodes[1].clone(), "cordon me");
    let page = f.page();
    let row = |node: &str| {
        let at = page
            .find(&format!(r#"<tr data-node="{node}" data-trend="#))
            .expect("a row");
        &page[at..at + page[at..].find("</tr>").expect("its end")]
    };
    let h100 = row("h100-03");
    assert!(h100.contains(r#"data-trend="points""#), "{h100}");
    assert_eq!(h100.matches("<svg class=\"spark\"").count(), 4, "{h100}");
    assert!(h100.contains("362 GB/s"), "the latest busbw: {h100}");
    assert!(row("h200-02").contains(r#"data-trend="unreadable""#));
    let none = row("h100-00");
    assert!(none.contains(r#"data-trend="none""#) && none.contains("no trend yet"));
}

#[test]
fn every_string_from_the_cluster_is_escaped() {
    let mut f = Fetched::demo();
    if let Some(s) = f.run.status.as_mut() {
        s.nodes[0].reason = Some("<script>alert(1)</script>".into());
        s.findings[0].message = "pair \"2-5\" <b>slow</b> & worse".into();
        s.skipped[0].message = "<img src=x>".into();
    }
    let page = f.page();
    assert!(!page.contains("<script>") && !page.contains("<b>slow") && !page.contains("<img"));
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(page.contains("pair &quot;2-5&quot; &lt;b&gt;slow&lt;/b&gt; &amp; worse"));
}

#[test]
fn the_page_lists_the_gpus_the_test_took_out_of_service_and_only_then() {
    let mut f = Fetched::demo();
    let plain = render(&f.model());
    assert!(
        !plain.contains("id=\"gpus-out\""),
        "no GPU tainted, no section"
    );
    f.gpus_out = crate::gpus_out::of_test(&fixtures::with_tainted_gpus(fixtures::test()));
    let html = render(&f.model());
    assert!(html.contains("<h3 id=\"gpus-out\">GPUs out of service (DRA device taints; the node itself stays schedulable)</h3>"));
    let rows: Vec<&str> = tags(&html, "data-gpu=")
        .into_iter()
        .filter(|t| t.starts_with("<tr"))
        .collect();
    assert_eq!(
        rows,
        [
            r#"<tr data-node="h100-00" data-gpu="6">"#,
            r#"<tr data-node="h100-03" data-gpu="2">"#,
            r#"<tr data-node="h100-03" data-gpu="5">"#
        ]
    );
    assert!(html.contains("<td class=\"node\">gpu.nvidia.com/h100-03/gpu-5</td><td class=\"node\">2026-11-21T02:04:10Z</td><td class=\"node\">gpufabric-gpu-q9w4z</td><td>GPU 5 computes a step 1.5x slower than the node&#39;s other GPUs</td>"), "{html}");
}

#[test]
fn the_nccl_sweep_is_drawn_per_collective_by_node_count_with_its_knee_and_each_block() {
    let mut f = Fetched::demo();
    let page = f.page();
    assert!(
        page.contains("This run had no multi-node NCCL sweep"),
        "a run without the phase says so"
    );
    if let Some(s) = f.run.status.as_mut() {
        s.nccl_nodes = Some(fixtures::in_blocks(fixtures::nccl_nodes()));
    }
    let page = f.page();
    // The curve across blocks and the block's own, each a chart with one line per collective.
    assert!(page.contains(r#"<svg id="nccl-nodes""#), "{page}");
    assert!(page.contains(r#"<svg id="nccl-nodes-b0""#), "{page}");
    assert!(page.contains("Across blocks of example.com/rack"));
    assert!(page.contains("Block example.com/rack=rack-b"));
    let rows = tags(&page, r#"<tr data-nodes="#);
    // Two points of the sweep across blocks, one of the block, two of the DDP probe.
    assert_eq!(rows.len(), 5, "{rows:?}");
    assert!(page.contains(r#"<table id="nccl-nodes-points">"#));
    assert!(page.contains("<th>all_reduce busbw GB/s</th>"), "{page}");
    let knee = tags(&page, "data-knee=");
    assert_eq!(knee.len(), 1, "{knee:?}");
    assert!(knee[0].contains(r#"data-at-nodes="4""#), "{knee:?}");
    let slow = tags(&page, "data-slow-block=");
    assert_eq!(slow.len(), 1);
    assert!(slow[0].contains(r#"data-slow-block="rack-b""#), "{slow:?}");
    assert!(!page.contains("This run had no multi-node NCCL sweep"));
}

#[test]
fn the_nccl_curve_is_drawn_beside_its_links_ceiling_and_a_count_far_below_it_is_said() {
    let mut f = Fetched::demo();
    let p = fixtures::nccl_nodes_far_below_links();
    if let Some(s) = f.run.status.as_mut() {
        s.nccl_nodes = Some(p);
    }
    let page = f.page();
    // The ceiling is a line of the chart beside the curve, and a column of the table.
    assert!(
        page.contains(r#"<g data-series="allReduce-ceiling">"#),
        "{page}"
    );
    assert!(page.contains("all_reduce links&#39; ceiling"), "{page}");
    let cells = tags(&page, r#"<td class="num" data-ceiling="#);
    assert_eq!(cells.len(), 2, "{cells:?}");
    assert!(
        page.contains(r#"data-ceiling="allReduce">400 (11%)</td>"#),
        "{page}"
    );
    assert!(
        page.contains("<td>h100-01 (8 rails, 400.0 GB/s)</td>"),
        "{page}"
    );
    let gap = tags(&page, "data-link-gap=");
    assert_eq!(gap.len(), 1, "{gap:?}");
    assert!(
        gap[0].contains(r#"data-link-gap="below" data-nodes="4""#),
        "{gap:?}"
    );
}
