//! Just enough of a BTF reader to read raw tracepoint prototypes from the kernel's BTF
//! (`/sys/kernel/btf/vmlinux`).
//!
//! The programs' reads of kernel structs are CO-RE relocations that aya resolves against the
//! same BTF; aya's BTF type has no public way to walk a function prototype's parameters, so this
//! reader answers the one question the load policy asks beyond that: what a raw tracepoint
//! passes (a tracepoint's prototype can change while its name stays). The format is the kernel's (Documentation/bpf/btf.rst, include/uapi/linux/btf.h): a header,
//! a type section (each `struct btf_type` followed by kind-specific data) and a string section.
//! Parsing is pure (bytes in, types out) and never panics on malformed input.
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
    #[error("type chain from {id} is too deep or cyclic")]
    TooDeep { id: u32 },
}

/// The first two bytes of BTF (`BTF_MAGIC` in include/uapi/linux/btf.h), little-endian.
const BTF_MAGIC: u16 = 0xeb9f;

/// A type, as far as a C spelling needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Type {
    Ptr {
        ty: u32,
    },
    Struct,
    Union,
    Enum,
    Fwd,
    Typedef {
        ty: u32,
    },
    /// volatile, const, restrict, type_tag: transparent for the spelling.
    Modifier {
        ty: u32,
    },
    /// A function prototype's parameter types (raw tracepoints' `btf_trace_<name>` point to one).
    FuncProto {
        params: Vec<u32>,
    },
    /// Named by its name alone (int, float, array, …) or never part of a prototype (func, var,
    /// datasec, decl_tag).
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

    /// Follows typedefs and modifiers to the underlying type.
    fn resolve(&self, id: u32) -> Result<u32, BtfError> {
        let mut cur = id;
        for _ in 0..32 {
            match self.types.get(cur as usize).map(|e| &e.ty) {
                Some(Type::Typedef { ty } | Type::Modifier { ty }) => cur = *ty,
                Some(_) => return Ok(cur),
                None => {
                    return Err(BtfError::DanglingType { id, target: cur });
                }
            }
        }
        Err(BtfError::TooDeep { id })
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
            Some(Type::Struct | Type::Fwd) => format!("struct {}", self.name(cur)),
            Some(Type::Union) => format!("union {}", self.name(cur)),
            Some(Type::Enum) => format!("enum {}", self.name(cur)),
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
