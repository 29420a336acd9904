//! Kernel structs read through CO-RE: the functions of c/task.c, compiled to bitcode by build.rs
//! and linked in by bpf-linker. Their field accesses carry relocations that the agent's loader
//! resolves against the running kernel's BTF.
//!
//! Without kernel BTF the loader has nothing to relocate against and leaves those instructions
//! poisoned; it then loads with [`NM_CORE`] = 0, and every call below sits behind [`relocated`],
//! so the verifier prunes the poisoned paths as dead code.
use core::ffi::c_void;

use aya_ebpf::Global;

use node_monitor_common::{TASK_COMM_LEN, logic::RebootCaller};

/// 1 when the loader relocated the CO-RE reads against the kernel's BTF. A read-only global the
/// loader sets (`names::CORE_GLOBAL`); the verifier knows its value and prunes what it disables.
#[unsafe(no_mangle)]
static NM_CORE: Global<u8> = Global::new(0);

/// Whether the CO-RE reads were relocated (see [`NM_CORE`]).
#[inline(always)]
pub fn relocated() -> bool {
    NM_CORE.load() != 0
}

/// `struct nm_victim`.
#[repr(C)]
pub struct Victim {
    pub cgroup_id: u64,
    pub pid: i32,
    pub tgid: i32,
    pub oom_score_adj: i32,
    pub flags: u32,
    pub comm: [u8; TASK_COMM_LEN],
}

/// `Victim::flags` (`NM_VICTIM_*`).
pub mod victim {
    pub const PID: u32 = 1 << 0;
    pub const TGID: u32 = 1 << 1;
    pub const COMM: u32 = 1 << 2;
    pub const SCORE_ADJ: u32 = 1 << 3;
    pub const CGROUP: u32 = 1 << 4;
}

/// `struct nm_memory`: pages, except `pgtables_bytes`.
#[repr(C)]
pub struct Memory {
    pub total_vm: u64,
    pub pgtables_bytes: i64,
    pub anon: i64,
    pub file: i64,
    pub shmem: i64,
}

unsafe extern "C" {
    fn nm_task_caller(task: *const c_void, out: *mut RebootCaller) -> i32;
    fn nm_task_victim(task: *const c_void, out: *mut Victim) -> u32;
    fn nm_task_memory(task: *const c_void, out: *mut Memory) -> i32;
    fn nm_task_compat_syscall(task: *const c_void) -> i32;
}

/// Whether `task` is in a 32-bit compat system call (`nm_task_compat_syscall`); false when not
/// relocated.
#[inline(always)]
pub fn in_compat_syscall(task: u64) -> bool {
    // SAFETY: as in `caller`.
    relocated() && task != 0 && unsafe { nm_task_compat_syscall(task as *const c_void) } != 0
}

/// The reboot(2) caller checks of `task` (`nm_task_caller`); `None` when not relocated or a read
/// failed.
#[inline(always)]
pub fn caller(task: u64) -> Option<RebootCaller> {
    if !relocated() || task == 0 {
        return None;
    }
    let mut c = RebootCaller {
        cap_effective: 0,
        pid_ns_level: 0,
        user_ns_level: 0,
    };
    // SAFETY: `task` is a kernel pointer only passed to `bpf_probe_read_kernel`; `c` is a live
    // `RebootCaller`, laid out as `struct nm_caller`.
    (unsafe { nm_task_caller(task as *const c_void, &mut c) } == 0).then_some(c)
}

/// What `nm_task_victim` read of `task`; `None` when not relocated.
#[inline(always)]
pub fn victim(task: u64) -> Option<Victim> {
    if !relocated() || task == 0 {
        return None;
    }
    let mut v = Victim {
        cgroup_id: 0,
        pid: 0,
        tgid: 0,
        oom_score_adj: 0,
        flags: 0,
        comm: [0; TASK_COMM_LEN],
    };
    // SAFETY: as in `caller`.
    unsafe { nm_task_victim(task as *const c_void, &mut v) };
    Some(v)
}

/// `task`'s memory figures (`nm_task_memory`); `None` when not relocated or a read failed.
#[inline(always)]
pub fn memory(task: u64) -> Option<Memory> {
    if !relocated() || task == 0 {
        return None;
    }
    let mut m = Memory {
        total_vm: 0,
        pgtables_bytes: 0,
        anon: 0,
        file: 0,
        shmem: 0,
    };
    // SAFETY: as in `caller`.
    (unsafe { nm_task_memory(task as *const c_void, &mut m) } == 0).then_some(m)
}
