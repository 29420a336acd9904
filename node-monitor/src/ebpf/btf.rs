//! Just enough of a BTF reader to resolve kernel struct offsets at load time.
//!
//! Rust eBPF emits no CO-RE relocations, so the programs read kernel structs at offsets the agent
//! resolves here from the running kernel's BTF (`/sys/kernel/btf/vmlinux`) and writes into a map.
//! The format is the kernel's (Documentation/bpf/btf.rst, include/uapi/linux/btf.h): a header,
//! a type section (each `struct btf_type` followed by kind-specific data) and a string section.
//! Parsing is pure (bytes in, types out) and never panics on malformed input.
use std::collections::HashMap;

use node_monitor_common::config::TaskOffsets;

/// Why BTF could not be read or a layout not resolved.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("btf is truncated: {what} needs {need} bytes at offset {at}, have {have}")]
    Truncated {
        what: &'static str,
        at: usize,
        need: usize,
        have: usize,
    },
    #[error("btf magic is {found:#06x}, expected 0xeb9f (little-endian BTF)")]
    BadMagic { found: u16 },
    #[error("btf type {id} has unknown kind {kind}")]
    UnknownKind { id: u32, kind: u32 },
    #[error("btf type {id} refers to missing type {target}")]
    DanglingType { id: u32, target: u32 },
    #[error("btf has no struct {name}")]
    NoStruct { name: String },
    #[error("struct {strukt} has no member {member}")]
    NoMember { strukt: String, member: String },
    #[error("{what} is not byte-aligned (bit offset {bits})")]
    Bitfield { what: String, bits: u32 },
    #[error("{what}: expected {expected}, found {found}")]
    Unexpected {
        what: String,
        expected: &'static str,
        found: String,
    },
    #[error("btf has no enumerator {name}")]
    NoEnumerator { name: String },
    #[error("type chain from {id} is too deep or cyclic")]
    TooDeep { id: u32 },
}

const BTF_MAGIC: u16 = 0xeb9f;

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

#[derive(Debug, Clone, PartialEq, Eq)]
struct Member {
    name_off: u32,
    ty: u32,
    /// In bits.
    offset_bits: u32,
    bitfield: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Type {
    Int {
        size: u32,
    },
    Ptr {
        ty: u32,
    },
    Array {
        elem: u32,
        nelems: u32,
    },
    Struct {
        size: u32,
        members: Vec<Member>,
    },
    Union {
        size: u32,
        members: Vec<Member>,
    },
    Enum {
        size: u32,
    },
    Fwd,
    Typedef {
        ty: u32,
    },
    /// volatile, const, restrict, type_tag: transparent for layout.
    Modifier {
        ty: u32,
    },
    Float {
        size: u32,
    },
    /// A function prototype's parameter types (raw tracepoints' `btf_trace_<name>` point to one).
    FuncProto {
        params: Vec<u32>,
    },
    /// func, var, datasec, decl_tag: never part of a struct layout.
    Other,
}

#[derive(Debug, Clone)]
struct Entry {
    name_off: u32,
    ty: Type,
}

/// A parsed BTF blob.
#[derive(Debug, Clone)]
pub struct Btf {
    /// Index 0 is `void` (type ids start at 1).
    types: Vec<Entry>,
    strings: Vec<u8>,
    /// Enumerator name → value (first wins), filled while parsing.
    enumerators: HashMap<String, i64>,
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn u32(&mut self, what: &'static str) -> Result<u32, BtfError> {
        let v = read_u32(self.bytes, self.at, what)?;
        self.at += 4;
        Ok(v)
    }
}

fn read_u32(bytes: &[u8], at: usize, what: &'static str) -> Result<u32, BtfError> {
    let b = bytes
        .get(at..at.saturating_add(4))
        .filter(|b| b.len() == 4)
        .ok_or(BtfError::Truncated {
            what,
            at,
            need: 4,
            have: bytes.len().saturating_sub(at),
        })?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn section<'a>(
    bytes: &'a [u8],
    start: usize,
    len: usize,
    what: &'static str,
) -> Result<&'a [u8], BtfError> {
    bytes
        .get(start..start.saturating_add(len))
        .filter(|s| s.len() == len)
        .ok_or(BtfError::Truncated {
            what,
            at: start,
            need: len,
            have: bytes.len().saturating_sub(start),
        })
}

impl Btf {
    /// Parses little-endian BTF (what x86-64 and arm64 kernels expose).
    pub fn parse(bytes: &[u8]) -> Result<Self, BtfError> {
        let magic_bytes = section(bytes, 0, 2, "header magic")?;
        let magic = u16::from_le_bytes([magic_bytes[0], magic_bytes[1]]);
        if magic != BTF_MAGIC {
            return Err(BtfError::BadMagic { found: magic });
        }
        let hdr_len = read_u32(bytes, 4, "header length")? as usize;
        let type_off = read_u32(bytes, 8, "header type_off")? as usize;
        let type_len = read_u32(bytes, 12, "header type_len")? as usize;
        let str_off = read_u32(bytes, 16, "header str_off")? as usize;
        let str_len = read_u32(bytes, 20, "header str_len")? as usize;
        let types_bytes = section(
            bytes,
            hdr_len.saturating_add(type_off),
            type_len,
            "type section",
        )?;
        let strings = section(
            bytes,
            hdr_len.saturating_add(str_off),
            str_len,
            "string section",
        )?
        .to_vec();

        let mut btf = Self {
            types: vec![Entry {
                name_off: 0,
                ty: Type::Other,
            }],
            strings,
            enumerators: HashMap::new(),
        };
        let mut r = Reader {
            bytes: types_bytes,
            at: 0,
        };
        while r.at < types_bytes.len() {
            let id = btf.types.len() as u32;
            let name_off = r.u32("btf_type.name_off")?;
            let info = r.u32("btf_type.info")?;
            let size_or_type = r.u32("btf_type.size")?;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let kind_flag = info >> 31 == 1;
            let ty = match kind {
                1 => {
                    r.u32("int encoding")?;
                    Type::Int { size: size_or_type }
                }
                2 => Type::Ptr { ty: size_or_type },
                3 => {
                    let elem = r.u32("array.type")?;
                    r.u32("array.index_type")?;
                    let nelems = r.u32("array.nelems")?;
                    Type::Array { elem, nelems }
                }
                4 | 5 => {
                    let mut members = Vec::with_capacity(vlen);
                    for _ in 0..vlen {
                        let name_off = r.u32("member.name_off")?;
                        let ty = r.u32("member.type")?;
                        let raw = r.u32("member.offset")?;
                        // With kind_flag, the high 8 bits are the bitfield size.
                        let (offset_bits, bitfield) = if kind_flag {
                            (raw & 0x00ff_ffff, raw >> 24 != 0)
                        } else {
                            (raw, false)
                        };
                        members.push(Member {
                            name_off,
                            ty,
                            offset_bits,
                            bitfield,
                        });
                    }
                    if kind == 4 {
                        Type::Struct {
                            size: size_or_type,
                            members,
                        }
                    } else {
                        Type::Union {
                            size: size_or_type,
                            members,
                        }
                    }
                }
                6 | 19 => {
                    for _ in 0..vlen {
                        let name = r.u32("enum.name_off")?;
                        let lo = r.u32("enum.val")?;
                        let value = if kind == 19 {
                            let hi = r.u32("enum64.val_hi32")?;
                            ((u64::from(hi) << 32) | u64::from(lo)) as i64
                        } else {
                            i64::from(lo as i32)
                        };
                        if let Some(n) = btf.str_at(name) {
                            btf.enumerators.entry(n.to_owned()).or_insert(value);
                        }
                    }
                    Type::Enum { size: size_or_type }
                }
                7 => Type::Fwd,
                8 => Type::Typedef { ty: size_or_type },
                9 | 10 | 11 | 18 => Type::Modifier { ty: size_or_type },
                12 => Type::Other,
                13 => {
                    let mut params = Vec::with_capacity(vlen);
                    for _ in 0..vlen {
                        r.u32("param.name_off")?;
                        params.push(r.u32("param.type")?);
                    }
                    Type::FuncProto { params }
                }
                14 => {
                    r.u32("var.linkage")?;
                    Type::Other
                }
                15 => {
                    for _ in 0..vlen {
                        r.u32("datasec.type")?;
                        r.u32("datasec.offset")?;
                        r.u32("datasec.size")?;
                    }
                    Type::Other
                }
                16 => Type::Float { size: size_or_type },
                17 => {
                    r.u32("decl_tag.component_idx")?;
                    Type::Other
                }
                kind => return Err(BtfError::UnknownKind { id, kind }),
            };
            btf.types.push(Entry { name_off, ty });
        }
        Ok(btf)
    }

    fn str_at(&self, off: u32) -> Option<&str> {
        let rest = self.strings.get(off as usize..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&rest[..end]).ok()
    }

    fn name(&self, id: u32) -> &str {
        self.types
            .get(id as usize)
            .and_then(|e| self.str_at(e.name_off))
            .unwrap_or("")
    }

    fn entry(&self, from: u32, id: u32) -> Result<&Entry, BtfError> {
        self.types.get(id as usize).ok_or(BtfError::DanglingType {
            id: from,
            target: id,
        })
    }

    /// Follows typedefs and modifiers to the underlying type.
    fn resolve(&self, id: u32) -> Result<u32, BtfError> {
        let mut cur = id;
        for _ in 0..32 {
            match &self.entry(id, cur)?.ty {
                Type::Typedef { ty } | Type::Modifier { ty } => cur = *ty,
                _ => return Ok(cur),
            }
        }
        Err(BtfError::TooDeep { id })
    }

    fn size_of(&self, id: u32) -> Result<u32, BtfError> {
        let rid = self.resolve(id)?;
        match &self.entry(id, rid)?.ty {
            Type::Int { size }
            | Type::Struct { size, .. }
            | Type::Union { size, .. }
            | Type::Enum { size }
            | Type::Float { size } => Ok(*size),
            Type::Ptr { .. } => Ok(8),
            Type::Array { elem, nelems } => Ok(self.size_of(*elem)?.saturating_mul(*nelems)),
            other => Err(BtfError::Unexpected {
                what: format!("size of type {id}"),
                expected: "a sized type",
                found: format!("{other:?}"),
            }),
        }
    }

    /// The id of the complete struct named `name`.
    pub fn struct_id(&self, name: &str) -> Result<u32, BtfError> {
        self.types
            .iter()
            .enumerate()
            .find(|(_, e)| {
                matches!(e.ty, Type::Struct { .. }) && self.str_at(e.name_off) == Some(name)
            })
            .map(|(i, _)| i as u32)
            .ok_or_else(|| BtfError::NoStruct {
                name: name.to_owned(),
            })
    }

    fn members(&self, id: u32) -> Option<&[Member]> {
        match &self.types.get(id as usize)?.ty {
            Type::Struct { members, .. } | Type::Union { members, .. } => Some(members),
            _ => None,
        }
    }

    /// Finds `member` in struct/union `id`, descending into anonymous struct/union members
    /// (`mm_struct` keeps its fields in one). Returns (bit offset, member type).
    fn find_member(&self, id: u32, member: &str, depth: u32) -> Option<(u32, u32, bool)> {
        if depth > 8 {
            return None;
        }
        for m in self.members(id)? {
            let name = self.str_at(m.name_off).unwrap_or("");
            if name == member {
                return Some((m.offset_bits, m.ty, m.bitfield));
            }
            if name.is_empty()
                && let Ok(inner) = self.resolve(m.ty)
                && let Some((off, ty, bf)) = self.find_member(inner, member, depth + 1)
            {
                return Some((m.offset_bits + off, ty, bf));
            }
        }
        None
    }

    /// Byte offset and type of `member` in the struct or union `id`.
    fn member(&self, id: u32, member: &str) -> Result<(u32, u32), BtfError> {
        let (bits, ty, bitfield) =
            self.find_member(id, member, 0)
                .ok_or_else(|| BtfError::NoMember {
                    strukt: self.name(id).to_owned(),
                    member: member.to_owned(),
                })?;
        if bitfield || bits % 8 != 0 {
            return Err(BtfError::Bitfield {
                what: format!("{}.{member}", self.name(id)),
                bits,
            });
        }
        Ok((bits / 8, ty))
    }

    /// Byte offset of `strukt.member`.
    pub fn member_offset(&self, strukt: &str, member: &str) -> Result<u32, BtfError> {
        Ok(self.member(self.struct_id(strukt)?, member)?.0)
    }

    /// The value of an enumerator (e.g. `MM_ANONPAGES`).
    pub fn enumerator(&self, name: &str) -> Result<i64, BtfError> {
        self.enumerators
            .get(name)
            .copied()
            .ok_or_else(|| BtfError::NoEnumerator {
                name: name.to_owned(),
            })
    }

    /// Whether the kernel has a tracepoint `name` that raw tracepoints can attach to: every
    /// `DECLARE_TRACE` leaves a `btf_trace_<name>` typedef (include/trace/bpf_probe.h).
    pub fn has_raw_tracepoint(&self, name: &str) -> bool {
        let want = format!("btf_trace_{name}");
        self.types
            .iter()
            .any(|e| matches!(e.ty, Type::Typedef { .. }) && self.str_at(e.name_off) == Some(&want))
    }

    /// The argument types of raw tracepoint `name` (its `TP_PROTO`) as C spells them
    /// (`struct task_struct *`, `uid_t`, `int`). `btf_trace_<name>` is a pointer to a prototype
    /// whose first parameter is the probe's `void *__data` (include/trace/bpf_probe.h), left
    /// out here. A tracepoint's prototype can change between kernels while its name stays:
    /// `mark_victim` passed only the victim's pid before it passed the task. `None` when the
    /// typedef is missing or not of that shape.
    pub fn raw_tracepoint_args(&self, name: &str) -> Option<Vec<String>> {
        let want = format!("btf_trace_{name}");
        let id = self.types.iter().position(|e| {
            matches!(e.ty, Type::Typedef { .. }) && self.str_at(e.name_off) == Some(&want)
        })?;
        let ptr = self.resolve(u32::try_from(id).ok()?).ok()?;
        let Type::Ptr { ty } = self.types.get(ptr as usize)?.ty else {
            return None;
        };
        let proto = self.resolve(ty).ok()?;
        let Type::FuncProto { params } = &self.types.get(proto as usize)?.ty else {
            return None;
        };
        Some(params.iter().skip(1).map(|p| self.c_type(*p)).collect())
    }

    /// A type as C spells it: pointers and modifiers unwrapped, typedef names kept.
    fn c_type(&self, id: u32) -> String {
        let (mut cur, mut pointers) = (id, 0);
        for _ in 0..32 {
            match self.types.get(cur as usize).map(|e| &e.ty) {
                Some(Type::Modifier { ty }) => cur = *ty,
                Some(Type::Ptr { ty }) => {
                    pointers += 1;
                    cur = *ty;
                }
                _ => break,
            }
        }
        let base = match self.types.get(cur as usize).map(|e| &e.ty) {
            _ if cur == 0 => "void".to_owned(),
            Some(Type::Struct { .. } | Type::Fwd) => format!("struct {}", self.name(cur)),
            Some(Type::Union { .. }) => format!("union {}", self.name(cur)),
            Some(Type::Enum { .. }) => format!("enum {}", self.name(cur)),
            _ => self.name(cur).to_owned(),
        };
        match pointers {
            0 => base,
            n => format!("{base} {}", "*".repeat(n)),
        }
    }

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

#[cfg(test)]
pub(crate) mod tests;
