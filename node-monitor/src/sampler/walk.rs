//! The disk walks of pod directories: a bounded walk of a tree's bytes and inodes, and the pod
//! log directories under `/var/log/pods`.
use std::{
    collections::{HashMap, HashSet},
    fs, io,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use super::SamplerError;

/// Pod log directories under `/var/log/pods` (`<namespace>_<name>_<uid>`), by UID.
pub(crate) fn pod_log_dirs(root: &Path) -> HashMap<String, PathBuf> {
    let mut out = HashMap::new();
    let Ok(rd) = fs::read_dir(root) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        if let Some(uid) = name.to_str().and_then(super::parse::pod_log_dir_uid) {
            out.insert(uid.to_owned(), e.path());
        }
    }
    out
}

/// What a bounded walk of one directory tree found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DiskWalk {
    /// Allocated bytes of what was walked.
    pub bytes: u64,
    /// Inodes of what was walked: the root, and every file, directory and symlink below it on
    /// its filesystem, hard links once (the kubelet's `fs.DiskUsage` count).
    pub inodes: u64,
    /// `false` when the walk stopped at its entry budget: `bytes` is then a lower bound.
    pub complete: bool,
}

/// Disk usage of `root` in bytes (allocated blocks, as `du` and the kubelet's volume metrics
/// count them) and in inodes (counted on the same pass: no extra system call), without crossing into other filesystems: memory-backed volumes (tmpfs
/// emptyDir, secrets) and mounted persistent volumes are not local ephemeral storage on nodefs.
/// Hard links are counted once. `Ok(None)` when `root` does not exist. The walk stops after
/// `budget` entries, so one pod with millions of files cannot stall the meter; what it counted
/// so far is kept as a lower bound (a pod cannot hide its usage behind many small files).
pub(crate) fn disk_usage(
    root: &Path,
    budget: u64,
    inodes: &mut HashSet<(u64, u64)>,
) -> Result<Option<DiskWalk>, SamplerError> {
    disk_usage_skipping(root, budget, inodes, |_| false)
}

/// [`disk_usage`] without the directories `skip` names (neither they nor what is below them is
/// counted), for a caller that measures them apart.
pub(crate) fn disk_usage_skipping(
    root: &Path,
    budget: u64,
    inodes: &mut HashSet<(u64, u64)>,
    skip: impl Fn(&Path) -> bool,
) -> Result<Option<DiskWalk>, SamplerError> {
    let meta = match fs::symlink_metadata(root) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(SamplerError::Read {
                path: root.to_path_buf(),
                source,
            });
        }
    };
    let dev = meta.dev();
    let mut total = meta.blocks().saturating_mul(512);
    let mut counted = 1u64;
    let mut walked = 0u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        // A directory that vanished mid-walk (log rotation, volume teardown) is skipped.
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            walked += 1;
            if walked > budget {
                return Ok(Some(DiskWalk {
                    bytes: total,
                    inodes: counted,
                    complete: false,
                }));
            }
            let Ok(m) = e.metadata() else { continue };
            if m.dev() != dev {
                continue;
            }
            if m.is_dir() {
                let path = e.path();
                if skip(&path) {
                    continue;
                }
                stack.push(path);
            } else if m.nlink() > 1 && !inodes.insert((m.dev(), m.ino())) {
                continue;
            }
            total = total.saturating_add(m.blocks().saturating_mul(512));
            counted += 1;
        }
    }
    Ok(Some(DiskWalk {
        bytes: total,
        inodes: counted,
        complete: true,
    }))
}
