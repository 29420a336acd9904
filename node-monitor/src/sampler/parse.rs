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
    /// cgroup v2: file-backed memory (used for the root).
    pub file: Option<u64>,
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
    const FIELD: &str = "MemTotal";
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("MemTotal:") else {
            continue;
        };
        let mut parts = rest.split_ascii_whitespace();
        let value = parts.next().ok_or(ParseError::Missing { field: FIELD })?;
        let kib = parse_u64(FIELD, value)?;
        match parts.next() {
            Some("kB") => {}
            other => {
                return Err(ParseError::Unit {
                    field: FIELD,
                    unit: other.unwrap_or("").to_owned(),
                    expected: "kB",
                });
            }
        }
        return kib
            .checked_mul(1024)
            .ok_or_else(|| ParseError::invalid(FIELD, value));
    }
    Err(ParseError::Missing { field: FIELD })
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
mod tests {
    use super::*;

    #[test]
    fn single_values() {
        let cases: &[(&str, Result<u64, ParseError>)] = &[
            ("123\n", Ok(123)),
            ("  42  ", Ok(42)),
            ("0", Ok(0)),
            ("", Err(ParseError::Missing { field: "f" })),
            ("\n", Err(ParseError::Missing { field: "f" })),
            ("-1", Err(ParseError::invalid("f", "-1"))),
            ("12 34", Err(ParseError::invalid("f", "12 34"))),
            ("0x10", Err(ParseError::invalid("f", "0x10"))),
            (
                "99999999999999999999999",
                Err(ParseError::invalid("f", "99999999999999999999999")),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(&parse_single_u64("f", text), want, "{text:?}");
        }
    }

    #[test]
    fn limits() {
        let cases: &[(&str, Result<MemoryLimit, ParseError>)] = &[
            ("max\n", Ok(MemoryLimit::Unlimited)),
            ("536870912\n", Ok(MemoryLimit::Bytes(536_870_912))),
            // cgroup v1's "no limit" (PAGE_COUNTER_MAX pages).
            ("9223372036854771712\n", Ok(MemoryLimit::Unlimited)),
            ("4611686018427387904", Ok(MemoryLimit::Bytes(1 << 62))),
            ("unlimited", Err(ParseError::invalid("l", "unlimited"))),
            ("", Err(ParseError::Missing { field: "l" })),
        ];
        for (text, want) in cases {
            assert_eq!(&parse_memory_limit("l", text), want, "{text:?}");
        }
    }

    #[test]
    fn memory_stat_v1_and_v2() {
        let v1 = "cache 1000\nrss 2000\ninactive_file 10\nactive_file 5\n\
                  total_cache 9000\ntotal_inactive_file 700\ntotal_active_file 300\n";
        assert_eq!(
            parse_memory_stat(v1),
            Ok(MemoryStat {
                total_inactive_file: Some(700),
                inactive_file: Some(10),
                anon: None,
                file: None,
            })
        );
        let v2 = "anon 4096\nfile 8192\nkernel 100\ninactive_anon 0\ninactive_file 4000\n\
                  workingset_refault_file 3\n";
        assert_eq!(
            parse_memory_stat(v2),
            Ok(MemoryStat {
                total_inactive_file: None,
                inactive_file: Some(4000),
                anon: Some(4096),
                file: Some(8192),
            })
        );
        // Unknown or odd lines for fields we do not use are skipped.
        assert_eq!(
            parse_memory_stat("weird\nfoo bar baz\n\nnew_field x\ninactive_file 1\n"),
            Ok(MemoryStat {
                inactive_file: Some(1),
                ..MemoryStat::default()
            })
        );
    }

    #[test]
    fn memory_stat_malformed() {
        let cases: &[(&str, ParseError)] = &[
            (
                "total_inactive_file abc\n",
                ParseError::invalid("total_inactive_file", "abc"),
            ),
            (
                "inactive_file\n",
                ParseError::Missing {
                    field: "inactive_file",
                },
            ),
            (
                "inactive_file -5\n",
                ParseError::invalid("inactive_file", "-5"),
            ),
            ("anon 1 2\n", ParseError::invalid("anon", "anon 1 2")),
            ("file 1.5\n", ParseError::invalid("file", "1.5")),
        ];
        for (text, want) in cases {
            assert_eq!(&parse_memory_stat(text), &Err(want.clone()), "{text:?}");
        }
    }

    #[test]
    fn meminfo() {
        let ok = "MemTotal:       24684000 kB\nMemFree:        23000000 kB\n";
        assert_eq!(parse_meminfo_total(ok), Ok(24_684_000 * 1024));
        let cases: &[(&str, ParseError)] = &[
            ("MemFree: 1 kB\n", ParseError::Missing { field: "MemTotal" }),
            ("", ParseError::Missing { field: "MemTotal" }),
            ("MemTotal:\n", ParseError::Missing { field: "MemTotal" }),
            (
                "MemTotal: lots kB\n",
                ParseError::invalid("MemTotal", "lots"),
            ),
            (
                "MemTotal: 100 MB\n",
                ParseError::Unit {
                    field: "MemTotal",
                    unit: "MB".into(),
                    expected: "kB",
                },
            ),
            (
                "MemTotal: 100\n",
                ParseError::Unit {
                    field: "MemTotal",
                    unit: String::new(),
                    expected: "kB",
                },
            ),
            (
                "MemTotal: 18446744073709551615 kB\n",
                ParseError::invalid("MemTotal", "18446744073709551615"),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(&parse_meminfo_total(text), &Err(want.clone()), "{text:?}");
        }
    }

    #[test]
    fn loadavg() {
        assert_eq!(
            parse_loadavg_tasks("1.36 3.49 4.53 2/3518 3715089\n"),
            Ok(3518)
        );
        let f = "loadavg tasks";
        let cases: &[(&str, ParseError)] = &[
            ("", ParseError::Missing { field: f }),
            ("1.0 2.0 3.0\n", ParseError::Missing { field: f }),
            ("1.0 2.0 3.0 3518 99\n", ParseError::invalid(f, "3518")),
            ("1.0 2.0 3.0 2/x 99\n", ParseError::invalid(f, "x")),
            ("1.0 2.0 3.0 2/ 99\n", ParseError::invalid(f, "")),
        ];
        for (text, want) in cases {
            assert_eq!(&parse_loadavg_tasks(text), &Err(want.clone()), "{text:?}");
        }
    }

    #[test]
    fn id_lists() {
        assert_eq!(count_ids("procs", "1\n22\n333\n"), Ok(3));
        assert_eq!(count_ids("procs", ""), Ok(0));
        assert_eq!(count_ids("procs", "\n\n"), Ok(0));
        assert_eq!(
            count_ids("procs", "1\nabc\n"),
            Err(ParseError::invalid("procs", "abc"))
        );
        assert_eq!(
            count_ids("procs", "1\n-2\n"),
            Err(ParseError::invalid("procs", "-2"))
        );
    }

    #[test]
    fn memory_events() {
        let text = "low 0\nhigh 5\nmax 7\noom 1\noom_kill 1\noom_group_kill 0\nsock_throttled 0\n";
        let ev = parse_memory_events(text).expect("parses");
        assert_eq!(
            ev,
            MemoryEvents {
                low: 0,
                high: 5,
                max: 7,
                oom: 1,
                oom_kill: 1,
                oom_group_kill: 0
            }
        );
        let later = MemoryEvents {
            max: 9,
            oom_kill: 2,
            ..ev
        };
        assert_eq!(
            later.delta_since(&ev),
            MemoryEvents {
                max: 2,
                oom_kill: 1,
                ..MemoryEvents::default()
            }
        );
        assert!(ev.delta_since(&ev).is_zero());
        // A counter going backwards (re-created cgroup) is not an increase.
        assert!(MemoryEvents::default().delta_since(&ev).is_zero());
        // Older kernels: no oom_group_kill line.
        assert_eq!(
            parse_memory_events("low 0\nhigh 0\nmax 1\noom 0\noom_kill 0\n").map(|e| e.max),
            Ok(1)
        );
        let cases: &[(&str, ParseError)] = &[
            ("", ParseError::Missing { field: "max" }),
            ("max 1\noom 0\n", ParseError::Missing { field: "oom_kill" }),
            (
                "max x\noom 0\noom_kill 0\n",
                ParseError::invalid("max", "x"),
            ),
            (
                "max\noom 0\noom_kill 0\n",
                ParseError::Missing { field: "max" },
            ),
            (
                "max 1\noom -1\noom_kill 0\n",
                ParseError::invalid("oom", "-1"),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(&parse_memory_events(text), &Err(want.clone()), "{text:?}");
        }
    }

    #[test]
    fn pressure() {
        let text = "some avg10=1.50 avg60=0.25 avg300=0.05 total=403477\n\
                    full avg10=0.00 avg60=0.00 avg300=0.00 total=12\n";
        let p = parse_pressure(text).expect("parses");
        assert_eq!(p.some.total_us, 403_477);
        assert!((p.some.avg10 - 1.5).abs() < 1e-9);
        assert_eq!(p.full.map(|f| f.total_us), Some(12));
        let only_some =
            parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n").expect("parses");
        assert_eq!(only_some.full, None);
        let cases: &[(&str, ParseError)] = &[
            ("", ParseError::Missing { field: "some" }),
            (
                "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
                ParseError::Missing { field: "some" },
            ),
            (
                "some avg10=0.00 avg60=0.00 total=0\n",
                ParseError::invalid("some", "some avg10=0.00 avg60=0.00 total=0"),
            ),
            (
                "some avg10=x avg60=0.00 avg300=0.00 total=0\n",
                ParseError::invalid("some", "avg10=x"),
            ),
            (
                "some avg10=-1 avg60=0.00 avg300=0.00 total=0\n",
                ParseError::invalid("some", "avg10=-1"),
            ),
            (
                "some avg10=NaN avg60=0.00 avg300=0.00 total=0\n",
                ParseError::invalid("some", "avg10=NaN"),
            ),
            (
                "some avg10=0.00 avg60=0.00 avg300=0.00 total=1.5\n",
                ParseError::invalid("some", "total=1.5"),
            ),
            (
                "some avg10 avg60=0.00 avg300=0.00 total=0\n",
                ParseError::invalid("some", "avg10"),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(&parse_pressure(text), &Err(want.clone()), "{text:?}");
        }
    }

    #[test]
    fn oom_control() {
        assert_eq!(
            parse_oom_control("oom_kill_disable 0\nunder_oom 1\noom_kill 3\n"),
            Ok(OomControl {
                oom_kill_disable: false,
                under_oom: true,
                oom_kill: Some(3)
            })
        );
        assert_eq!(
            parse_oom_control("oom_kill_disable 1\nunder_oom 0\n"),
            Ok(OomControl {
                oom_kill_disable: true,
                under_oom: false,
                oom_kill: None
            })
        );
        let cases: &[(&str, ParseError)] = &[
            ("", ParseError::Missing { field: "under_oom" }),
            ("under_oom 2\n", ParseError::invalid("under_oom", "2")),
            (
                "oom_kill_disable yes\nunder_oom 0\n",
                ParseError::invalid("oom_kill_disable", "yes"),
            ),
            (
                "under_oom 0\noom_kill x\n",
                ParseError::invalid("oom_kill", "x"),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(&parse_oom_control(text), &Err(want.clone()), "{text:?}");
        }
    }

    #[test]
    fn pod_log_dirs() {
        assert_eq!(
            pod_log_dir_uid("kube-system_coredns-abc_0a1b2c3d-4e5f-6789-abcd-ef0123456789"),
            Some("0a1b2c3d-4e5f-6789-abcd-ef0123456789")
        );
        assert_eq!(pod_log_dir_uid("nounderscore"), None);
        assert_eq!(pod_log_dir_uid("ns_name_"), None);
    }

    #[test]
    fn invalid_values_are_bounded_in_messages() {
        let long = "9".repeat(500);
        let Err(ParseError::Invalid { value, .. }) = parse_single_u64("f", &long) else {
            panic!("expected an invalid-value error");
        };
        assert_eq!(value.len(), 64);
    }
}
