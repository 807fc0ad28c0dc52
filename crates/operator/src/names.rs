//! Deterministic object names and label values: the same inputs always give the same name,
//! at most 63 characters, so a restarted operator finds (and never duplicates) what it made.
//! The names of a run's pods and Secret start with [`run_base`], which holds a hash of the
//! run's UID: no one can know them before the run exists.

/// Longest name or label value this operator makes.
pub const MAX_NAME: usize = 63;

pub use gpufabric_api::fnv1a;

/// `text` cut to `max` characters with a hash of the whole text at the end when it is
/// longer, so that two long names that share a prefix stay different. The result starts
/// and ends with a letter or digit (what names and label values require).
pub fn bounded(text: &str, max: usize) -> String {
    let clean: String = text
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let trim = |s: &str| {
        s.trim_matches(|c: char| !c.is_ascii_alphanumeric())
            .to_string()
    };
    if clean == text && clean.len() <= max && trim(&clean) == clean {
        return clean;
    }
    let hash = format!("{:08x}", fnv1a(text.as_bytes()) as u32);
    let keep = max.saturating_sub(9).min(clean.len());
    let prefix = trim(&clean[..keep]);
    if prefix.is_empty() {
        hash
    } else {
        format!("{prefix}-{hash}")
    }
}

/// A label value for any string (node names may be up to 253 characters).
pub fn label_value(text: &str) -> String {
    bounded(text, MAX_NAME)
}

/// What the name of every pod and Secret of run `run` (UID `uid`) starts with: the run's
/// name and a hash of its UID. The UID is random and made by the API server, so these names
/// cannot be known, and squatted, before the run exists. Not bounded: the names built on it
/// are.
pub fn run_base(run: &str, uid: &str) -> String {
    format!("{run}-{:08x}", fnv1a(uid.as_bytes()) as u32)
}

/// Name of the benchmark pod of `node` in the run whose [`run_base`] is `run`.
pub fn pod_name(run: &str, node: &str) -> String {
    bounded(&format!("{run}-{node}"), MAX_NAME)
}

/// Name of a run: the test name and a suffix (the schedule minute, or what made it).
pub fn run_name(test: &str, suffix: &str) -> String {
    bounded(&format!("{test}-{suffix}"), MAX_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_are_kept_as_they_are() {
        assert_eq!(
            pod_name("nightly-29000000", "gpu-node-1"),
            "nightly-29000000-gpu-node-1"
        );
        assert_eq!(label_value("gpu-node-1"), "gpu-node-1");
        assert_eq!(
            label_value("ip-10-0-0-1.ec2.internal"),
            "ip-10-0-0-1.ec2.internal"
        );
    }

    #[test]
    fn long_names_are_cut_to_63_and_stay_distinct() {
        let node_a = format!("{}-a", "x".repeat(80));
        let node_b = format!("{}-b", "x".repeat(80));
        let a = pod_name("nightly-29000000", &node_a);
        let b = pod_name("nightly-29000000", &node_b);
        assert!(a.len() <= 63, "{a}");
        assert!(b.len() <= 63, "{b}");
        assert_ne!(a, b);
        assert_eq!(a, pod_name("nightly-29000000", &node_a), "deterministic");
        assert!(a.chars().last().is_some_and(|c| c.is_ascii_alphanumeric()));
    }

    #[test]
    fn cut_names_never_end_in_a_dash_or_dot() {
        let name = format!("{}.-{}", "a".repeat(52), "b".repeat(40));
        let v = label_value(&name);
        assert!(v.len() <= 63);
        assert!(
            v.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        );
        assert!(v.chars().next().is_some_and(|c| c.is_ascii_alphanumeric()));
        assert!(v.chars().last().is_some_and(|c| c.is_ascii_alphanumeric()));
    }

    #[test]
    fn a_runs_pod_names_depend_on_its_uid() {
        let a = pod_name(&run_base("nightly-29000000", "uid-a"), "gpu-node-1");
        let b = pod_name(&run_base("nightly-29000000", "uid-b"), "gpu-node-1");
        assert_ne!(a, b);
        assert!(a.starts_with("nightly-29000000-"), "{a}");
        assert_ne!(a, pod_name("nightly-29000000", "gpu-node-1"));
        let long = format!("{}-run", "x".repeat(70));
        assert_ne!(
            pod_name(&run_base(&long, "uid-a"), "gpu-node-1"),
            pod_name(&run_base(&long, "uid-b"), "gpu-node-1"),
            "the UID's hash survives a cut"
        );
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
