//! Pure parsers for the kernel files the sampler reads. No I/O: each takes the file's text and
//! returns values or a [`ParseError`] that names the field and the offending value.
//!
//! Parsers are strict about the fields they use and lenient about the rest: an unknown line in
//! `memory.stat` or `/proc/meminfo` is skipped, so a newer kernel that adds fields never breaks
//! sampling, but a malformed value for a field the kubelet's formula needs is an error, never a
//! guess.

use std::fmt;

/// What went wrong parsing a kernel file. Messages name the field and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("field {field:?} is missing")]
    Missing { field: &'static str },
    #[error("field {field:?} has an invalid value {value:?}")]
    Invalid { field: &'static str, value: String },
    #[error("field {field:?} has an unexpected unit {unit:?} (expected {expected:?})")]
    Unit {
        field: &'static str,
        unit: String,
        expected: &'static str,
    },
}

impl ParseError {
    fn invalid(field: &'static str, value: &str) -> Self {
        // Bound the copied text: a corrupt file must not turn into a huge log line.
        let value: String = value.chars().take(64).collect();
        Self::Invalid { field, value }
    }
}

fn parse_u64(field: &'static str, s: &str) -> Result<u64, ParseError> {
    s.parse::<u64>().map_err(|_| ParseError::invalid(field, s))
}

/// A single-value file such as `memory.usage_in_bytes`, `memory.current`, `pids.current`,
/// `/proc/sys/kernel/pid_max`: one unsigned integer, surrounding whitespace allowed.
pub fn parse_single_u64(field: &'static str, text: &str) -> Result<u64, ParseError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(ParseError::Missing { field });
    }
    parse_u64(field, t)
}

/// Above this a memory limit means "no limit": the kernel rounds `PAGE_COUNTER_MAX` to pages, so
/// an unset cgroup v1 limit reads 9223372036854771712, not `i64::MAX`. Same cut-off as the
/// kubelet's `isMemoryUnlimited` (pkg/kubelet/stats/helper.go).
pub const UNLIMITED_ABOVE: u64 = 1 << 62;

/// A memory limit: cgroup v1 `memory.limit_in_bytes` (a number) or cgroup v2 `memory.max`
/// (a number or `max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryLimit {
    Bytes(u64),
    Unlimited,
}

pub fn parse_memory_limit(field: &'static str, text: &str) -> Result<MemoryLimit, ParseError> {
    let t = text.trim();
    if t == "max" {
        return Ok(MemoryLimit::Unlimited);
    }
    let v = parse_single_u64(field, t)?;
    Ok(if v > UNLIMITED_ABOVE {
        MemoryLimit::Unlimited
    } else {
        MemoryLimit::Bytes(v)
    })
}

/// The `memory.stat` fields the working-set formula needs. Both cgroup versions are read by the
/// same parser; which fields are present tells the version.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStat {
    /// cgroup v1: hierarchical inactive file pages (`total_inactive_file`), what cadvisor uses.
    pub total_inactive_file: Option<u64>,
    /// cgroup v1: this cgroup's own inactive file pages; cgroup v2: hierarchical (v2 stats always
    /// are).
    pub inactive_file: Option<u64>,
    /// cgroup v2: anonymous memory (used for the root, which has no `memory.current`).
    pub anon: Option<u64>,
    /// cgroup v2: file-backed memory (used for the root and the reclaimable working set).
    pub file: Option<u64>,
    /// The page-cache fields of the reclaimable working set
    /// (`nodeMonitor.memoryWorkingSet: reclaimable`), read by [`MemoryStat::page_cache`].
    /// cgroup v1: hierarchical active file pages.
    pub total_active_file: Option<u64>,
    /// cgroup v1: hierarchical page cache, shmem included.
    pub total_cache: Option<u64>,
    /// cgroup v1: hierarchical shmem/tmpfs pages.
    pub total_shmem: Option<u64>,
    /// cgroup v1: hierarchical dirty file pages.
    pub total_dirty: Option<u64>,
    /// cgroup v1: hierarchical file pages under writeback.
    pub total_writeback: Option<u64>,
    /// cgroup v2: active file pages.
    pub active_file: Option<u64>,
    /// cgroup v2: shmem/tmpfs pages.
    pub shmem: Option<u64>,
    /// cgroup v2: dirty file pages.
    pub file_dirty: Option<u64>,
    /// cgroup v2: file pages under writeback.
    pub file_writeback: Option<u64>,
}

/// The page-cache figures of one cgroup beyond `inactive_file`, hierarchical on both versions:
/// what the reclaimable working set reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageCache {
    pub active_file: u64,
    /// Every page-cache page, shmem included.
    pub file: u64,
    pub shmem: u64,
    pub dirty: u64,
    pub writeback: u64,
}

impl MemoryStat {
    /// The page-cache figures: the `total_*` fields on cgroup v1 (`total_cache` for `file`),
    /// the fields of cgroup v2 (`file_dirty`, `file_writeback`). A missing one is an error
    /// naming it.
    pub fn page_cache(&self, v1: bool) -> Result<PageCache, ParseError> {
        let need = |v: Option<u64>, field: &'static str| v.ok_or(ParseError::Missing { field });
        Ok(if v1 {
            PageCache {
                active_file: need(self.total_active_file, "total_active_file")?,
                file: need(self.total_cache, "total_cache")?,
                shmem: need(self.total_shmem, "total_shmem")?,
                dirty: need(self.total_dirty, "total_dirty")?,
                writeback: need(self.total_writeback, "total_writeback")?,
            }
        } else {
            PageCache {
                active_file: need(self.active_file, "active_file")?,
                file: need(self.file, "file")?,
                shmem: need(self.shmem, "shmem")?,
                dirty: need(self.file_dirty, "file_dirty")?,
                writeback: need(self.file_writeback, "file_writeback")?,
            }
        })
    }
}

/// Parses `memory.stat` (`<key> <value>` lines). Only the keys of [`MemoryStat`] are checked; a
/// malformed value for one of them is an error, other lines are ignored.
pub fn parse_memory_stat(text: &str) -> Result<MemoryStat, ParseError> {
    let mut out = MemoryStat::default();
    for line in text.lines() {
        let mut parts = line.split_ascii_whitespace();
        let (Some(key), value) = (parts.next(), parts.next()) else {
            continue;
        };
        let (field, slot): (&'static str, &mut Option<u64>) = match key {
            "total_inactive_file" => ("total_inactive_file", &mut out.total_inactive_file),
            "inactive_file" => ("inactive_file", &mut out.inactive_file),
            "anon" => ("anon", &mut out.anon),
            "file" => ("file", &mut out.file),
            "total_active_file" => ("total_active_file", &mut out.total_active_file),
            "total_cache" => ("total_cache", &mut out.total_cache),
            "total_shmem" => ("total_shmem", &mut out.total_shmem),
            "total_dirty" => ("total_dirty", &mut out.total_dirty),
            "total_writeback" => ("total_writeback", &mut out.total_writeback),
            "active_file" => ("active_file", &mut out.active_file),
            "shmem" => ("shmem", &mut out.shmem),
            "file_dirty" => ("file_dirty", &mut out.file_dirty),
            "file_writeback" => ("file_writeback", &mut out.file_writeback),
            _ => continue,
        };
        let value = value.ok_or(ParseError::Missing { field })?;
        if parts.next().is_some() {
            return Err(ParseError::invalid(field, line));
        }
        *slot = Some(parse_u64(field, value)?);
    }
    Ok(out)
}

/// `MemTotal` from `/proc/meminfo`, in bytes (the file says kB, meaning KiB).
pub fn parse_meminfo_total(text: &str) -> Result<u64, ParseError> {
    parse_meminfo_field(text, "MemTotal")
}

/// `MemTotal` and, where the kernel reports it (3.14 and later), `MemAvailable` of
/// `/proc/meminfo`, in bytes.
pub fn parse_meminfo(text: &str) -> Result<(u64, Option<u64>), ParseError> {
    Ok((
        parse_meminfo_total(text)?,
        parse_meminfo_field(text, "MemAvailable").ok(),
    ))
}

/// One `/proc/meminfo` field (`Name:   123 kB`), in bytes.
fn parse_meminfo_field(text: &str, field: &'static str) -> Result<u64, ParseError> {
    for line in text.lines() {
        let Some(rest) = line
            .strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
        else {
            continue;
        };
        let mut parts = rest.split_ascii_whitespace();
        let value = parts.next().ok_or(ParseError::Missing { field })?;
        let kib = parse_u64(field, value)?;
        match parts.next() {
            Some("kB") => {}
            other => {
                return Err(ParseError::Unit {
                    field,
                    unit: other.unwrap_or("").to_owned(),
                    expected: "kB",
                });
            }
        }
        return kib
            .checked_mul(1024)
            .ok_or_else(|| ParseError::invalid(field, value));
    }
    Err(ParseError::Missing { field })
}

/// The number of tasks (threads included) from `/proc/loadavg`'s fourth field
/// (`running/total`), which is what the kubelet counts for `pid.available`
/// (pkg/kubelet/stats/pidlimit/pidlimit_linux.go `runningTaskCount`).
pub fn parse_loadavg_tasks(text: &str) -> Result<u64, ParseError> {
    const FIELD: &str = "loadavg tasks";
    let fourth = text
        .split_ascii_whitespace()
        .nth(3)
        .ok_or(ParseError::Missing { field: FIELD })?;
    let (_running, total) = fourth
        .split_once('/')
        .ok_or_else(|| ParseError::invalid(FIELD, fourth))?;
    parse_u64(FIELD, total)
}

/// Counts the IDs in `cgroup.procs`, `tasks` or `cgroup.threads`: one decimal ID per line.
pub fn count_ids(field: &'static str, text: &str) -> Result<u64, ParseError> {
    let mut n = 0u64;
    for line in text.lines() {
        let l = line.trim();
        if l.is_empty() {
            continue;
        }
        if !l.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ParseError::invalid(field, l));
        }
        n += 1;
    }
    Ok(n)
}

/// cgroup v2 `memory.events` counters
/// (<https://docs.kernel.org/admin-guide/cgroup-v2.html#memory-interface-files>).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryEvents {
    pub low: u64,
    pub high: u64,
    pub max: u64,
    pub oom: u64,
    pub oom_kill: u64,
    pub oom_group_kill: u64,
}

impl MemoryEvents {
    /// Counter increases since `prev` (a counter that went down, e.g. after the cgroup was
    /// re-created, counts as no increase).
    pub fn delta_since(&self, prev: &MemoryEvents) -> MemoryEvents {
        MemoryEvents {
            low: self.low.saturating_sub(prev.low),
            high: self.high.saturating_sub(prev.high),
            max: self.max.saturating_sub(prev.max),
            oom: self.oom.saturating_sub(prev.oom),
            oom_kill: self.oom_kill.saturating_sub(prev.oom_kill),
            oom_group_kill: self.oom_group_kill.saturating_sub(prev.oom_group_kill),
        }
    }

    pub fn is_zero(&self) -> bool {
        *self == MemoryEvents::default()
    }
}

/// Parses `memory.events`. `max`, `oom` and `oom_kill` are present on every kernel that has the
/// file and are required; `low`, `high` and `oom_group_kill` default to 0 when absent.
pub fn parse_memory_events(text: &str) -> Result<MemoryEvents, ParseError> {
    let mut out = MemoryEvents::default();
    let (mut max, mut oom, mut oom_kill) = (false, false, false);
    for line in text.lines() {
        let mut parts = line.split_ascii_whitespace();
        let (Some(key), value) = (parts.next(), parts.next()) else {
            continue;
        };
        let (field, slot): (&'static str, &mut u64) = match key {
            "low" => ("low", &mut out.low),
            "high" => ("high", &mut out.high),
            "max" => {
                max = true;
                ("max", &mut out.max)
            }
            "oom" => {
                oom = true;
                ("oom", &mut out.oom)
            }
            "oom_kill" => {
                oom_kill = true;
                ("oom_kill", &mut out.oom_kill)
            }
            "oom_group_kill" => ("oom_group_kill", &mut out.oom_group_kill),
            _ => continue,
        };
        *slot = parse_u64(field, value.ok_or(ParseError::Missing { field })?)?;
    }
    for (seen, field) in [(max, "max"), (oom, "oom"), (oom_kill, "oom_kill")] {
        if !seen {
            return Err(ParseError::Missing { field });
        }
    }
    Ok(out)
}

/// One line of a PSI file (`some avg10=0.00 avg60=0.00 avg300=0.00 total=0`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PressureLine {
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    /// Total stall time in microseconds.
    pub total_us: u64,
}

/// A PSI file (`/proc/pressure/memory` or a cgroup's `memory.pressure`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pressure {
    pub some: PressureLine,
    /// Absent in `/proc/pressure/cpu` on kernels before 5.13; always present for memory.
    pub full: Option<PressureLine>,
}

/// Parses a PSI file (<https://docs.kernel.org/accounting/psi.html>).
pub fn parse_pressure(text: &str) -> Result<Pressure, ParseError> {
    let mut some = None;
    let mut full = None;
    for line in text.lines() {
        let mut parts = line.split_ascii_whitespace();
        let (field, slot) = match parts.next() {
            Some("some") => ("some", &mut some),
            Some("full") => ("full", &mut full),
            _ => continue,
        };
        let mut p = PressureLine::default();
        let (mut a10, mut a60, mut a300, mut total) = (false, false, false, false);
        for kv in parts {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| ParseError::invalid(field, kv))?;
            let float = |v: &str| {
                v.parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite() && *f >= 0.0)
                    .ok_or_else(|| ParseError::invalid(field, kv))
            };
            match k {
                "avg10" => (p.avg10, a10) = (float(v)?, true),
                "avg60" => (p.avg60, a60) = (float(v)?, true),
                "avg300" => (p.avg300, a300) = (float(v)?, true),
                "total" => {
                    p.total_us = v.parse().map_err(|_| ParseError::invalid(field, kv))?;
                    total = true;
                }
                _ => {}
            }
        }
        if !(a10 && a60 && a300 && total) {
            return Err(ParseError::invalid(field, line));
        }
        *slot = Some(p);
    }
    Ok(Pressure {
        some: some.ok_or(ParseError::Missing { field: "some" })?,
        full,
    })
}

/// cgroup v1 `memory.oom_control`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OomControl {
    pub oom_kill_disable: bool,
    pub under_oom: bool,
    /// OOM kills in this cgroup (kernel 4.13+).
    pub oom_kill: Option<u64>,
}

pub fn parse_oom_control(text: &str) -> Result<OomControl, ParseError> {
    let mut out = OomControl::default();
    let mut under_oom = false;
    for line in text.lines() {
        let mut parts = line.split_ascii_whitespace();
        let (Some(key), Some(value)) = (parts.next(), parts.next()) else {
            continue;
        };
        let flag = |field: &'static str| match value {
            "0" => Ok(false),
            "1" => Ok(true),
            _ => Err(ParseError::invalid(field, value)),
        };
        match key {
            "oom_kill_disable" => out.oom_kill_disable = flag("oom_kill_disable")?,
            "under_oom" => {
                out.under_oom = flag("under_oom")?;
                under_oom = true;
            }
            "oom_kill" => out.oom_kill = Some(parse_u64("oom_kill", value)?),
            _ => {}
        }
    }
    if !under_oom {
        return Err(ParseError::Missing { field: "under_oom" });
    }
    Ok(out)
}

/// A pod's log directory name, `<namespace>_<name>_<uid>` (pkg/kubelet/kuberuntime
/// `BuildPodLogsDirectory`), reduced to its UID.
pub fn pod_log_dir_uid(name: &str) -> Option<&str> {
    let (_, uid) = name.rsplit_once('_')?;
    (!uid.is_empty()).then_some(uid)
}

impl fmt::Display for MemoryLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bytes(b) => write!(f, "{b}"),
            Self::Unlimited => f.write_str("max"),
        }
    }
}

#[cfg(test)]
mod tests;
