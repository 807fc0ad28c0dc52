//! `kubectl gpufabric version`: the plugin's version, in the shape of `kubectl version`'s
//! client half (`clientVersion.gitVersion`), read with no cluster.

use crate::doc::Doc;
use crate::output::View;
use serde::Serialize;

/// What `version` shows.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Version {
    pub client_version: ClientVersion,
}

/// The plugin's build.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientVersion {
    /// `v` + the workspace version, the tag of its images and chart.
    pub git_version: String,
    /// `os/arch` as Go names them (krew's platform selectors).
    pub platform: String,
}

impl Version {
    /// This binary's version.
    pub fn current() -> Version {
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        Version {
            client_version: ClientVersion {
                git_version: format!("v{}", env!("CARGO_PKG_VERSION")),
                platform: format!("{}/{arch}", std::env::consts::OS),
            },
        }
    }
}

impl View for Version {
    fn doc(&self) -> Doc {
        let mut doc = Doc::default();
        doc.line(format!(
            "Client Version: {} ({})",
            self.client_version.git_version, self.client_version.platform
        ));
        doc
    }

    /// A version is about no object.
    fn names(&self) -> Vec<String> {
        Vec::new()
    }
}
