//! The kernel struct offsets the programs read, resolved from the types.
use node_monitor_common::config::TaskOffsets;

use super::{Btf, BtfError, Type};

/// Copies the caller fields of one offsets record into another.
pub trait WithCaller {
    /// `self` with the caller fields (and `caller_valid`) of `c`.
    fn with_caller(self, c: &TaskOffsets) -> TaskOffsets;
}

impl WithCaller for TaskOffsets {
    fn with_caller(self, c: &TaskOffsets) -> TaskOffsets {
        TaskOffsets {
            task_thread_pid: c.task_thread_pid,
            pid_level: c.pid_level,
            task_cred: c.task_cred,
            cred_cap_effective: c.cred_cap_effective,
            cred_user_ns: c.cred_user_ns,
            user_ns_level: c.user_ns_level,
            caller_valid: c.caller_valid,
            ..self
        }
    }
}

impl Btf {
    /// Offset of the 64-bit value inside a counter-like type: `percpu_counter.count`,
    /// `atomic_long_t.counter`, or 0 for a plain 8-byte integer.
    fn counter_value_offset(&self, ty: u32, what: &str) -> Result<u32, BtfError> {
        let rid = self.resolve(ty)?;
        match &self.entry(ty, rid)?.ty {
            Type::Int { size: 8 } => Ok(0),
            Type::Struct { .. } => {
                for name in ["count", "counter"] {
                    if let Ok((off, mty)) = self.member(rid, name)
                        && self.size_of(mty)? == 8
                    {
                        return Ok(off);
                    }
                }
                Err(BtfError::Unexpected {
                    what: what.to_owned(),
                    expected: "a struct with a 64-bit count or counter",
                    found: self.name(rid).to_owned(),
                })
            }
            other => Err(BtfError::Unexpected {
                what: what.to_owned(),
                expected: "a 64-bit counter",
                found: format!("{other:?}"),
            }),
        }
    }

    /// `mm_struct.rss_stat` as (offset of element 0's value, stride). Since 6.2 it is
    /// `struct percpu_counter rss_stat[NR_MM_COUNTERS]`; before, `struct mm_rss_stat { atomic_long_t
    /// count[NR_MM_COUNTERS]; }`.
    fn rss_stat(&self, mm: u32) -> Result<(u32, u32, u32), BtfError> {
        let (off, ty) = self.member(mm, "rss_stat")?;
        let rid = self.resolve(ty)?;
        match &self.entry(ty, rid)?.ty {
            Type::Array { elem, .. } => Ok((
                off,
                self.size_of(*elem)?,
                self.counter_value_offset(*elem, "mm_struct.rss_stat[]")?,
            )),
            Type::Struct { .. } => {
                let (inner, aty) = self.member(rid, "count")?;
                let arid = self.resolve(aty)?;
                match &self.entry(aty, arid)?.ty {
                    Type::Array { elem, .. } => Ok((
                        off + inner,
                        self.size_of(*elem)?,
                        self.counter_value_offset(*elem, "mm_rss_stat.count[]")?,
                    )),
                    other => Err(BtfError::Unexpected {
                        what: "mm_rss_stat.count".to_owned(),
                        expected: "an array",
                        found: format!("{other:?}"),
                    }),
                }
            }
            other => Err(BtfError::Unexpected {
                what: "mm_struct.rss_stat".to_owned(),
                expected: "an array or struct mm_rss_stat",
                found: format!("{other:?}"),
            }),
        }
    }

    /// `kernfs_node.id`: a u64 since 5.5; before, `union kernfs_node_id { struct {...}; u64 id; }`.
    fn kernfs_id_offset(&self) -> Result<u32, BtfError> {
        let kn = self.struct_id("kernfs_node")?;
        let (off, ty) = self.member(kn, "id")?;
        let rid = self.resolve(ty)?;
        match &self.entry(ty, rid)?.ty {
            Type::Int { size: 8 } => Ok(off),
            Type::Union { .. } | Type::Struct { .. } => {
                let (inner, ity) = self.member(rid, "id")?;
                if self.size_of(ity)? != 8 {
                    return Err(BtfError::Unexpected {
                        what: "kernfs_node_id.id".to_owned(),
                        expected: "8 bytes",
                        found: format!("{} bytes", self.size_of(ity)?),
                    });
                }
                Ok(off + inner)
            }
            other => Err(BtfError::Unexpected {
                what: "kernfs_node.id".to_owned(),
                expected: "u64 or union kernfs_node_id",
                found: format!("{other:?}"),
            }),
        }
    }

    fn check_size(&self, strukt: &str, member: &str, want: u32) -> Result<u32, BtfError> {
        let sid = self.struct_id(strukt)?;
        let (off, ty) = self.member(sid, member)?;
        let size = self.size_of(ty)?;
        if size != want {
            return Err(BtfError::Unexpected {
                what: format!("{strukt}.{member}"),
                expected: match want {
                    2 => "2 bytes",
                    4 => "4 bytes",
                    8 => "8 bytes",
                    _ => "16 bytes",
                },
                found: format!("{size} bytes"),
            });
        }
        Ok(off)
    }

    /// Resolves what the OOM raw-tracepoint program reads from the victim's task. The memory
    /// figures are optional (`memory_valid` stays 0 when they cannot be resolved); the rest is
    /// required.
    pub fn task_offsets(&self) -> Result<TaskOffsets, BtfError> {
        let mut o = TaskOffsets {
            task_pid: self.check_size("task_struct", "pid", 4)?,
            task_tgid: self.check_size("task_struct", "tgid", 4)?,
            task_comm: self.check_size("task_struct", "comm", 16)?,
            task_cgroups: self.check_size("task_struct", "cgroups", 8)?,
            task_signal: self.check_size("task_struct", "signal", 8)?,
            css_set_dfl_cgrp: self.check_size("css_set", "dfl_cgrp", 8)?,
            cgroup_kn: self.check_size("cgroup", "kn", 8)?,
            kernfs_node_id: self.kernfs_id_offset()?,
            signal_oom_score_adj: self.check_size("signal_struct", "oom_score_adj", 2)?,
            valid: 1,
            ..TaskOffsets::default()
        };
        if let Ok(m) = self.memory_offsets() {
            o.task_mm = m.task_mm;
            o.mm_total_vm = m.mm_total_vm;
            o.mm_pgtables_bytes = m.mm_pgtables_bytes;
            o.mm_rss_stat = m.mm_rss_stat;
            o.rss_stride = m.rss_stride;
            o.rss_count = m.rss_count;
            o.rss_file_idx = m.rss_file_idx;
            o.rss_anon_idx = m.rss_anon_idx;
            o.rss_shmem_idx = m.rss_shmem_idx;
            o.memory_valid = 1;
        }
        if let Ok(c) = self.caller_offsets() {
            o = o.with_caller(&c);
        }
        Ok(o)
    }

    /// What the reboot program reads from `current` to judge a reboot(2) caller:
    /// `task->thread_pid->level`, `task->cred->cap_effective` and `task->cred->user_ns->level`.
    /// Only these fields (and `caller_valid`) are set. Independent of [`Btf::task_offsets`]: the
    /// reboot program uses them without the OOM program's offsets.
    pub fn caller_offsets(&self) -> Result<TaskOffsets, BtfError> {
        Ok(TaskOffsets {
            task_thread_pid: self.check_size("task_struct", "thread_pid", 8)?,
            pid_level: self.check_size("pid", "level", 4)?,
            task_cred: self.check_size("task_struct", "cred", 8)?,
            // `kernel_cap_t`: `struct { u64 val; }` since 6.3, `struct { u32 cap[2]; }` before;
            // both read as one little-endian u64 (the only byte order this reader parses).
            cred_cap_effective: self.check_size("cred", "cap_effective", 8)?,
            cred_user_ns: self.check_size("cred", "user_ns", 8)?,
            user_ns_level: self.check_size("user_namespace", "level", 4)?,
            caller_valid: 1,
            ..TaskOffsets::default()
        })
    }

    /// The memory part of [`Btf::task_offsets`], with its own error for diagnostics.
    pub fn memory_offsets(&self) -> Result<TaskOffsets, BtfError> {
        let mm = self.struct_id("mm_struct")?;
        let (rss, stride, count) = self.rss_stat(mm)?;
        let (pgtables, pty) = self.member(mm, "pgtables_bytes")?;
        let pgtables_value = self.counter_value_offset(pty, "mm_struct.pgtables_bytes")?;
        let idx = |name: &str| -> Result<u32, BtfError> {
            let v = self.enumerator(name)?;
            u32::try_from(v).map_err(|_| BtfError::Unexpected {
                what: name.to_owned(),
                expected: "a small non-negative index",
                found: v.to_string(),
            })
        };
        Ok(TaskOffsets {
            task_mm: self.check_size("task_struct", "mm", 8)?,
            mm_total_vm: self.member(mm, "total_vm")?.0,
            mm_pgtables_bytes: pgtables + pgtables_value,
            mm_rss_stat: rss,
            rss_stride: stride,
            rss_count: count,
            rss_file_idx: idx("MM_FILEPAGES")?,
            rss_anon_idx: idx("MM_ANONPAGES")?,
            rss_shmem_idx: idx("MM_SHMEMPAGES")?,
            memory_valid: 1,
            ..TaskOffsets::default()
        })
    }
}
