use super::*;

/// Builds BTF blobs for tests.
#[derive(Default)]
pub(crate) struct Builder {
    types: Vec<u8>,
    strings: Vec<u8>,
    next_id: u32,
}

impl Builder {
    pub(crate) fn new() -> Self {
        Self {
            types: Vec::new(),
            strings: vec![0],
            next_id: 1,
        }
    }

    fn s(&mut self, name: &str) -> u32 {
        if name.is_empty() {
            return 0;
        }
        let off = self.strings.len() as u32;
        self.strings.extend_from_slice(name.as_bytes());
        self.strings.push(0);
        off
    }

    fn push(&mut self, words: &[u32]) -> u32 {
        for w in words {
            self.types.extend_from_slice(&w.to_le_bytes());
        }
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    pub(crate) fn int(&mut self, name: &str, size: u32) -> u32 {
        let n = self.s(name);
        self.push(&[n, 1 << 24, size, size * 8])
    }

    pub(crate) fn ptr(&mut self, to: u32) -> u32 {
        self.push(&[0, 2 << 24, to])
    }

    pub(crate) fn array(&mut self, elem: u32, index: u32, n: u32) -> u32 {
        self.push(&[0, 3 << 24, 0, elem, index, n])
    }

    pub(crate) fn typedef(&mut self, name: &str, to: u32) -> u32 {
        let n = self.s(name);
        self.push(&[n, 8 << 24, to])
    }

    pub(crate) fn composite(
        &mut self,
        kind: u32,
        name: &str,
        size: u32,
        members: &[(&str, u32, u32)],
    ) -> u32 {
        let n = self.s(name);
        let mut words = vec![n, (kind << 24) | members.len() as u32, size];
        for (mname, ty, byte_off) in members {
            let mn = self.s(mname);
            words.extend([mn, *ty, byte_off * 8]);
        }
        self.push(&words)
    }

    pub(crate) fn strukt(&mut self, name: &str, size: u32, members: &[(&str, u32, u32)]) -> u32 {
        self.composite(4, name, size, members)
    }

    pub(crate) fn union(&mut self, name: &str, size: u32, members: &[(&str, u32, u32)]) -> u32 {
        self.composite(5, name, size, members)
    }

    pub(crate) fn enumeration(&mut self, name: &str, values: &[(&str, i32)]) -> u32 {
        let n = self.s(name);
        let mut words = vec![n, (6 << 24) | values.len() as u32, 4];
        for (vname, v) in values {
            let vn = self.s(vname);
            words.extend([vn, *v as u32]);
        }
        self.push(&words)
    }

    pub(crate) fn func_proto(&mut self, params: &[u32]) -> u32 {
        let mut words = vec![0, (13 << 24) | params.len() as u32, 0];
        for p in params {
            words.extend([0, *p]);
        }
        self.push(&words)
    }

    pub(crate) fn build(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        out.push(1); // version
        out.push(0); // flags
        out.extend_from_slice(&24u32.to_le_bytes()); // hdr_len
        out.extend_from_slice(&0u32.to_le_bytes()); // type_off
        out.extend_from_slice(&(self.types.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.types.len() as u32).to_le_bytes()); // str_off
        out.extend_from_slice(&(self.strings.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.types);
        out.extend_from_slice(&self.strings);
        out
    }
}

/// A miniature kernel: the structs the OOM program reads, laid out like 6.x (`rss_stat` an
/// array of `percpu_counter`, `mm_struct` fields inside an anonymous struct) or like 5.x
/// (`struct mm_rss_stat`, `union kernfs_node_id`).
#[expect(
    clippy::too_many_lines,
    reason = "a fixture: every struct of the miniature kernel declared in one place, as the kernel lays them out"
)]
pub(crate) fn mini_kernel(modern: bool) -> Vec<u8> {
    let mut b = Builder::new();
    let u8_ = b.int("unsigned char", 1);
    let i16_ = b.int("short int", 2);
    let i32_ = b.int("int", 4);
    let u64_ = b.int("long long unsigned int", 8);
    let s64 = b.int("long long int", 8);
    let pid_t = b.typedef("pid_t", i32_);
    let comm = b.array(u8_, i32_, 16);
    let void_ptr = b.ptr(0);
    let atomic_long = b.strukt("", 8, &[("counter", s64, 0)]);
    let atomic_long_t = b.typedef("atomic_long_t", atomic_long);
    let kernfs_id = if modern {
        u64_
    } else {
        let inner = b.strukt("", 8, &[("ino", i32_, 0), ("generation", i32_, 4)]);
        b.union("kernfs_node_id", 8, &[("", inner, 0), ("id", u64_, 0)])
    };
    let _kn = b.strukt(
        "kernfs_node",
        128,
        &[
            ("count", i32_, 0),
            ("parent", void_ptr, 8),
            ("id", kernfs_id, 96),
        ],
    );
    let _cgroup = b.strukt("cgroup", 2048, &[("self", u64_, 0), ("kn", void_ptr, 264)]);
    let _css_set = b.strukt(
        "css_set",
        512,
        &[("subsys", void_ptr, 0), ("dfl_cgrp", void_ptr, 136)],
    );
    let _signal = b.strukt(
        "signal_struct",
        1024,
        &[
            ("sigcnt", i32_, 0),
            ("oom_score_adj", i16_, 730),
            ("oom_score_adj_min", i16_, 732),
        ],
    );
    let rss_stat = if modern {
        let pcpu = b.strukt(
            "percpu_counter",
            40,
            &[
                ("lock", i32_, 0),
                ("count", s64, 8),
                ("list", u64_, 16),
                ("counters", void_ptr, 32),
            ],
        );
        b.array(pcpu, i32_, 4)
    } else {
        let arr = b.array(atomic_long_t, i32_, 4);
        b.strukt("mm_rss_stat", 32, &[("count", arr, 0)])
    };
    let mm_inner = b.strukt(
        "",
        1200,
        &[
            ("mmap_base", u64_, 0),
            ("pgtables_bytes", atomic_long_t, 96),
            ("total_vm", u64_, 200),
            ("rss_stat", rss_stat, 704),
        ],
    );
    let _mm = b.strukt("mm_struct", 1300, &[("", mm_inner, 64)]);
    let u32_ = b.int("unsigned int", 4);
    let _pid = b.strukt(
        "pid",
        112,
        &[("count", i32_, 0), ("level", u32_, 4), ("lock", i32_, 8)],
    );
    // kernel_cap_t: a typedef of an anonymous `struct { u64 val; }` since 6.3; before,
    // of `struct kernel_cap_struct { __u32 cap[2]; }`.
    let cap = if modern {
        let s = b.strukt("", 8, &[("val", u64_, 0)]);
        b.typedef("kernel_cap_t", s)
    } else {
        let arr = b.array(u32_, i32_, 2);
        let s = b.strukt("kernel_cap_struct", 8, &[("cap", arr, 0)]);
        b.typedef("kernel_cap_t", s)
    };
    let _cred = b.strukt(
        "cred",
        184,
        &[
            ("usage", i32_, 0),
            ("cap_inheritable", cap, 40),
            ("cap_permitted", cap, 48),
            ("cap_effective", cap, 56),
            ("user_ns", void_ptr, 136),
        ],
    );
    let _user_ns = b.strukt(
        "user_namespace",
        632,
        &[("parent", void_ptr, 216), ("level", i32_, 224)],
    );
    let _task = b.strukt(
        "task_struct",
        9000,
        &[
            ("mm", void_ptr, 2352),
            ("pid", pid_t, 2480),
            ("tgid", pid_t, 2484),
            ("thread_pid", void_ptr, 2600),
            ("cred", void_ptr, 2960),
            ("comm", comm, 3000),
            ("signal", void_ptr, 3100),
            ("cgroups", void_ptr, 3400),
        ],
    );
    b.enumeration(
        "",
        &[
            ("MM_FILEPAGES", 0),
            ("MM_ANONPAGES", 1),
            ("MM_SWAPENTS", 2),
            ("MM_SHMEMPAGES", 3),
        ],
    );
    let task_ptr = b.ptr(_task);
    let uid_t = b.typedef("uid_t", u32_);
    let proto = b.func_proto(&[void_ptr, task_ptr, uid_t]);
    let fptr = b.ptr(proto);
    b.typedef("btf_trace_mark_victim", fptr);
    b.build()
}

#[test]
fn reads_the_prototype_among_kernel_structs() {
    for modern in [true, false] {
        let btf = Btf::parse(&mini_kernel(modern)).unwrap();
        assert!(btf.has_raw_tracepoint("mark_victim"));
        assert!(!btf.has_raw_tracepoint("mark_victims"));
        assert_eq!(
            btf.raw_tracepoint_args("mark_victim"),
            Some(vec!["struct task_struct *".to_owned(), "uid_t".to_owned()])
        );
        assert_eq!(btf.raw_tracepoint_args("mark_victims"), None);
    }
}

/// Before `mark_victim` passed the task, its raw tracepoint existed with `TP_PROTO(int pid)`.
#[test]
fn raw_tracepoint_prototypes_are_read() {
    let mut b = Builder::new();
    let i32_ = b.int("int", 4);
    let void_ptr = b.ptr(0);
    let old = b.func_proto(&[void_ptr, i32_]);
    let old_ptr = b.ptr(old);
    b.typedef("btf_trace_mark_victim", old_ptr);
    // A typedef that does not point to a prototype is no raw tracepoint.
    b.typedef("btf_trace_odd", i32_);
    let btf = Btf::parse(&b.build()).unwrap();
    assert_eq!(
        btf.raw_tracepoint_args("mark_victim"),
        Some(vec!["int".to_owned()])
    );
    assert_eq!(btf.raw_tracepoint_args("odd"), None);
    // The probe's own `void *__data` is never part of the answer; a `void *` argument is.
    let mut b = Builder::new();
    let void_ptr = b.ptr(0);
    let proto = b.func_proto(&[void_ptr, void_ptr]);
    let p = b.ptr(proto);
    b.typedef("btf_trace_x", p);
    let btf = Btf::parse(&b.build()).unwrap();
    assert_eq!(
        btf.raw_tracepoint_args("x"),
        Some(vec!["void *".to_owned()])
    );
}

#[test]
fn malformed_blobs_are_errors() {
    let good = mini_kernel(true);
    assert!(matches!(
        Btf::parse(&[0x9f, 0xeb]).unwrap_err(),
        BtfError::Truncated { .. }
    ));
    let mut bad_magic = good.clone();
    bad_magic[0] = 0;
    assert!(matches!(
        Btf::parse(&bad_magic).unwrap_err(),
        BtfError::BadMagic { .. }
    ));
    // Every truncation either parses (cut at a type boundary is impossible here since the
    // header names the section lengths) or is an error: never a panic.
    for len in 0..good.len() {
        assert!(Btf::parse(&good[..len]).is_err(), "len {len}");
    }
    // An unknown kind.
    let mut b = Builder::new();
    b.push(&[0, 31 << 24, 0]);
    assert_eq!(
        Btf::parse(&b.build()).unwrap_err(),
        BtfError::UnknownKind { id: 1, kind: 31 }
    );
    // A typedef pointing at a type that does not exist.
    let mut b = Builder::new();
    b.typedef("btf_trace_x", 99);
    let btf = Btf::parse(&b.build()).unwrap();
    assert_eq!(
        btf.resolve(1).unwrap_err(),
        BtfError::DanglingType { id: 1, target: 99 }
    );
    assert_eq!(btf.raw_tracepoint_args("x"), None);
}

#[test]
fn typedef_cycles_are_bounded() {
    let mut b = Builder::new();
    // typedef 1 -> 2, typedef 2 -> 1
    b.typedef("btf_trace_a", 2);
    b.typedef("b", 1);
    let btf = Btf::parse(&b.build()).unwrap();
    assert_eq!(btf.resolve(1).unwrap_err(), BtfError::TooDeep { id: 1 });
    assert_eq!(btf.raw_tracepoint_args("a"), None);
}
