//! Where NCCL looks for its config files on this host: the user's home as NCCL finds it
//! (the password database's entry for the process's user, never `$HOME`).

use std::ffi::{CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// The home directory NCCL reads `.nccl.conf` from: `getpwuid(getuid())->pw_dir`, as NCCL's
/// `userHomeDir` does. None when the user has no entry (a container's numeric user often
/// has none): NCCL then reads no user config file.
pub fn user_home() -> Option<PathBuf> {
    // SAFETY: getuid cannot fail and touches no memory of ours.
    let uid = unsafe { libc::getuid() };
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: passwd is plain old data; zeroed is a valid (empty) value of it.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is to memory owned here and valid for the call; `buf.len()`
        // is the size of the buffer the strings of `entry` are written into.
        let rc = unsafe {
            libc::getpwuid_r(
                uid,
                &mut entry,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut found,
            )
        };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 || found.is_null() || entry.pw_dir.is_null() {
            return None;
        }
        // SAFETY: on success pw_dir points to a NUL-terminated string inside `buf`, which
        // lives until the end of this function.
        let dir = unsafe { CStr::from_ptr(entry.pw_dir) };
        return Some(PathBuf::from(OsStr::from_bytes(dir.to_bytes())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_home_is_the_password_files_entry_for_this_user() {
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        let from_file = std::fs::read_to_string("/etc/passwd")
            .ok()
            .and_then(|text| {
                text.lines().find_map(|l| {
                    let f: Vec<&str> = l.split(':').collect();
                    (f.len() >= 7 && f[2] == uid.to_string()).then(|| PathBuf::from(f[5]))
                })
            });
        // Where the user is in /etc/passwd (every machine these tests run on), both agree;
        // a user known only to another database is not compared.
        if let Some(expected) = from_file {
            assert_eq!(user_home(), Some(expected));
        }
    }
}
