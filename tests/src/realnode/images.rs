//! Images without a registry: the node's pause image and a small test image, both made of
//! Debian's busybox-static, written as OCI archives by `deploy/images/oci.py` and imported
//! into the node's containerd with `ctr images import`.

use crate::{Error, Result, io_err, workspace_root};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The pod sandbox image: `/pause`, a shell script that sleeps until SIGTERM.
pub const PAUSE_IMAGE: &str = "docker.io/local/pause:1";
/// A test image: busybox-static with every applet on `/bin` (sh, sleep, echo, cat,
/// httpd, wget, nc, ...); entrypoint `/bin/sh`. Pods name it in full (or as
/// `local/busybox:1`, which the kubelet expands to this) with `imagePullPolicy: Never` or
/// `IfNotPresent`: there is no registry to pull from.
pub const BUSYBOX_IMAGE: &str = "docker.io/local/busybox:1";

/// The pause program: PID 1 of every pod sandbox. A shell ignores SIGTERM as PID 1 unless
/// it traps it, so it does, and exits at once.
const PAUSE_SCRIPT: &str = "#!/bin/sh\n\
# The pod sandbox of the gpufabric test node: sleeps until told to stop.\n\
trap 'exit 0' TERM INT\n\
while :; do sleep 3600 & wait $!; done\n";

/// A root filesystem of busybox at `dir`: `/bin/busybox`, a link on `/bin` for each of its
/// applets, `/pause`, and empty `/tmp`, `/etc`, `/proc`, `/sys`, `/dev`.
fn write_rootfs(busybox: &Path, dir: &Path) -> Result<()> {
    let bin = dir.join("bin");
    for d in ["bin", "etc", "tmp", "proc", "sys", "dev"] {
        std::fs::create_dir_all(dir.join(d))
            .map_err(io_err(format!("creating {d} in the image")))?;
    }
    std::fs::copy(busybox, bin.join("busybox"))
        .map_err(io_err(format!("copying {}", busybox.display())))?;
    let out = Command::new(busybox)
        .arg("--list")
        .output()
        .map_err(io_err(format!("running {} --list", busybox.display())))?;
    for applet in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if applet == "busybox" || applet.contains('/') {
            continue;
        }
        std::os::unix::fs::symlink("busybox", bin.join(applet))
            .map_err(io_err(format!("linking /bin/{applet} in the image")))?;
    }
    let pause = dir.join("pause");
    std::fs::write(&pause, PAUSE_SCRIPT).map_err(io_err("writing /pause"))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&pause, std::fs::Permissions::from_mode(0o755))
        .map_err(io_err("making /pause executable"))?;
    Ok(())
}

/// Writes the pause and busybox image archives into `dir`: `(pause.tar, busybox.tar)`.
pub(crate) fn write_archives(busybox: &Path, dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let rootfs = dir.join("rootfs");
    write_rootfs(busybox, &rootfs)?;
    let oci = workspace_root().join("deploy/images/oci.py");
    let pause = dir.join("pause.tar");
    let busybox_tar = dir.join("busybox.tar");
    for (reference, entrypoint, out) in [
        (PAUSE_IMAGE, "/pause", &pause),
        (BUSYBOX_IMAGE, "/bin/sh", &busybox_tar),
    ] {
        let result = Command::new("python3")
            .arg(&oci)
            .arg("--rootfs")
            .arg(&rootfs)
            .args(["--ref", reference, "--entrypoint", entrypoint])
            .args(["--mode", "tmp=1777"])
            .arg("--out")
            .arg(out)
            .output()
            .map_err(io_err(format!("running python3 {}", oci.display())))?;
        if !result.status.success() {
            return Err(Error::Invalid(format!(
                "{} could not write the {reference} image: {}",
                oci.display(),
                String::from_utf8_lossy(&result.stderr).trim()
            )));
        }
    }
    Ok((pause, busybox_tar))
}

/// The references `ctr images import` says it unpacked (`unpacking REF (sha256:...)`).
pub(crate) fn imported_refs(ctr_stdout: &str) -> Vec<String> {
    ctr_stdout
        .lines()
        .filter_map(|l| l.trim().strip_prefix("unpacking "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn import_output_names_the_full_references() {
        let out = "unpacking docker.io/local/pause:1 (sha256:d7e2f0)...done\n\
                   unpacking ghcr.io/gpufabric/fabric-agent:v0.1.0 (sha256:1234)...done\n";
        assert_eq!(
            imported_refs(out),
            vec![
                "docker.io/local/pause:1".to_string(),
                "ghcr.io/gpufabric/fabric-agent:v0.1.0".to_string()
            ]
        );
    }
}
