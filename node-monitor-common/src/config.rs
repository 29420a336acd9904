//! Records the agent writes into maps after loading and before attaching: tunables
//! ([`ProbeConfigRaw`]) and tracepoint field layouts parsed from tracefs ([`TpLayout`]).
//!
//! Kernel structs are read through CO-RE (node-monitor-ebpf/c/task.c): the loader relocates
//! those reads against the running kernel's BTF and sets [`crate::names::CORE_GLOBAL`]; a
//! tracepoint whose layout could not be parsed is not attached.
use crate::plain;

/// Tunables, at index 0 of [`crate::names::CONFIG_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeConfigRaw {
    /// Emit a reclaim-stall event when a cgroup's stall in one window reaches this.
    pub stall_budget_ns: u64,
    /// Length of the (tumbling) stall accounting window.
    pub stall_window_ns: u64,
    /// Minimum interval between two kswapd wake-up events for one node.
    pub kswapd_min_interval_ns: u64,
    /// Minimum interval between two reboot events of one verdict, for every verdict but
    /// `allowed` (see [`crate::logic::RebootSlot`]).
    pub reboot_min_interval_ns: u64,
    /// The kernel's page size, to turn page counts into bytes.
    pub page_size: u64,
    /// The only process (thread-group id) whose `getppid(2)` emits synthetic events; 0 = none.
    pub synthetic_tgid: u32,
    /// [`config_flags`] bits.
    pub flags: u32,
}

/// `ProbeConfigRaw::flags`.
pub mod config_flags {
    /// The programs were loaded with a log level above `Off` (informational).
    pub const KERNEL_LOG: u32 = 1 << 0;
}

/// Where a tracepoint field lives in the record the kernel passes to the program.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FieldLoc {
    pub offset: u16,
    /// 1, 2, 4 or 8; 0 when the field is absent on this kernel.
    pub size: u8,
    /// [`field_flags`] bits.
    pub flags: u8,
}

/// `FieldLoc::flags`.
pub mod field_flags {
    pub const SIGNED: u8 = 1 << 0;
    /// A `__data_loc` field: a u32 whose low 16 bits are the data's offset, high 16 its length.
    pub const DATA_LOC: u8 = 1 << 1;
}

impl FieldLoc {
    pub const fn is_present(&self) -> bool {
        self.size != 0
    }
}

/// Maximum fields a program reads from one tracepoint.
pub const TP_MAX_FIELDS: usize = 12;

/// A tracepoint's field layout on the running kernel, one per [`TpSlot`] in
/// [`crate::names::TP_LAYOUT_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TpLayout {
    pub fields: [FieldLoc; TP_MAX_FIELDS],
}

/// A tracepoint the programs read fields from: its layout's index in the layout map and the
/// fields the programs use, in order (index `i` of this list is `TpLayout::fields[i]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpSlot {
    pub index: u32,
    pub category: &'static str,
    pub name: &'static str,
    /// `(field name, required)`: a program whose required field is missing is not attached.
    pub fields: &'static [(&'static str, bool)],
}

/// `oom/mark_victim` (`include/trace/events/oom.h`). Only `pid` predates 6.1; the rest came
/// with later kernels and is optional.
pub mod oom_tp {
    pub const PID: usize = 0;
    pub const COMM: usize = 1;
    pub const TOTAL_VM: usize = 2;
    pub const ANON_RSS: usize = 3;
    pub const FILE_RSS: usize = 4;
    pub const SHMEM_RSS: usize = 5;
    pub const UID: usize = 6;
    pub const PGTABLES: usize = 7;
    pub const OOM_SCORE_ADJ: usize = 8;
    pub const SLOT: super::TpSlot = super::TpSlot {
        index: 0,
        category: "oom",
        name: "mark_victim",
        fields: &[
            ("pid", true),
            ("comm", false),
            ("total_vm", false),
            ("anon_rss", false),
            ("file_rss", false),
            ("shmem_rss", false),
            ("uid", false),
            ("pgtables", false),
            ("oom_score_adj", false),
        ],
    };
}

/// `syscalls/sys_enter_reboot` (generated from `SYSCALL_DEFINE4(reboot, …)`).
pub mod reboot_tp {
    pub const MAGIC1: usize = 0;
    pub const MAGIC2: usize = 1;
    pub const CMD: usize = 2;
    pub const SLOT: super::TpSlot = super::TpSlot {
        index: 1,
        category: "syscalls",
        name: "sys_enter_reboot",
        fields: &[("magic1", false), ("magic2", false), ("cmd", true)],
    };
}

/// Entries in the layout map.
pub const TP_SLOTS: u32 = 2;

plain! {
    ProbeConfigRaw { u64, u64, u64, u64, u64, u32, u32 },
    FieldLoc { u16, u8, u8 },
    TpLayout { [FieldLoc; TP_MAX_FIELDS] },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_fit_the_layout_record_and_map() {
        for slot in [oom_tp::SLOT, reboot_tp::SLOT] {
            assert!(slot.fields.len() <= TP_MAX_FIELDS, "{}", slot.name);
            assert!(slot.index < TP_SLOTS, "{}", slot.name);
            assert!(slot.fields.iter().any(|(_, required)| *required));
        }
        assert_eq!(
            oom_tp::SLOT.fields[oom_tp::OOM_SCORE_ADJ].0,
            "oom_score_adj"
        );
        assert_eq!(reboot_tp::SLOT.fields[reboot_tp::CMD].0, "cmd");
    }
}
