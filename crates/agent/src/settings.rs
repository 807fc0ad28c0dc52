//! The NCCL tuning settings in effect and where each came from, read the way NCCL reads
//! them: the process environment first, then `NCCL_CONF_FILE` (else `.nccl.conf` in the
//! user's home as NCCL finds it, the password database's, not `$HOME`), then
//! `/etc/nccl.conf`; the first to set a variable wins. NCCL copies its files' variables into
//! the process environment when it starts, so they are read before any NCCL call
//! ([`in_effect`] at the agent's start), or a file's setting would read as the pod's env. Only the variables the operator names
//! in `FABRIC_SPEC_ENV` (those the FabricTest's `spec.agent.env` sets) are the test's own.
//! The files' digest is what a node's NCCL configuration is compared with its run's by.

use gpufabric_api::keys;
use gpufabric_api::result::{NO_CONF_FILE, NcclSetting, SettingSource};
use gpufabric_health::evaluate::tuning::NCCL_TUNING;
use std::path::{Path, PathBuf};

/// NCCL's system-wide config file.
pub const SYSTEM_CONF: &str = "/etc/nccl.conf";

/// The settings in effect for this process (its environment, the user's `.nccl.conf` and
/// [`SYSTEM_CONF`]). Call it before NCCL runs in this process.
pub fn in_effect() -> Vec<NcclSetting> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let home = gpufabric_measure::nccl_env::user_home();
    in_effect_from(&env, home.as_deref(), Path::new(SYSTEM_CONF))
}

/// The tuning settings ([`NCCL_TUNING`]) that `env`, the user's config file (the one
/// `NCCL_CONF_FILE` names, else `.nccl.conf` in `home`) and `system_conf` give NCCL, sorted
/// by name, each from the first source that sets it.
pub fn in_effect_from(
    env: &[(String, String)],
    home: Option<&Path>,
    system_conf: &Path,
) -> Vec<NcclSetting> {
    let var = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let spec = spec_names(var(keys::ENV_SPEC_ENV).unwrap_or(""));
    let mut sources: Vec<(SettingSource, Vec<(String, String)>)> = Vec::new();
    sources.push((
        SettingSource::PodEnv,
        env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    ));
    match var("NCCL_CONF_FILE").filter(|p| !p.is_empty()) {
        Some(path) => sources.push((
            SettingSource::ConfFile(path.to_string()),
            read_conf(Path::new(path)),
        )),
        None => {
            if let Some(home) = home {
                sources.push((SettingSource::UserConf, read_conf(&home.join(".nccl.conf"))));
            }
        }
    }
    sources.push((SettingSource::SystemConf, read_conf(system_conf)));

    let mut out: Vec<NcclSetting> = Vec::new();
    for (source, vars) in sources {
        for (name, value) in vars {
            if !NCCL_TUNING.contains(&name.as_str()) || out.iter().any(|s| s.name == name) {
                continue;
            }
            let source = match source {
                SettingSource::PodEnv if spec.contains(&name.as_str()) => SettingSource::Spec,
                ref other => other.clone(),
            };
            out.push(NcclSetting {
                name,
                value,
                source,
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The digest of the NCCL config files in effect for this process ([`conf_digest_from`]).
pub fn conf_digest() -> String {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let home = gpufabric_measure::nccl_env::user_home();
    conf_digest_from(&env, home.as_deref(), Path::new(SYSTEM_CONF))
}

/// The digest of the config files NCCL reads, in its order (the file `NCCL_CONF_FILE`
/// names, else `.nccl.conf` in `home`, then `system_conf`): the first 16 hex digits of the
/// SHA-256 of each existing file's place and bytes, or [`NO_CONF_FILE`] when none exists.
/// Two nodes with the same files in the same places have the same digest, whatever the
/// path `NCCL_CONF_FILE` gives; a file that cannot be read counts by its error.
pub fn conf_digest_from(
    env: &[(String, String)],
    home: Option<&Path>,
    system_conf: &Path,
) -> String {
    let var = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let user = match var("NCCL_CONF_FILE").filter(|p| !p.is_empty()) {
        Some(path) => Some(PathBuf::from(path)),
        None => home.map(|h| h.join(".nccl.conf")),
    };
    let places = [("user", user), ("system", Some(system_conf.to_path_buf()))];
    let mut hashed: Vec<u8> = Vec::new();
    for (place, path) in places {
        let Some(path) = path else { continue };
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => format!("unreadable: {:?}", e.kind()).into_bytes(),
        };
        hashed.extend_from_slice(format!("{place} {}\n", bytes.len()).as_bytes());
        hashed.extend_from_slice(&bytes);
    }
    if hashed.is_empty() {
        return NO_CONF_FILE.to_string();
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, &hashed);
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The names in a `FABRIC_SPEC_ENV` value: comma-separated, blanks ignored.
fn spec_names(list: &str) -> Vec<&str> {
    list.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect()
}

/// The variables of an NCCL config file: `KEY=VALUE` lines, `#` starting a comment line;
/// none when the file is missing. An unreadable file is said on stderr and read as empty.
fn read_conf(path: &Path) -> Vec<(String, String)> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse_conf(&text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            eprintln!(
                "fabric-agent: cannot read NCCL config file {}: {e}; the settings NCCL may take from it are not reported",
                path.display()
            );
            Vec::new()
        }
    }
}

/// NCCL's config file format: one `KEY=VALUE` a line; lines starting with `#` and lines
/// without `=` are skipped.
fn parse_conf(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn found(s: &[NcclSetting]) -> Vec<(String, String, SettingSource)> {
        s.iter()
            .map(|s| (s.name.clone(), s.value.clone(), s.source.clone()))
            .collect()
    }

    #[test]
    fn only_the_variables_the_spec_names_are_the_tests_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = env(&[
            ("NCCL_ALGO", "Ring"),
            ("NCCL_P2P_DISABLE", "1"),
            ("NCCL_DEBUG", "INFO"),
            ("PATH", "/bin"),
            (keys::ENV_SPEC_ENV, "NCCL_DEBUG, NCCL_ALGO"),
        ]);
        let s = in_effect_from(&e, Some(dir.path()), &dir.path().join("none.conf"));
        assert_eq!(
            found(&s),
            [
                ("NCCL_ALGO".into(), "Ring".into(), SettingSource::Spec),
                ("NCCL_P2P_DISABLE".into(), "1".into(), SettingSource::PodEnv),
            ]
        );
    }

    #[test]
    fn without_the_spec_list_every_env_setting_is_one_nobody_chose() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = env(&[("NCCL_MAX_NCHANNELS", "2")]);
        let s = in_effect_from(&e, None, &dir.path().join("none.conf"));
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].source, SettingSource::PodEnv);
    }

    #[test]
    fn the_files_nccl_reads_are_sources_and_the_env_wins_over_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join(".nccl.conf"),
            "# site tuning\nNCCL_PROTO=Simple\nNCCL_ALGO = Tree\nnot a setting\n",
        )
        .expect("write");
        let system = dir.path().join("nccl.conf");
        std::fs::write(
            &system,
            "NCCL_PROTO=LL\nNCCL_BUFFSIZE=65536\n#NCCL_IB_DISABLE=1\n",
        )
        .expect("write");
        let e = env(&[("NCCL_ALGO", "Ring")]);
        let s = in_effect_from(&e, Some(dir.path()), &system);
        assert_eq!(
            found(&s),
            [
                ("NCCL_ALGO".into(), "Ring".into(), SettingSource::PodEnv),
                (
                    "NCCL_BUFFSIZE".into(),
                    "65536".into(),
                    SettingSource::SystemConf
                ),
                (
                    "NCCL_PROTO".into(),
                    "Simple".into(),
                    SettingSource::UserConf
                ),
            ]
        );
    }

    #[test]
    fn nccl_conf_file_replaces_the_users_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(".nccl.conf"), "NCCL_PROTO=Simple\n").expect("write");
        let named = dir.path().join("site.conf");
        std::fs::write(&named, "NCCL_P2P_DISABLE=1\n").expect("write");
        let path = named.display().to_string();
        let e = env(&[("NCCL_CONF_FILE", path.as_str())]);
        let s = in_effect_from(&e, Some(dir.path()), &dir.path().join("none.conf"));
        assert_eq!(
            found(&s),
            [(
                "NCCL_P2P_DISABLE".into(),
                "1".into(),
                SettingSource::ConfFile(path.clone())
            )]
        );
    }

    #[test]
    fn the_digest_follows_the_files_contents_not_the_path_nccl_conf_file_gives() {
        let dir = tempfile::tempdir().expect("tempdir");
        let none = dir.path().join("none.conf");
        assert_eq!(conf_digest_from(&[], Some(dir.path()), &none), NO_CONF_FILE);

        let a = dir.path().join("a.conf");
        let b = dir.path().join("b.conf");
        std::fs::write(&a, "NCCL_PROTO=Simple\n").expect("write");
        std::fs::write(&b, "NCCL_PROTO=Simple\n").expect("write");
        let named = |p: &Path| env(&[("NCCL_CONF_FILE", p.to_str().expect("utf-8"))]);
        let da = conf_digest_from(&named(&a), None, &none);
        assert_eq!(da.len(), 16);
        assert_eq!(da, conf_digest_from(&named(&b), None, &none));

        std::fs::write(&b, "NCCL_PROTO=LL\n").expect("write");
        assert_ne!(da, conf_digest_from(&named(&b), None, &none));
        // The same file as the system's is another configuration than as the user's.
        assert_ne!(da, conf_digest_from(&[], None, &a));
    }

    #[test]
    fn a_config_file_is_never_the_tests_own_even_for_a_name_the_spec_sets() {
        let dir = tempfile::tempdir().expect("tempdir");
        let system = dir.path().join("nccl.conf");
        std::fs::write(&system, "NCCL_ALGO=Tree\n").expect("write");
        // The spec lists NCCL_ALGO but the pod env lost it: the file's value is in effect.
        let e = env(&[(keys::ENV_SPEC_ENV, "NCCL_ALGO")]);
        let s = in_effect_from(&e, None, &system);
        assert_eq!(s[0].source, SettingSource::SystemConf);
    }
}
