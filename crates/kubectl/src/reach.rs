//! Why the plugin could not talk to the cluster, in one line that says what to do: no
//! kubeconfig, an API server it cannot reach, credentials refused, or rights missing.

use std::error::Error;

/// One line for an error whose chain holds a client error the user can act on; None for
/// any other error (printed as it is).
pub fn explain<'a>(chain: impl IntoIterator<Item = &'a (dyn Error + 'static)>) -> Option<String> {
    for e in chain {
        if let Some(k) = e.downcast_ref::<kube::Error>()
            && let Some(line) = explain_kube(k, e)
        {
            return Some(line);
        }
        if e.downcast_ref::<kube::config::InferConfigError>().is_some()
            || e.downcast_ref::<kube::config::KubeconfigError>().is_some()
        {
            return Some(no_kubeconfig(e));
        }
    }
    None
}

fn no_kubeconfig(e: &(dyn Error + 'static)) -> String {
    format!(
        "no usable kubeconfig ({}): set KUBECONFIG, pass --kubeconfig FILE or --context NAME, or run inside the cluster",
        innermost(e)
    )
}

fn explain_kube(k: &kube::Error, e: &(dyn Error + 'static)) -> Option<String> {
    match k {
        kube::Error::Api(s) if s.code == 401 => Some(format!(
            "the cluster refused the kubeconfig's credentials (401 {}): log in again or pick another --context",
            s.message
        )),
        kube::Error::Api(s) if s.code == 403 => Some(format!(
            "not allowed: {} (403): ask for get and list on FabricTests, FabricTestRuns, Nodes and Events (and patch on FabricTests and Nodes to run or release)",
            s.message
        )),
        kube::Error::HyperError(_) | kube::Error::Service(_) => Some(format!(
            "cannot reach the cluster's API server ({}): check the kubeconfig's server and --context, the VPN or network, and that the cluster is up",
            innermost(e)
        )),
        kube::Error::InferConfig(_) | kube::Error::InferKubeconfig(_) => Some(no_kubeconfig(e)),
        kube::Error::Auth(_) => Some(format!(
            "the kubeconfig's credentials could not be loaded ({}): log in again (the exec plugin or token of the context)",
            innermost(e)
        )),
        _ => None,
    }
}

/// The deepest source of `e`: the cause itself, without the wrappers' prefixes.
fn innermost<'a>(e: &'a (dyn Error + 'static)) -> &'a (dyn Error + 'static) {
    let mut at = e;
    while let Some(next) = at.source() {
        at = next;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            message: message.into(),
            ..Default::default()
        }))
    }

    fn line(e: kube::Error) -> String {
        let e = anyhow::Error::new(e).context("listing FabricTests");
        explain(e.chain()).expect("explained")
    }

    #[test]
    fn a_refused_connection_says_the_cluster_is_unreachable_in_one_line() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let l = line(kube::Error::Service(Box::new(io)));
        assert!(
            l.starts_with("cannot reach the cluster's API server (Connection refused)"),
            "{l}"
        );
        assert!(!l.contains("ServiceError") && !l.contains('\n'), "{l}");
    }

    #[test]
    fn forbidden_and_unauthorized_say_which_rights_or_login() {
        let l = line(status(403, "fabrictests.gpufabric.io is forbidden"));
        assert!(
            l.starts_with("not allowed: fabrictests.gpufabric.io is forbidden (403)"),
            "{l}"
        );
        assert!(l.contains("get and list on FabricTests"), "{l}");
        let l = line(status(401, "Unauthorized"));
        assert!(l.contains("log in again"), "{l}");
        // Other API errors are not rewritten (a 404 has its own exit code).
        let e = anyhow::Error::new(status(404, "not found"));
        assert_eq!(explain(e.chain()), None);
    }

    #[test]
    fn no_kubeconfig_says_where_one_is_looked_for() {
        let e = kube::Error::InferKubeconfig(kube::config::KubeconfigError::FindPath);
        let l = line(e);
        assert!(l.starts_with("no usable kubeconfig"), "{l}");
        assert!(
            l.contains("KUBECONFIG") && l.contains("--kubeconfig"),
            "{l}"
        );
    }
}
