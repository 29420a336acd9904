//! The pods' usage: finding their cgroups, memory working sets, processes, disk.
use super::*;

impl Sampler {
    /// With `kubepods_cgroup: auto` and nothing to tell the layout at start (the kubelet not yet
    /// up), looks again: the first kubepods cgroup or kubelet configuration decides it.
    pub(super) fn redetect_kubepods(&mut self) {
        if self.layout.kubepods_detection != KubepodsDetection::Pending {
            return;
        }
        let Ok(layout) = self.config.resolve() else {
            return;
        };
        if layout.kubepods_detection != KubepodsDetection::Pending {
            tracing::info!(
                kubepods = %layout.kubepods_memory.display(),
                detection = ?layout.kubepods_detection,
                "sampler: kubepods layout detected"
            );
            self.pods = PodTable::new(self.pods.keep_limit());
            self.layout = layout;
        }
    }

    /// Re-lists the pod cgroups (cheap: a few directory reads) and says whether the pod with
    /// this UID has one. For the agent's check that it sees the pods the API lists.
    pub fn refresh_pod_cgroups(&mut self) -> Result<(), SamplerError> {
        self.redetect_kubepods();
        self.pods.refresh(&self.layout)
    }

    /// Whether the last relist found a cgroup for this pod UID.
    pub fn has_pod_cgroup(&self, uid: &str) -> bool {
        self.pods.contains_uid(uid)
    }

    /// Reads every pod's usage into `out.pods` and nothing else, asking `give_up` before each
    /// pod and stopping at its first yes (`false`: `out.pods` is then part old, part new). A
    /// refresh of the ranking's figures that a wake-up must never wait for.
    pub fn read_pods_unless(
        &mut self,
        out: &mut Observations,
        give_up: &mut dyn FnMut() -> bool,
    ) -> bool {
        self.sample_pods(SampleKind::Fast, Instant::now(), out, give_up)
    }

    /// The pods' pass of [`Sampler::sample_into`]; given up (false) at `give_up`'s first yes.
    pub(super) fn sample_pods(
        &mut self,
        kind: SampleKind,
        now: Instant,
        out: &mut Observations,
        give_up: &mut dyn FnMut() -> bool,
    ) -> bool {
        self.redetect_kubepods();
        let refreshed = self.pods.refresh(&self.layout);
        if self.note(W_KUBEPODS, now, refreshed).is_none() {
            out.pods.clear();
            return true;
        }
        if let Some(meter) = &self.disk {
            if kind == SampleKind::Full {
                meter.request(
                    self.pods
                        .iter()
                        .map(|p| (p.uid.as_str(), p.memory_dir.as_path())),
                );
            }
            self.take_pod_disk(now);
        }
        out.pods.retain(|uid, _| self.pods.contains_uid(uid));
        let version = self.layout.version;
        let mut memory_err = None;
        let mut process_err = None;
        let mut gone = Vec::new();
        for pod in self.pods.iter_mut() {
            if give_up() {
                return false;
            }
            let memory = match pod_memory(&mut self.reader, version, pod) {
                Ok(m) => Some(m),
                Err(e) if is_gone(&e) => {
                    gone.push(pod.uid.clone());
                    continue;
                }
                Err(e) => {
                    memory_err.get_or_insert(e);
                    None
                }
            };
            let processes = match pod_processes(&mut self.reader, version, pod) {
                Ok(p) => Some(p),
                Err(e) => {
                    if !is_gone(&e) {
                        process_err.get_or_insert(e);
                    }
                    None
                }
            };
            // A truncated walk's lower bound would rank the pod by what its decoys let be
            // counted: without figures it ranks first for the disk signals, as the kubelet ranks
            // a pod without statistics (its local-storage limits still see the lower bound).
            let disk = pod.disk.filter(|d| !d.truncated);
            let usage = PodUsage {
                memory,
                disk: disk.map(|d| d.total),
                writable_layers: disk.map(|d| d.layers),
                inodes: disk.map(|d| d.inodes),
                writable_layer_inodes: disk.map(|d| d.layer_inodes),
                processes,
            };
            match out.pods.get_mut(pod.uid.as_str()) {
                Some(u) => *u = usage,
                None => {
                    out.pods.insert(pod.uid.clone(), usage);
                }
            }
        }
        for uid in &gone {
            out.pods.remove(uid);
        }
        for (key, err) in [(W_POD_MEMORY, memory_err), (W_POD_PROCESSES, process_err)] {
            match err {
                Some(e) => self.warn.warn(key, now, &e),
                None => self.warn.ok(key),
            }
        }
        true
    }

    /// Copies the disk meter's last figures into the pod table, and reports its outcome once.
    pub(super) fn take_pod_disk(&mut self, now: Instant) {
        let Some(meter) = &self.disk else { return };
        let pods = &mut self.pods;
        meter.latest(|usage| {
            for pod in pods.iter_mut() {
                pod.disk = usage.get(pod.uid.as_str()).copied();
            }
        });
        let Some((truncated, error)) = meter.take_outcome() else {
            return;
        };
        let budget = self.config.pod_disk_budget;
        let error = error.or_else(|| {
            (!truncated.is_empty()).then_some(SamplerError::DiskBudget {
                uids: truncated,
                budget,
            })
        });
        match error {
            Some(e) => self.warn.warn(W_POD_DISK, now, &e),
            None => self.warn.ok(W_POD_DISK),
        }
    }

    /// Measures per-pod disk usage now, on the caller's thread (tools and tests that need the
    /// figures of this instant rather than the meter's last). The pod cgroups are listed again
    /// first: a pod started since the last pass (the one filling the disk, often) is measured
    /// too, not left without figures behind the pods the last list knew.
    pub fn measure_pod_disk_now(&mut self) {
        if self.disk.is_none() {
            return;
        }
        if let Err(e) = self.refresh_pod_cgroups() {
            tracing::debug!(error = %e, "listing the pod cgroups before a disk measurement failed");
        }
        if let Some(meter) = &self.disk {
            meter.measure_now(
                self.pods
                    .iter()
                    .map(|p| (p.uid.as_str(), p.memory_dir.as_path())),
            );
        }
    }

    /// Asks the disk meter for a measurement of every pod when the full-sample interval has
    /// passed since the last such request or full pass, for the local-storage limits, which
    /// hold whatever the node's pressure (while a node is calm no pass reads the pods). Relists
    /// the pod cgroups (a few directory reads); the walk runs on the meter's thread.
    pub fn request_pod_disk(&mut self) {
        if self.disk.is_none() {
            return;
        }
        let now = Instant::now();
        // A tenth of slack: asked on a tick of the same period, a request a hair short of the
        // interval would otherwise wait a whole second period.
        let interval = self.config.full_sample_interval;
        let interval = interval.saturating_sub(interval / 10);
        let recent =
            |t: Option<Instant>| t.is_some_and(|t| now.saturating_duration_since(t) < interval);
        if recent(self.last_disk_request) || recent(self.last_full) {
            return;
        }
        self.last_disk_request = Some(now);
        self.redetect_kubepods();
        let refreshed = self.pods.refresh(&self.layout);
        if self.note(W_KUBEPODS, now, refreshed).is_none() {
            return;
        }
        let Some(meter) = &self.disk else { return };
        meter.request(
            self.pods
                .iter()
                .map(|p| (p.uid.as_str(), p.memory_dir.as_path())),
        );
    }

    /// The per-pod disk figures in parts of the disk meter's last measurement, by pod UID, once
    /// per measurement: `None` until another finishes, or when per-pod disk usage is off.
    pub fn take_pod_disk_detail(
        &mut self,
    ) -> Option<std::collections::HashMap<String, super::super::PodDiskDetail>> {
        self.disk.as_ref().and_then(DiskMeter::take_detail)
    }

    /// The number of pod cgroups found by the last pass.
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }
}

/// A pod cgroup's working set (cadvisor: usage − total_inactive_file on v1, memory.current −
/// inactive_file on v2).
pub(super) fn pod_memory(
    reader: &mut Reader,
    version: CgroupVersion,
    pod: &mut pods::PodEntry,
) -> Result<u64, SamplerError> {
    let (usage_file, inactive_key) = match version {
        CgroupVersion::V1 => ("memory.usage_in_bytes", "total_inactive_file"),
        CgroupVersion::V2 => ("memory.current", "inactive_file"),
    };
    let keep = pod.keep_files;
    let dir = &pod.memory_dir;
    let files = &mut pod.files;
    let usage = reader.parse(slot(keep, &mut files.usage), dir, usage_file, |t| {
        parse::parse_single_u64(usage_file, t)
    })?;
    let stat = reader.parse(
        slot(keep, &mut files.stat),
        dir,
        "memory.stat",
        parse::parse_memory_stat,
    )?;
    let inactive = match version {
        CgroupVersion::V1 => stat.total_inactive_file,
        CgroupVersion::V2 => stat.inactive_file,
    }
    .ok_or_else(|| SamplerError::Parse {
        path: reader.last_path().to_path_buf(),
        source: parse::ParseError::Missing {
            field: inactive_key,
        },
    })?;
    Ok(compute::working_set(usage, inactive))
}

/// Tasks in a pod: `pids.current` (v1 pids hierarchy or v2), which counts every thread of the
/// subtree; without the pids controller, the same count from `tasks` (v1) or `cgroup.threads`
/// (v2) summed over the pod's cgroups.
pub(super) fn pod_processes(
    reader: &mut Reader,
    version: CgroupVersion,
    pod: &mut pods::PodEntry,
) -> Result<u64, SamplerError> {
    if let Some(dir) = &pod.pids_dir {
        let s = slot(pod.keep_files, &mut pod.files.pids);
        match reader.parse(s, dir, "pids.current", |t| {
            parse::parse_single_u64("pids.current", t)
        }) {
            Ok(n) => return Ok(n),
            Err(e) if !is_gone(&e) => return Err(e),
            // No pids controller here (v2 without it enabled, v1 without the hierarchy):
            // count the tasks instead.
            Err(_) => {}
        }
    }
    let file = match version {
        CgroupVersion::V1 => "tasks",
        CgroupVersion::V2 => "cgroup.threads",
    };
    count_tasks(reader, &pod.memory_dir, file, 0)
}

pub(super) fn slot(keep: bool, s: &mut Option<File>) -> Slot<'_> {
    keep.then_some(s)
}

/// Pods nest at most pod → container (→ sandbox on some runtimes); deeper trees are not the
/// kubelet's layout and are not walked.
pub(super) const MAX_TASK_DEPTH: u32 = 3;

pub(super) fn count_tasks(
    reader: &mut Reader,
    dir: &Path,
    file: &'static str,
    depth: u32,
) -> Result<u64, SamplerError> {
    let mut n = reader.parse(None, dir, file, |t| parse::count_ids(file, t))?;
    if depth >= MAX_TASK_DEPTH {
        return Ok(n);
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Ok(n);
    };
    for e in rd.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            match count_tasks(reader, &e.path(), file, depth + 1) {
                Ok(c) => n += c,
                Err(e) if is_gone(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(n)
}
