//! The baseline's update: bounded, expiring, and never mixing runs that are not alike.

use super::*;

const DAY: i64 = 86_400;

fn key(product: &str, settings: &str) -> BaselineKey {
    BaselineKey {
        product: product.into(),
        gpus: 8,
        suite: "suite".into(),
        settings: settings.into(),
    }
}

fn sample(run: &str, nodes: u32, busbw: &[f64]) -> RunSample {
    let mut series = BTreeMap::new();
    if let Some(s) = Spread::of(busbw) {
        series.insert(Series::BusBw(Collective::AllReduce).to_string(), s);
    }
    RunSample {
        run: run.into(),
        at: 0,
        nodes,
        series,
    }
}

fn keyed(k: &BaselineKey, s: RunSample) -> KeyedSample {
    KeyedSample {
        key: k.clone(),
        sample: s,
    }
}

const ALL_REDUCE: Series = Series::BusBw(Collective::AllReduce);

#[test]
fn a_spread_is_the_median_and_tenth_and_ninetieth_percentiles_of_positive_values() {
    let s = Spread::of(&[10.0, 20.0, 30.0, 40.0, 50.0, 0.0, f64::NAN]).expect("values");
    assert_eq!((s.median, s.p10, s.p90, s.n), (30.0, 14.0, 46.0, 5));
    assert_eq!(Spread::of(&[0.0, -1.0]), None);
}

#[test]
fn the_baseline_is_the_median_of_its_runs_so_one_bad_run_moves_it_little() {
    let k = key("h100", "none");
    let mut b = FleetBaseline::default();
    for (i, v) in [400.0, 402.0, 398.0, 120.0].iter().enumerate() {
        let s = sample(&format!("r{i}"), 5, &[*v; 5]);
        b = b.with_run(&[keyed(&k, s)], i as i64 * 3600);
    }
    let e = b
        .expectation(&k, ALL_REDUCE, 4 * 3600)
        .expect("rests on 5 nodes");
    assert_eq!(e.median, 399.0);
    assert_eq!((e.nodes, e.runs, e.days), (5, 4, 1));
}

#[test]
fn runs_alike_only_are_compared_other_settings_products_and_suites_never_mix() {
    let plain = key("h100", "none");
    let tuned = key("h100", "nccl-algo-ring");
    let other_product = key("h200", "none");
    let other_suite = BaselineKey {
        suite: "short".into(),
        ..plain.clone()
    };
    let b = FleetBaseline::default()
        .with_run(&[keyed(&plain, sample("a", 4, &[400.0; 4]))], 0)
        .with_run(&[keyed(&tuned, sample("b", 4, &[40.0; 4]))], 10)
        .with_run(&[keyed(&other_product, sample("c", 4, &[600.0; 4]))], 20);
    assert_eq!(
        b.expectation(&plain, ALL_REDUCE, 30).map(|e| e.median),
        Some(400.0)
    );
    assert_eq!(
        b.expectation(&tuned, ALL_REDUCE, 30).map(|e| e.median),
        Some(40.0)
    );
    assert_eq!(
        b.expectation(&other_product, ALL_REDUCE, 30)
            .map(|e| e.median),
        Some(600.0)
    );
    assert_eq!(b.expectation(&other_suite, ALL_REDUCE, 30), None);
}

#[test]
fn runs_older_than_the_window_expire_and_a_key_with_none_left_goes() {
    let old = key("h100", "old");
    let k = key("h100", "none");
    let b = FleetBaseline::default()
        .with_run(&[keyed(&old, sample("a", 4, &[400.0; 4]))], 0)
        .with_run(&[keyed(&k, sample("b", 4, &[300.0; 4]))], DAY);
    assert_eq!(b.entries.len(), 2);
    // Read past the window, nothing of the old run is expected any more.
    assert_eq!(b.expectation(&old, ALL_REDUCE, MAX_AGE_SECONDS + 1), None);
    let later = b.with_run(
        &[keyed(&k, sample("c", 4, &[310.0; 4]))],
        MAX_AGE_SECONDS + 1,
    );
    assert_eq!(later.entries.len(), 1, "the expired key is gone");
    assert_eq!(later.runs(&k).len(), 2);
    let e = later
        .expectation(&k, ALL_REDUCE, MAX_AGE_SECONDS + 1)
        .expect("two recent runs");
    assert_eq!(e.days, 7);
}

#[test]
fn at_most_the_newest_runs_and_keys_are_kept() {
    let mut b = FleetBaseline::default();
    for i in 0..(MAX_RUNS + 5) {
        let k = key("h100", "none");
        b = b.with_run(
            &[keyed(&k, sample(&format!("r{i}"), 4, &[400.0; 4]))],
            i as i64,
        );
    }
    let runs = b.runs(&key("h100", "none"));
    assert_eq!(runs.len(), MAX_RUNS);
    assert_eq!(runs[0].run, "r5", "the oldest went first");
    for i in 0..(MAX_KEYS + 3) {
        let k = key("h100", &format!("s{i}"));
        b = b.with_run(&[keyed(&k, sample("x", 4, &[400.0; 4]))], 100);
    }
    assert_eq!(b.entries.len(), MAX_KEYS);
    assert_eq!(b.entries[0].key, key("h100", &format!("s{}", MAX_KEYS + 2)));
}

#[test]
fn a_retried_fold_of_the_same_run_replaces_its_sample() {
    let k = key("h100", "none");
    let b = FleetBaseline::default()
        .with_run(&[keyed(&k, sample("a", 4, &[400.0; 4]))], 0)
        .with_run(&[keyed(&k, sample("a", 4, &[400.0; 4]))], 0);
    assert_eq!(b.runs(&k).len(), 1);
}

#[test]
fn a_baseline_on_fewer_than_the_minimum_nodes_expects_nothing() {
    let k = key("h100", "none");
    let b = FleetBaseline::default()
        .with_run(&[keyed(&k, sample("a", 2, &[400.0; 2]))], 0)
        .with_run(&[keyed(&k, sample("b", 2, &[400.0; 2]))], 1);
    assert_eq!(b.expectation(&k, ALL_REDUCE, 2), None);
    // A run that passed no node feeds nothing.
    let empty = FleetBaseline::default().with_run(&[keyed(&k, sample("c", 0, &[]))], 0);
    assert!(empty.entries.is_empty());
}

#[test]
fn every_series_reads_back_from_its_stored_name() {
    let all = [
        Series::BusBw(Collective::AllToAll),
        Series::WorstPair,
        Series::WorstPairBidir,
        Series::WorstH2d,
        Series::WorstD2h,
        Series::Ddp(8),
        Series::Gemm,
        Series::Memory,
        Series::NodePair(NetTransport::Ib, 1 << 30),
        Series::Probe(4),
        Series::Sweep(Collective::AllToAll, 16),
    ];
    for s in all {
        assert_eq!(s.to_string().parse::<Series>().ok(), Some(s), "{s}");
    }
    assert!("busbw.allreduce".parse::<Series>().is_err());
    assert!("ddp.x".parse::<Series>().is_err());
}

#[test]
fn the_settings_fingerprint_follows_nccl_settings_and_their_values_only() {
    let a = settings_fingerprint([("NCCL_ALGO", Some("Ring")), ("FOO", Some("1"))]);
    let b = settings_fingerprint([("FOO", Some("2")), ("NCCL_ALGO", Some("Ring"))]);
    let c = settings_fingerprint([("NCCL_ALGO", Some("Tree"))]);
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_ne!(a, settings_fingerprint([]));
}

/// The largest baseline a test keeps, at 10,000 nodes a run: every key full of runs, every
/// run with the most series, every count at 10,000. Its bytes are in bench/SCALE.md.
#[test]
fn a_full_baseline_stays_small() {
    let mut b = FleetBaseline::default();
    let values: Vec<f64> = (0..10_000)
        .map(|i| 300.0 + f64::from(i) * 0.012_345)
        .collect();
    let spread = Spread::of(&values).expect("values");
    assert_eq!(spread.n, 10_000);
    for k in 0..MAX_KEYS {
        let key = BaselineKey {
            product: "nvidia-h100-80gb-hbm3".into(),
            gpus: 8,
            suite: format!("{:016x}", k),
            settings: format!("{:016x}", k + 1000),
        };
        for r in 0..MAX_RUNS {
            let series: BTreeMap<String, Spread> = (0..MAX_SERIES as u64)
                .map(|i| {
                    (
                        Series::NodePair(NetTransport::Ib, (1 << 30) + i).to_string(),
                        spread,
                    )
                })
                .collect();
            let s = RunSample {
                run: format!("nightly-gpu-fabric-check-29312345{r:02}"),
                at: 0,
                nodes: 10_000,
                series,
            };
            b = b.with_run(&[keyed(&key, s)], r as i64 * 3600);
        }
    }
    let bytes = b.to_json().len();
    println!("full baseline at 10,000 nodes: {bytes} bytes");
    assert_eq!(b.entries.len(), MAX_KEYS);
    assert!(b.entries.iter().all(|e| e.runs.len() == MAX_RUNS));
    // Beside the rest of the FabricTest status (about 156 KB), well under etcd's 1.5 MB.
    assert!(bytes < 205_000, "{bytes} bytes");
    assert_eq!(FleetBaseline::parse(&b.to_json()).ok(), Some(b));
}
