//! Container writable layers, found without a CRI client.
//!
//! The kubelet counts each container's writable layer (CRI `rootfs` usage) in the pod's
//! ephemeral-storage usage. The runtime's overlay mount says where that layer lives: a process of
//! the container sees its root (`/`) as an `overlay` whose super options hold
//! `upperdir=<path>` (containerd: `…/io.containerd.snapshotter.v1.overlayfs/snapshots/<id>/fs`,
//! CRI-O: `…/containers/storage/overlay/<id>/diff`). The meter takes one process of each
//! container cgroup (`cgroup.procs`), reads its `mountinfo` through the proc root, and walks the
//! upper directory like the pod's other trees.
//!
//! The mount table of a container is the tenant's to change (with CAP_SYS_ADMIN in its own mount
//! namespace), so an upper directory is walked only when it lies under one of the configured
//! roots (the runtimes' storage directories): a crafted mount cannot point the agent's walk at
//! anything else. A container cgroup's upper directory is looked up once and cached until the
//! cgroup disappears.

use std::{
    collections::{HashMap, HashSet},
    ffi::OsStr,
    fs,
    os::unix::ffi::OsStrExt as _,
    path::{Component, Path, PathBuf},
};

use super::parse::ParseError;
use crate::io::read_proc_bounded;

/// The most of a container's `cgroup.procs` or a process's `mountinfo` read (a few KiB each on
/// a real node).
const MAX_PROC_FILE: u64 = 4 * 1024 * 1024;

/// What a process's root mount is, from its `mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RootLayer {
    /// An overlay with this upper (writable) directory.
    Upper(PathBuf),
    /// An overlay without `upperdir` (read-only).
    NoUpperdir,
    /// Not an overlay (a VM-based runtime, a chroot on a plain filesystem, …).
    NotOverlay { fstype: String },
    /// No mount at `/` (the process's root is not a mount point).
    NoRoot,
}

/// Undoes the kernel's octal escapes (`\040` for a space, `\011`, `\012`, `\134`, and `\054` for
/// a comma in overlay options). A backslash not followed by three octal digits is kept as is.
pub(crate) fn unescape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\'
            && i + 3 < s.len()
            && s[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = s[i + 1..i + 4]
                .iter()
                .fold(0u32, |a, c| a * 8 + u32::from(c - b'0'));
            if let Ok(b) = u8::try_from(v) {
                out.push(b);
                i += 4;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    out
}

fn invalid(line: &[u8]) -> ParseError {
    ParseError::Invalid {
        field: "mountinfo line",
        value: String::from_utf8_lossy(line).chars().take(64).collect(),
    }
}

/// The root mount of a `mountinfo` (proc(5)): `id parent maj:min root mountpoint options
/// [optional fields…] - fstype source superoptions`. When several mounts sit on `/`, the last
/// (the one on top) is the root. A line without the `-` separator or its three trailing fields
/// is an error naming the line.
pub(crate) fn root_layer(mountinfo: &[u8]) -> Result<RootLayer, ParseError> {
    let mut root = None;
    for line in mountinfo.split(|&b| b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
        let sep = fields
            .iter()
            .skip(6)
            .position(|f| *f == b"-")
            .map(|p| p + 6)
            .ok_or_else(|| invalid(line))?;
        let (Some(fstype), Some(_source), Some(supers)) = (
            fields.get(sep + 1),
            fields.get(sep + 2),
            fields.get(sep + 3),
        ) else {
            return Err(invalid(line));
        };
        if unescape(fields[4]) == b"/" {
            root = Some((*fstype, *supers));
        }
    }
    let Some((fstype, supers)) = root else {
        return Ok(RootLayer::NoRoot);
    };
    if fstype != b"overlay" {
        return Ok(RootLayer::NotOverlay {
            fstype: String::from_utf8_lossy(fstype).into_owned(),
        });
    }
    // Overlay escapes commas inside option values, so a comma always separates options.
    let upper = supers
        .split(|&b| b == b',')
        .filter_map(|o| o.strip_prefix(b"upperdir="))
        .next_back();
    Ok(match upper {
        Some(u) => RootLayer::Upper(PathBuf::from(OsStr::from_bytes(&unescape(u)))),
        None => RootLayer::NoUpperdir,
    })
}

/// Whether `upper` is a directory strictly below one of `roots`, by its components: absolute,
/// with no `.` or `..` component (so it cannot climb out of a root).
pub(crate) fn allowed_upper(upper: &Path, roots: &[PathBuf]) -> bool {
    upper.is_absolute()
        && !upper
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
        && roots.iter().any(|r| upper.starts_with(r) && upper != r)
}

/// The pids of a `cgroup.procs`: `(visible, hidden)` where hidden counts the `0` entries the
/// kernel writes for processes outside the reader's pid namespace (cgroup v2).
fn procs(text: &[u8]) -> (Vec<u32>, usize) {
    let mut visible = Vec::new();
    let mut hidden = 0;
    for l in text.split(|&b| b == b'\n') {
        match std::str::from_utf8(l)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        {
            Some(0) => hidden += 1,
            Some(p) => visible.push(p),
            None => {}
        }
    }
    (visible, hidden)
}

/// The container ID a container cgroup's directory name carries: the name itself (cgroupfs
/// driver) or the part after the runtime's prefix (`cri-containerd-<id>.scope`,
/// `crio-<id>.scope`, `docker-<id>.scope` with the systemd driver).
pub(crate) fn container_id_of(cgroup_name: &str) -> &str {
    let name = cgroup_name.strip_suffix(".scope").unwrap_or(cgroup_name);
    name.rsplit('-').next().unwrap_or(name)
}

/// `pod/container`: the last two components of a cgroup path, which name a container cgroup
/// whatever the reader's cgroup namespace makes of the prefix.
fn container_key(path: &Path) -> Option<String> {
    let mut c = path.components().rev();
    let container = c.next()?.as_os_str().to_str()?;
    let pod = c.next()?.as_os_str().to_str()?;
    Some(format!("{pod}/{container}"))
}

/// Per container cgroup: its upper directory once found, cached while the cgroup exists.
#[derive(Debug)]
pub(crate) struct LayerCache {
    proc_root: PathBuf,
    /// The allowed roots as configured and as resolved on this host (symlinks followed).
    roots: Vec<PathBuf>,
    /// Container cgroup directory → upper directory (`None`: the container has no writable
    /// layer we may walk; not looked up again).
    upper: HashMap<PathBuf, Option<PathBuf>>,
    seen: HashSet<PathBuf>,
    /// Container cgroup (`pod/container`) → one of its pids, from a scan of the proc root; built
    /// at most once per pass, when some container shows no pid in `cgroup.procs`.
    scan: Option<HashMap<String, u32>>,
}

impl LayerCache {
    pub fn new(proc_root: PathBuf, roots: &[PathBuf]) -> Self {
        let mut all = roots.to_vec();
        for r in roots {
            if let Ok(c) = fs::canonicalize(r)
                && !all.contains(&c)
            {
                all.push(c);
            }
        }
        Self {
            proc_root,
            roots: all,
            upper: HashMap::new(),
            seen: HashSet::new(),
            scan: None,
        }
    }

    /// Forgets the container cgroups not asked about since the last call, and the proc scan.
    pub fn end_pass(&mut self) {
        let seen = std::mem::take(&mut self.seen);
        self.upper.retain(|k, _| seen.contains(k));
        self.scan = None;
    }

    /// The upper directories of the containers of the pod whose cgroup is `pod_cgroup`, each
    /// with the name of its container's cgroup directory.
    pub fn upper_dirs(&mut self, pod_cgroup: &Path) -> Vec<(String, PathBuf)> {
        if self.roots.is_empty() {
            return Vec::new();
        }
        let Ok(rd) = fs::read_dir(pod_cgroup) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in rd.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let dir = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            self.seen.insert(dir.clone());
            let upper = match self.upper.get(&dir) {
                Some(u) => u.clone(),
                None => match self.look_up(&dir) {
                    Some(u) => {
                        self.upper.insert(dir, u.clone());
                        u
                    }
                    None => None,
                },
            };
            out.extend(upper.map(|u| (name, u)));
        }
        out
    }

    /// `Some(answer)` to cache; `None` when the container has no process to ask yet.
    fn look_up(&mut self, container: &Path) -> Option<Option<PathBuf>> {
        let text = read_proc_bounded(&container.join("cgroup.procs"), MAX_PROC_FILE)
            .ok()
            .flatten()?;
        let (visible, _hidden) = procs(&text);
        // No visible pid: hidden (`0` entries, cgroup v2) or left out altogether (cgroup v1,
        // which omits processes outside the reader's pid namespace), or no process yet; the
        // proc root's scan, at most once per pass, tells them apart.
        let pid = match visible.iter().min() {
            Some(&p) => p,
            None => self.scanned_pid(container)?,
        };
        // A tenant decides how many mounts its process has: read a bounded prefix only, and
        // count no layer for a process whose mount table is longer.
        let mountinfo = read_proc_bounded(
            &self.proc_root.join(pid.to_string()).join("mountinfo"),
            MAX_PROC_FILE,
        )
        .ok()
        .flatten()?;
        match root_layer(&mountinfo) {
            Ok(RootLayer::Upper(u)) => {
                let resolved = fs::canonicalize(&u).ok()?;
                if allowed_upper(&u, &self.roots) && allowed_upper(&resolved, &self.roots) {
                    Some(Some(resolved))
                } else {
                    tracing::warn!(
                        container = %container.display(),
                        upperdir = %u.display(),
                        "sampler: writable layer outside the allowed roots; not counted"
                    );
                    Some(None)
                }
            }
            Ok(other) => {
                // Once per container and agent start; at trace level, as a node of hundreds of
                // such containers would otherwise log hundreds of lines at once.
                tracing::trace!(container = %container.display(), root = ?other,
                    "sampler: container root is not an overlay with an upper directory");
                Some(None)
            }
            Err(e) => {
                tracing::debug!(container = %container.display(), error = %e,
                    "sampler: unreadable mountinfo");
                None
            }
        }
    }

    /// A pid of `container` from the proc root's `<pid>/cgroup` files, for an agent whose pid
    /// namespace hides the containers' processes from `cgroup.procs` (the proc root is the
    /// host's): as `0` entries on cgroup v2, left out on cgroup v1.
    fn scanned_pid(&mut self, container: &Path) -> Option<u32> {
        let key = container_key(container)?;
        let proc_root = &self.proc_root;
        let scan = self.scan.get_or_insert_with(|| scan_proc(proc_root));
        scan.get(&key).copied()
    }
}

fn scan_proc(proc_root: &Path) -> HashMap<String, u32> {
    let mut out = HashMap::new();
    let Ok(rd) = fs::read_dir(proc_root) else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(text) = fs::read(e.path().join("cgroup")) else {
            continue;
        };
        for line in text.split(|&b| b == b'\n') {
            // `id:controllers:path`; the path may itself hold colons.
            let Some(path) = line.splitn(3, |&b| b == b':').nth(2) else {
                continue;
            };
            if let Some(k) = container_key(Path::new(OsStr::from_bytes(path))) {
                out.entry(k)
                    .and_modify(|p: &mut u32| *p = (*p).min(pid))
                    .or_insert(pid);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
