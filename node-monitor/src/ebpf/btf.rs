//! Just enough of a BTF reader to resolve kernel struct offsets at load time.
//!
//! Rust eBPF emits no CO-RE relocations, so the programs read kernel structs at offsets the agent
//! resolves here from the running kernel's BTF (`/sys/kernel/btf/vmlinux`) and writes into a map.
//! The format is the kernel's (Documentation/bpf/btf.rst, include/uapi/linux/btf.h): a header,
//! a type section (each `struct btf_type` followed by kind-specific data) and a string section.
//! Parsing is pure (bytes in, types out) and never panics on malformed input.
use std::collections::HashMap;

pub use self::offsets::WithCaller;

mod offsets;
mod parse;

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

/// The first two bytes of BTF (`BTF_MAGIC` in include/uapi/linux/btf.h), little-endian.
const BTF_MAGIC: u16 = 0xeb9f;

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

impl Btf {
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
}

#[cfg(test)]
pub(crate) mod tests;
