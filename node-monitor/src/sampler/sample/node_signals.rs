//! The node's signals: memory (node and kubepods cgroups), the filesystems, PIDs.
use node_monitor_core::signals::{self, MemoryStatFigures};

use super::*;

impl Sampler {
    pub(super) fn read_node_memory(
        &mut self,
        mem_total: u64,
    ) -> Result<MemoryReading, SamplerError> {
        let l = &self.layout;
        let files = &mut self.files.node;
        let (capacity, unbounded) = if l.node_is_root {
            // The kubelet's capacity for the root: MemTotal (node.status.capacity[memory]).
            (mem_total, false)
        } else {
            let limit = read_limit(&mut self.reader, files, l.version, &l.node_memory)?;
            (
                compute::cgroup_capacity(limit, mem_total),
                !compute::limit_binds(limit, mem_total),
            )
        };
        let mode = self.config.memory_working_set;
        let figures = if unbounded {
            // Memory outside the node cgroup is not available to its pods: the machine's working
            // set, as the kubelet reads it for the root.
            read_usage(
                &mut self.reader,
                &mut self.files.machine,
                l.version,
                &self.machine_memory,
                true,
                mode,
            )?
        } else {
            read_usage(
                &mut self.reader,
                files,
                l.version,
                &l.node_memory,
                l.node_is_root,
                mode,
            )?
        };
        if self.node_unbounded != Some(unbounded) && !l.node_is_root {
            // A limit of none or at least MemTotal leaves the node cgroup's pods the machine's
            // memory, shared with everything outside it.
            tracing::info!(
                node = %l.node_memory.display(),
                limit_binds = !unbounded,
                working_set_of = if unbounded { "machine" } else { "node cgroup" },
                "sampler: memory.available source"
            );
        }
        self.node_unbounded = Some(unbounded);
        Ok(reading(capacity, mode, &figures))
    }

    pub(super) fn read_kubepods_memory(&mut self) -> Result<MemoryReading, SamplerError> {
        let l = &self.layout;
        let dir = &l.kubepods_memory;
        let files = &mut self.files.kubepods;
        let mode = self.config.memory_working_set;
        let figures = read_usage(&mut self.reader, files, l.version, dir, false, mode)?;
        // The kubelet's capacity for allocatableMemory.available is the pods cgroup's limit
        // (cadvisor `AvailableBytes = limit − workingSet` for the "pods" system container);
        // a configured allocatable (the Node's status.allocatable) takes precedence.
        let capacity = match self.config.allocatable_memory {
            Some(a) => a,
            None => match read_limit(&mut self.reader, files, l.version, dir)? {
                MemoryLimit::Bytes(b) => b,
                MemoryLimit::Unlimited => {
                    return Err(SamplerError::NoAllocatable { path: dir.clone() });
                }
            },
        };
        Ok(reading(capacity, mode, &figures))
    }

    pub(super) fn sample_filesystems(&mut self, now: Instant, out: &mut Observations) {
        let nodefs = statvfs(&self.layout.kubelet_root);
        let nodefs = self.note(W_NODEFS, now, nodefs);
        let (bytes, inodes) = split(nodefs.as_ref());
        put(out, Signal::NodeFsAvailable, bytes);
        put(out, Signal::NodeFsInodesFree, inodes);

        // The kubelet always reports imagefs (CRI ImageFsInfo): on a node without a dedicated
        // image filesystem the runtime's directory is on nodefs and the values equal nodefs'.
        let imagefs = match self.layout.image_fs.as_ref() {
            Some((p, _)) => {
                let r = statvfs(p);
                self.note(W_IMAGEFS, now, r)
            }
            None => None,
        };
        let (bytes, inodes) = split(imagefs.as_ref());
        put(out, Signal::ImageFsAvailable, bytes);
        put(out, Signal::ImageFsInodesFree, inodes);

        let containerfs = match (&self.config.container_fs, self.layout.container_fs.as_ref()) {
            // Not split: the kubelet reports the image filesystem as containerfs.
            (None, _) => imagefs,
            (Some(_), Some(p)) => {
                let r = statvfs(p);
                self.note(W_CONTAINERFS, now, r)
            }
            (Some(_), None) => None,
        };
        // `HasDedicatedImageFs` and `IsContainerFsSeparateFromImageFs`, from the devices (the
        // rule is the core's): they choose the `containerfs.*` thresholds and which part of a
        // pod's disk ranks it for each disk signal. Told once all the filesystems were read;
        // the last layout stays while one of them cannot be.
        let container_device = match &self.config.container_fs {
            None => Some(None),
            Some(_) => containerfs.as_ref().map(|c| Some(c.device)),
        };
        if let (Some(n), Some(i), Some(c)) = (nodefs.as_ref(), imagefs.as_ref(), container_device) {
            self.fs_layout = Some(FsLayout::detect(n.device, i.device, c));
        }
        out.filesystem = self.fs_layout.unwrap_or_default();
        let (bytes, inodes) = split(containerfs.as_ref());
        put(out, Signal::ContainerFsAvailable, bytes);
        put(out, Signal::ContainerFsInodesFree, inodes);
    }

    pub(super) fn read_pids(&mut self) -> Result<SignalObservation, SamplerError> {
        // pkg/kubelet/stats/pidlimit: the smaller of pid_max and threads-max; a sysctl that
        // cannot be read is skipped, as the kubelet skips it.
        let paths = &self.layout.proc;
        let pid_max = self
            .reader
            .parse_path(Some(&mut self.files.pid_max), &paths.pid_max, |t| {
                parse::parse_single_u64("pid_max", t)
            });
        let threads_max =
            self.reader
                .parse_path(Some(&mut self.files.threads_max), &paths.threads_max, |t| {
                    parse::parse_single_u64("threads-max", t)
                });
        let (pid_max, threads_max) = match (pid_max, threads_max) {
            (Err(e), Err(_)) => return Err(e),
            (a, b) => (a.ok(), b.ok()),
        };
        // The kubelet falls back to sysinfo(2) when /proc/loadavg cannot be read; sysinfo's
        // 16-bit process count is why it prefers loadavg (kubernetes#107107).
        let loadavg = self.reader.parse_path(
            Some(&mut self.files.loadavg),
            &paths.loadavg,
            parse::parse_loadavg_tasks,
        );
        let tasks = match loadavg {
            Ok(t) => t,
            Err(e) => match nix::sys::sysinfo::sysinfo() {
                Ok(info) => u64::from(info.process_count()),
                Err(_) => return Err(e),
            },
        };
        compute::pid_observation(pid_max, threads_max, tasks).ok_or_else(|| SamplerError::Parse {
            path: paths.pid_max.clone(),
            source: parse::ParseError::Missing { field: "pid_max" },
        })
    }
}

/// A cgroup's memory reading under the working-set formula `mode` (the core's).
fn reading(capacity: u64, mode: MemoryWorkingSet, m: &MemoryStatFigures) -> MemoryReading {
    let outside = signals::file_outside_working_set(mode, m);
    MemoryReading {
        capacity,
        usage: m.usage,
        inactive_file: m.inactive_file,
        reclaimable_active_file: outside.saturating_sub(m.inactive_file),
        working_set: signals::memory_working_set(mode, m),
    }
}

/// The `memory.stat` figures of a memory cgroup that `mode` needs: usage and inactive_file
/// always; the page-cache fields (active, shmem, dirty, writeback) only for
/// [`MemoryWorkingSet::Reclaimable`], so a kernel that lacks one never fails the kubelet's
/// formula.
pub(super) fn read_usage(
    reader: &mut Reader,
    files: &mut CgroupFiles,
    version: CgroupVersion,
    dir: &Path,
    is_root: bool,
    mode: MemoryWorkingSet,
) -> Result<MemoryStatFigures, SamplerError> {
    let (usage, inactive_file, stat) = usage_and_stat(reader, files, version, dir, is_root)?;
    let mut out = MemoryStatFigures {
        usage,
        inactive_file,
        ..MemoryStatFigures::default()
    };
    if mode == MemoryWorkingSet::Reclaimable {
        let cache = stat
            .page_cache(version == CgroupVersion::V1)
            .map_err(|source| SamplerError::Parse {
                path: dir.join("memory.stat"),
                source,
            })?;
        out.active_file = cache.active_file;
        out.file = cache.file;
        out.shmem = cache.shmem;
        out.dirty = cache.dirty;
        out.writeback = cache.writeback;
    }
    Ok(out)
}

/// Usage, inactive_file and the whole `memory.stat` of a memory cgroup.
fn usage_and_stat(
    reader: &mut Reader,
    files: &mut CgroupFiles,
    version: CgroupVersion,
    dir: &Path,
    is_root: bool,
) -> Result<(u64, u64, parse::MemoryStat), SamplerError> {
    match version {
        CgroupVersion::V1 => {
            let usage =
                reader.parse(Some(&mut files.usage), dir, "memory.usage_in_bytes", |t| {
                    parse::parse_single_u64("memory.usage_in_bytes", t)
                })?;
            let stat = reader.parse(
                Some(&mut files.stat),
                dir,
                "memory.stat",
                parse::parse_memory_stat,
            )?;
            let inactive = stat
                .total_inactive_file
                .ok_or_else(|| missing(reader, "total_inactive_file"))?;
            Ok((usage, inactive, stat))
        }
        CgroupVersion::V2 => {
            let stat = reader.parse(
                Some(&mut files.stat),
                dir,
                "memory.stat",
                parse::parse_memory_stat,
            )?;
            let inactive = stat
                .inactive_file
                .ok_or_else(|| missing(reader, "inactive_file"))?;
            let usage = if is_root {
                // The v2 root has no memory.current; runc (fs2 `rootStatsFromMeminfo`, used by
                // cadvisor) and the kubelet's v2 script take anon + file from memory.stat.
                let anon = stat.anon.ok_or_else(|| missing(reader, "anon"))?;
                let file = stat.file.ok_or_else(|| missing(reader, "file"))?;
                anon.saturating_add(file)
            } else {
                reader.parse(Some(&mut files.usage), dir, "memory.current", |t| {
                    parse::parse_single_u64("memory.current", t)
                })?
            };
            Ok((usage, inactive, stat))
        }
    }
}

pub(super) fn read_limit(
    reader: &mut Reader,
    files: &mut CgroupFiles,
    version: CgroupVersion,
    dir: &Path,
) -> Result<MemoryLimit, SamplerError> {
    let file = match version {
        CgroupVersion::V1 => "memory.limit_in_bytes",
        CgroupVersion::V2 => "memory.max",
    };
    reader.parse(Some(&mut files.limit), dir, file, |t| {
        parse::parse_memory_limit(file, t)
    })
}

/// A missing memory.stat field, naming the file that was read last.
pub(super) fn missing(reader: &Reader, field: &'static str) -> SamplerError {
    SamplerError::Parse {
        path: reader.last_path().to_path_buf(),
        source: parse::ParseError::Missing { field },
    }
}

pub(super) fn put(out: &mut Observations, signal: Signal, obs: Option<SignalObservation>) {
    match obs {
        Some(o) => {
            out.signals.insert(signal, o);
        }
        None => {
            out.signals.remove(&signal);
        }
    }
}

pub(super) fn split(s: Option<&FsStat>) -> (Option<SignalObservation>, Option<SignalObservation>) {
    match s {
        Some(s) => {
            let (b, i) = compute::fs_observations(s);
            (Some(b), i)
        }
        None => (None, None),
    }
}

/// statvfs(2) plus the path's device, for the dedicated-imagefs test.
pub(crate) fn statvfs(path: &Path) -> Result<FsStat, SamplerError> {
    use std::os::unix::fs::MetadataExt as _;
    let st = nix::sys::statvfs::statvfs(path).map_err(|source| SamplerError::Statvfs {
        path: path.to_path_buf(),
        source,
    })?;
    let device = std::fs::metadata(path)
        .map_err(|source| SamplerError::Read {
            path: path.to_path_buf(),
            source,
        })?
        .dev();
    Ok(FsStat {
        frsize: st.fragment_size(),
        blocks: st.blocks(),
        blocks_available: st.blocks_available(),
        files: st.files(),
        files_free: st.files_free(),
        device,
    })
}
