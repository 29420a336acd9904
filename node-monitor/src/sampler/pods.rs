//! Pods from the kubelet's cgroup layout under kubepods, and their disk usage.
//!
//! The walk lists kubepods and, one level down, every directory that is not itself a pod (the
//! QoS tiers of either driver); each name is classified by
//! [`parse_cgroup_path`](node_monitor_core::kubelet::layout::parse_cgroup_path), so the layout rules
//! live in one place. Names seen before are looked up, not parsed again: in steady state a walk
//! costs the `readdir` calls and one hash lookup per directory.

use std::{
    collections::HashMap,
    ffi::{CStr, CString},
    io,
    os::unix::ffi::OsStrExt as _,
    path::PathBuf,
};

use node_monitor_core::kubelet::layout::parse_cgroup_path;

use super::{SamplerError, config::Layout, read::CgroupFiles};

/// A pod's cgroup directories and its last measured disk usage.
#[derive(Debug)]
pub(crate) struct PodEntry {
    pub uid: String,
    /// The pod cgroup in the memory hierarchy.
    pub memory_dir: PathBuf,
    /// The pod cgroup in the pids hierarchy (v1) or the same directory (v2).
    pub pids_dir: Option<PathBuf>,
    /// Local volumes + logs + writable layers, from the last full sample.
    pub disk: Option<super::disk::PodDisk>,
    /// Whether this pod's files are kept open (within the descriptor budget).
    pub keep_files: bool,
    pub files: CgroupFiles,
    seen: u64,
}

#[derive(Debug, Default)]
pub(crate) struct PodTable {
    /// Pods whose files may be kept open, and how many are.
    keep_limit: usize,
    kept: usize,
    /// Keyed by pod UID.
    pods: HashMap<String, PodEntry>,
    /// Pod directories by their path below kubepods (`burstable/pod<uid>`,
    /// `kubepods-pod<uid_>.slice`, …), to their pod UID.
    dirs: HashMap<String, String>,
    /// Directories that are not pods (QoS tiers), with the generation they were last seen in,
    /// so they are not parsed again on every pass.
    others: HashMap<String, u64>,
    generation: u64,
    key: String,
    layout_path: String,
    kubepods_c: Option<CString>,
    child_path: Vec<u8>,
}

/// Subdirectories of a directory, read with readdir(3) straight from the directory stream:
/// std's `read_dir` allocates a name per entry, and this walk runs on every wake-up.
struct DirIter {
    dir: std::ptr::NonNull<libc::DIR>,
}

impl DirIter {
    fn open(path: &CStr) -> io::Result<Self> {
        // SAFETY: `path` is a valid NUL-terminated string; opendir does not keep the pointer.
        let dir = unsafe { libc::opendir(path.as_ptr()) };
        std::ptr::NonNull::new(dir)
            .map(|dir| Self { dir })
            .ok_or_else(io::Error::last_os_error)
    }

    /// The next entry that is a directory (or of unknown type), without `.` and `..`. The name
    /// borrows the stream's buffer until the next call.
    fn next_dir(&mut self) -> Option<&CStr> {
        loop {
            // SAFETY: `self.dir` is an open stream owned by `self` (closed only in Drop), and
            // only this `&mut self` method reads from it.
            let ent = unsafe { libc::readdir(self.dir.as_ptr()) };
            if ent.is_null() {
                return None;
            }
            // SAFETY: a non-null readdir result points to a dirent that stays valid until the
            // next readdir/closedir on this stream; the returned borrow ends before either
            // (it is tied to `&mut self`). `d_name` is NUL-terminated.
            let (d_type, name) = unsafe {
                let ent = &*ent;
                (ent.d_type, CStr::from_ptr(ent.d_name.as_ptr()))
            };
            if d_type != libc::DT_DIR && d_type != libc::DT_UNKNOWN {
                continue;
            }
            let b = name.to_bytes();
            if b == b"." || b == b".." {
                continue;
            }
            return Some(name);
        }
    }
}

impl Drop for DirIter {
    fn drop(&mut self) {
        // SAFETY: the stream is open and closed exactly once, here.
        unsafe {
            libc::closedir(self.dir.as_ptr());
        }
    }
}

impl PodTable {
    pub fn keep_limit(&self) -> usize {
        self.keep_limit
    }

    pub fn new(keep_limit: usize) -> Self {
        Self {
            keep_limit,
            ..Self::default()
        }
    }

    /// Re-lists kubepods: adds new pod cgroups, drops the ones that disappeared. An error means
    /// kubepods itself could not be listed; the table is then left as it was.
    pub fn refresh(&mut self, layout: &Layout) -> Result<(), SamplerError> {
        let read_err = |source| SamplerError::Read {
            path: layout.kubepods_memory.clone(),
            source,
        };
        if self.kubepods_c.is_none() {
            let c = CString::new(layout.kubepods_memory.as_os_str().as_bytes())
                .map_err(|e| read_err(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
            self.kubepods_c = Some(c);
        }
        let Some(top_path) = self.kubepods_c.as_deref() else {
            return Ok(());
        };
        let mut top = DirIter::open(top_path).map_err(read_err)?;
        self.generation += 1;
        while let Some(name) = top.next_dir() {
            let Ok(name) = name.to_str() else { continue };
            self.key.clear();
            self.key.push_str(name);
            if self.visit(layout) {
                continue;
            }
            // Not a pod: a QoS tier (or something else); its children may be pods.
            self.child_path.clear();
            self.child_path
                .extend_from_slice(layout.kubepods_memory.as_os_str().as_bytes());
            self.child_path.push(b'/');
            self.child_path.extend_from_slice(name.as_bytes());
            self.child_path.push(0);
            let Ok(child_c) = CStr::from_bytes_with_nul(&self.child_path) else {
                continue;
            };
            let Ok(mut children) = DirIter::open(child_c) else {
                continue;
            };
            while let Some(cname) = children.next_dir() {
                let Ok(cname) = cname.to_str() else { continue };
                self.key.clear();
                self.key.push_str(name);
                self.key.push('/');
                self.key.push_str(cname);
                self.visit(layout);
            }
        }
        let generation = self.generation;
        let kept = &mut self.kept;
        self.pods.retain(|_, p| {
            let stays = p.seen == generation;
            if !stays && p.keep_files {
                *kept -= 1;
            }
            stays
        });
        let pods = &self.pods;
        self.dirs.retain(|_, uid| pods.contains_key(uid));
        self.others.retain(|_, seen| *seen == generation);
        Ok(())
    }

    /// Marks or adds the pod at `self.key`; false when the directory is not a pod cgroup.
    fn visit(&mut self, layout: &Layout) -> bool {
        if let Some(p) = self
            .dirs
            .get(self.key.as_str())
            .and_then(|uid| self.pods.get_mut(uid))
        {
            p.seen = self.generation;
            return true;
        }
        if let Some(seen) = self.others.get_mut(self.key.as_str()) {
            *seen = self.generation;
            return false;
        }
        self.layout_path.clear();
        self.layout_path.push('/');
        self.layout_path.push_str(&layout.kubepods_name);
        self.layout_path.push('/');
        self.layout_path.push_str(&self.key);
        match parse_cgroup_path(&self.layout_path) {
            Some(pod) if pod.container_id.is_none() => {
                let keep_files = self.kept < self.keep_limit;
                if keep_files {
                    self.kept += 1;
                }
                self.dirs.insert(self.key.clone(), pod.pod_uid.clone());
                self.pods.insert(
                    pod.pod_uid.clone(),
                    PodEntry {
                        uid: pod.pod_uid,
                        memory_dir: layout.kubepods_memory.join(&self.key),
                        pids_dir: layout.kubepods_pids.as_ref().map(|p| p.join(&self.key)),
                        disk: None,
                        keep_files,
                        files: CgroupFiles::default(),
                        seen: self.generation,
                    },
                );
                true
            }
            _ => {
                self.others.insert(self.key.clone(), self.generation);
                false
            }
        }
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut PodEntry> {
        self.pods.values_mut()
    }

    pub fn iter(&self) -> impl Iterator<Item = &PodEntry> {
        self.pods.values()
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn contains_uid(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
    }
}

#[cfg(test)]
mod tests;
