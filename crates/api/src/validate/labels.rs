//! Label keys, label values and object names as the API server checks them (apimachinery
//! `validation.IsQualifiedName`, `IsValidLabelValue`, `IsDNS1123Subdomain`), so that a node
//! selector no node can match is refused when the test is written, not when it runs.

/// Longest name part of a label key, and longest label value.
const NAME_MAX: usize = 63;
/// Longest DNS subdomain (a label key's prefix, a node name).
const SUBDOMAIN_MAX: usize = 253;

const NAME_RULE: &str = "must be 63 characters or less, consist of alphanumeric characters, '-', '_' or '.', and start and end with an alphanumeric character (e.g. 'MyName', 'my.name', '123-abc')";
const SUBDOMAIN_RULE: &str = "must be 253 characters or less, consist of lower case alphanumeric characters, '-' or '.', and start and end with an alphanumeric character (e.g. 'example.com')";

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters.
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= NAME_MAX
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// RFC 1123 subdomain: dot-separated labels of `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 253.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= SUBDOMAIN_MAX
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            let lower_alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
            !b.is_empty()
                && lower_alnum(b[0])
                && lower_alnum(b[b.len() - 1])
                && b.iter().all(|&c| lower_alnum(c) || c == b'-')
        })
}

/// Why `key` is not a valid label key (`[prefix/]name`), or None when it is.
pub fn label_key_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !is_dns_subdomain(p)
    {
        return Some(format!(
            "label key {key:?} has an invalid prefix {p:?}: a prefix {SUBDOMAIN_RULE}"
        ));
    }
    if !is_qualified_name_part(name) {
        return Some(format!(
            "label key {key:?} is not a valid label key: the name part {NAME_RULE}"
        ));
    }
    None
}

/// Why `value` is not a valid label value, or None when it is (empty is valid).
pub fn label_value_problem(value: &str) -> Option<String> {
    if value.is_empty() || is_qualified_name_part(value) {
        None
    } else {
        Some(format!(
            "label value {value:?} is not a valid label value: a value {NAME_RULE}"
        ))
    }
}

/// Why `name` cannot be a node's name, or None when it can.
pub fn node_name_problem(name: &str) -> Option<String> {
    if is_dns_subdomain(name) {
        None
    } else {
        Some(format!(
            "{name:?} is not a valid node name: a node name {SUBDOMAIN_RULE}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_keys_follow_the_api_server_rules() {
        for good in [
            "pool",
            "nvidia.com/gpu.product",
            "kubernetes.io/hostname",
            "a",
            "A_b-c.D",
            "x.y/Z9",
        ] {
            assert_eq!(label_key_problem(good), None, "{good}");
        }
        for bad in [
            "",
            "-pool",
            "pool-",
            "has space",
            "a/b/c",
            "/name",
            "Upper.Case/name",
            "prefix/",
            "we!rd",
            &"n".repeat(64),
        ] {
            assert!(label_key_problem(bad).is_some(), "{bad:?} accepted");
        }
        let msg = label_key_problem("has space").unwrap_or_default();
        assert!(
            msg.contains("\"has space\" is not a valid label key"),
            "{msg}"
        );
    }

    #[test]
    fn label_values_may_be_empty_but_not_malformed() {
        assert_eq!(label_value_problem(""), None);
        assert_eq!(label_value_problem("H100_SXM-80GB.v2"), None);
        assert_eq!(label_value_problem(&"v".repeat(63)), None);
        for bad in ["-x", "x-", "a b", "a/b", &"v".repeat(64)] {
            assert!(label_value_problem(bad).is_some(), "{bad:?} accepted");
        }
    }

    #[test]
    fn node_names_are_dns_subdomains() {
        assert_eq!(node_name_problem("gpu-node-01.rack3"), None);
        for bad in ["", "GPU-1", "node_1", "a..b", "-a", &"a".repeat(254)] {
            assert!(node_name_problem(bad).is_some(), "{bad:?} accepted");
        }
    }
}
