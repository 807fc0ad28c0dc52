//! The NCCL tuning settings in effect during a check, each with where it came from: only
//! those the FabricTest's `spec.agent.env` set are the test's own.

use serde::{Deserialize, Serialize};

/// One NCCL setting in effect, as NCCL would read it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NcclSetting {
    pub name: String,
    pub value: String,
    pub source: SettingSource,
}

/// Where a setting reached NCCL from. NCCL takes a variable from the process environment
/// first, then from `NCCL_CONF_FILE` (else `~/.nccl.conf`), then from `/etc/nccl.conf`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum SettingSource {
    /// The pod env, set by the FabricTest's `spec.agent.env` (named in `FABRIC_SPEC_ENV`).
    Spec,
    /// The pod env, not set by the spec: an image, a mutating webhook, a CDI hook, a
    /// kubelet or a shell brought it.
    PodEnv,
    /// The file `NCCL_CONF_FILE` names.
    ConfFile(String),
    /// `~/.nccl.conf` of the agent's user.
    UserConf,
    /// `/etc/nccl.conf`.
    SystemConf,
}

impl SettingSource {
    /// Whether the test chose the setting: only the spec's settings are.
    pub fn chosen(&self) -> bool {
        matches!(self, SettingSource::Spec)
    }
}

impl std::fmt::Display for SettingSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SettingSource::Spec => f.write_str("the spec's agent env"),
            SettingSource::PodEnv => f.write_str("pod env not set by the spec"),
            SettingSource::ConfFile(path) => write!(f, "NCCL_CONF_FILE {path}"),
            SettingSource::UserConf => f.write_str("~/.nccl.conf"),
            SettingSource::SystemConf => f.write_str("/etc/nccl.conf"),
        }
    }
}

impl std::fmt::Display for NcclSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={} from {}", self.name, self.value, self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_source_names_itself_in_words_a_reader_can_follow() {
        let s = NcclSetting {
            name: "NCCL_P2P_DISABLE".into(),
            value: "1".into(),
            source: SettingSource::ConfFile("/opt/nccl.conf".into()),
        };
        assert_eq!(
            s.to_string(),
            "NCCL_P2P_DISABLE=1 from NCCL_CONF_FILE /opt/nccl.conf"
        );
        assert_eq!(
            SettingSource::PodEnv.to_string(),
            "pod env not set by the spec"
        );
        assert!(SettingSource::Spec.chosen());
        assert!(!SettingSource::SystemConf.chosen());
    }

    #[test]
    fn a_setting_reads_back_as_written() {
        let s = NcclSetting {
            name: "NCCL_ALGO".into(),
            value: "Tree".into(),
            source: SettingSource::UserConf,
        };
        let text = serde_json::to_string(&s).expect("json");
        assert_eq!(
            text,
            r#"{"name":"NCCL_ALGO","value":"Tree","source":"userConf"}"#
        );
        assert_eq!(
            serde_json::from_str::<NcclSetting>(&text).expect("parse"),
            s
        );
    }
}
