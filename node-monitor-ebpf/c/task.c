// SPDX-License-Identifier: Apache-2.0
//
// The kernel structs node-monitor's programs read, through CO-RE: each field access below is
// compiled into a relocation record (.BTF.ext) naming the field, which the agent's loader (aya)
// rewrites to the field's offset in the running kernel's BTF (/sys/kernel/btf/vmlinux). Only the
// fields read are declared; `preserve_access_index` makes every access a relocatable one. A
// field the kernel lacks leaves its instruction poisoned, so each optional read is guarded by
// bpf_core_field_exists()/bpf_core_type_exists(), which the loader resolves to a constant.
//
// Built by build.rs into LLVM bitcode that bpf-linker links with the Rust programs
// (src/task.rs declares these functions).

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed char __s8;
typedef short __s16;
typedef int __s32;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef __u32 u32;
typedef __s32 s32;
typedef __u64 u64;
typedef __s64 s64;
// bpf_helper_defs.h names it; the programs use no map from C.
enum bpf_map_type { BPF_MAP_TYPE_UNSPEC };

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#define TASK_COMM_LEN 16

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)
struct pid {
	unsigned int level;
};
struct user_namespace {
	int level;
};
// `kernel_cap_t`: `struct { u64 val; }` since 6.3, `struct { u32 cap[2]; }` before; both are
// the same 8 little-endian bytes.
struct kernel_cap_struct {
	u64 val;
};
struct cred {
	struct kernel_cap_struct cap_effective;
	struct user_namespace *user_ns;
};
struct kernfs_node {
	u64 id;
};
struct cgroup {
	struct kernfs_node *kn;
};
struct css_set {
	struct cgroup *dfl_cgrp;
};
struct signal_struct {
	short oom_score_adj;
};
typedef struct {
	s64 counter;
} atomic_long_t;
// Since 6.2: one `struct percpu_counter` per counter (its global value in `count`).
struct percpu_counter {
	s64 count;
};
struct mm_struct {
	unsigned long total_vm;
	atomic_long_t pgtables_bytes;
	struct percpu_counter rss_stat[4];
};
// Before 6.2: `struct mm_rss_stat { atomic_long_t count[NR_MM_COUNTERS]; }`.
struct mm_rss_stat {
	atomic_long_t count[4];
};
struct mm_struct___pre62 {
	struct mm_rss_stat rss_stat;
};
// x86's: `status` holds TS_COMPAT during a 32-bit system call. Other architectures have no
// `status`.
struct thread_info {
	u32 status;
};
struct task_struct {
	struct thread_info thread_info;
	int pid;
	int tgid;
	char comm[TASK_COMM_LEN];
	struct pid *thread_pid;
	const struct cred *cred;
	struct css_set *cgroups;
	struct signal_struct *signal;
	struct mm_struct *mm;
};
#pragma clang attribute pop

// Indexes into rss_stat (the anonymous enum in include/linux/mm_types_task.h, unchanged since
// 4.5). CO-RE cannot relocate an anonymous enum's values.
#define MM_FILEPAGES 0
#define MM_ANONPAGES 1
#define MM_SHMEMPAGES 3

// arch/x86/include/asm/thread_info.h.
#define NM_TS_COMPAT 0x0002

// Mirrors node_monitor_common::logic::RebootCaller.
struct nm_caller {
	u64 cap_effective;
	u32 pid_ns_level;
	u32 user_ns_level;
};

// Mirrors node-monitor-ebpf's core::Victim; `flags` says which fields were read.
struct nm_victim {
	u64 cgroup_id;
	s32 pid;
	s32 tgid;
	s32 oom_score_adj;
	u32 flags;
	char comm[TASK_COMM_LEN];
};
#define NM_VICTIM_PID (1 << 0)
#define NM_VICTIM_TGID (1 << 1)
#define NM_VICTIM_COMM (1 << 2)
#define NM_VICTIM_SCORE_ADJ (1 << 3)
#define NM_VICTIM_CGROUP (1 << 4)

// Mirrors node-monitor-ebpf's core::Memory: pages, except pgtables_bytes.
struct nm_memory {
	u64 total_vm;
	s64 pgtables_bytes;
	s64 anon;
	s64 file;
	s64 shmem;
};

// The task's PID namespace depth (`task->thread_pid->level`, the namespace
// task_active_pid_ns() returns), its effective capabilities and its credentials' user namespace
// depth (`task->cred`, the credentials ns_capable() checks). 0 when all were read.
int nm_task_caller(void *task, struct nm_caller *out)
{
	struct task_struct *t = task;
	struct pid *pid = BPF_CORE_READ(t, thread_pid);
	const struct cred *cred = BPF_CORE_READ(t, cred);
	struct user_namespace *ns;
	int level;

	if (!pid || !cred)
		return -1;
	if (bpf_core_read(&out->pid_ns_level, sizeof(out->pid_ns_level), &pid->level))
		return -1;
	if (bpf_core_read(&out->cap_effective, sizeof(out->cap_effective), &cred->cap_effective))
		return -1;
	ns = BPF_CORE_READ(cred, user_ns);
	if (!ns || bpf_core_read(&level, sizeof(level), &ns->level))
		return -1;
	out->user_ns_level = level;
	return 0;
}

// Whether `task` is in a 32-bit compat system call, whose numbers are another table's: x86's
// TS_COMPAT in `thread_info.status`. 0 where the kernel's thread_info has no `status` (other
// architectures) or the read fails.
int nm_task_compat_syscall(void *task)
{
	struct task_struct *t = task;
	u32 status = 0;

	if (!bpf_core_field_exists(t->thread_info.status))
		return 0;
	if (bpf_core_read(&status, sizeof(status), &t->thread_info.status))
		return 0;
	return (status & NM_TS_COMPAT) != 0;
}

// The victim's ids, name, oom_score_adj and cgroup v2 id
// (`task->cgroups->dfl_cgrp->kn->id`, what bpf_get_current_cgroup_id() returns in the task's
// own context). Returns the NM_VICTIM_* bits of the fields read.
u32 nm_task_victim(void *task, struct nm_victim *out)
{
	struct task_struct *t = task;
	struct signal_struct *signal;
	struct kernfs_node *kn;
	u32 flags = 0;

	if (!bpf_core_read(&out->pid, sizeof(out->pid), &t->pid))
		flags |= NM_VICTIM_PID;
	if (!bpf_core_read(&out->tgid, sizeof(out->tgid), &t->tgid))
		flags |= NM_VICTIM_TGID;
	if (!bpf_core_read(&out->comm, sizeof(out->comm), &t->comm))
		flags |= NM_VICTIM_COMM;
	signal = BPF_CORE_READ(t, signal);
	if (signal) {
		short adj;

		if (!bpf_core_read(&adj, sizeof(adj), &signal->oom_score_adj)) {
			out->oom_score_adj = adj;
			flags |= NM_VICTIM_SCORE_ADJ;
		}
	}
	kn = BPF_CORE_READ(t, cgroups, dfl_cgrp, kn);
	if (kn && !bpf_core_read(&out->cgroup_id, sizeof(out->cgroup_id), &kn->id))
		flags |= NM_VICTIM_CGROUP;
	out->flags = flags;
	return flags;
}

// The figures the oom/mark_victim tracepoint prints: get_mm_counter() (the counter's global
// value), mm->total_vm and mm_pgtables_bytes(). 0 when all were read.
int nm_task_memory(void *task, struct nm_memory *out)
{
	struct task_struct *t = task;
	struct mm_struct *mm = BPF_CORE_READ(t, mm);

	if (!mm)
		return -1;
	if (bpf_core_read(&out->total_vm, sizeof(out->total_vm), &mm->total_vm))
		return -1;
	if (bpf_core_read(&out->pgtables_bytes, sizeof(out->pgtables_bytes),
			  &mm->pgtables_bytes.counter))
		return -1;
	if (bpf_core_field_exists(mm->rss_stat)) {
		if (bpf_core_read(&out->anon, sizeof(out->anon), &mm->rss_stat[MM_ANONPAGES].count) ||
		    bpf_core_read(&out->file, sizeof(out->file), &mm->rss_stat[MM_FILEPAGES].count) ||
		    bpf_core_read(&out->shmem, sizeof(out->shmem),
				  &mm->rss_stat[MM_SHMEMPAGES].count))
			return -1;
		return 0;
	}
	struct mm_struct___pre62 *old = (void *)mm;
	if (bpf_core_field_exists(old->rss_stat)) {
		if (bpf_core_read(&out->anon, sizeof(out->anon),
				  &old->rss_stat.count[MM_ANONPAGES].counter) ||
		    bpf_core_read(&out->file, sizeof(out->file),
				  &old->rss_stat.count[MM_FILEPAGES].counter) ||
		    bpf_core_read(&out->shmem, sizeof(out->shmem),
				  &old->rss_stat.count[MM_SHMEMPAGES].counter))
			return -1;
		return 0;
	}
	return -1;
}
