//! The BTF format: the header, the type section (each `struct btf_type` followed by its
//! kind-specific data) and the string section.
use std::collections::HashMap;

use super::{BTF_MAGIC, Btf, BtfError, Entry, Member, Type};

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
            let ty = btf.read_type(&mut r, id)?;
            btf.types.push(Entry { name_off, ty });
        }
        Ok(btf)
    }

    /// Type `id`: the rest of its `struct btf_type` (after `name_off`) and its kind-specific
    /// data. An enum's enumerators go into `self.enumerators`.
    fn read_type(&mut self, r: &mut Reader<'_>, id: u32) -> Result<Type, BtfError> {
        let info = r.u32("btf_type.info")?;
        let size_or_type = r.u32("btf_type.size")?;
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        let kind_flag = info >> 31 == 1;
        Ok(match kind {
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
            4 => Type::Struct {
                size: size_or_type,
                members: read_members(r, vlen, kind_flag)?,
            },
            5 => Type::Union {
                size: size_or_type,
                members: read_members(r, vlen, kind_flag)?,
            },
            6 | 19 => {
                self.read_enumerators(r, vlen, kind == 19)?;
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
        })
    }

    /// The `vlen` enumerators of an enum (`struct btf_enum`) or, with `wide`, of an enum64
    /// (`struct btf_enum64`), into `self.enumerators` (the first of a name wins).
    fn read_enumerators(
        &mut self,
        r: &mut Reader<'_>,
        vlen: usize,
        wide: bool,
    ) -> Result<(), BtfError> {
        for _ in 0..vlen {
            let name = r.u32("enum.name_off")?;
            let lo = r.u32("enum.val")?;
            let value = if wide {
                let hi = r.u32("enum64.val_hi32")?;
                ((u64::from(hi) << 32) | u64::from(lo)) as i64
            } else {
                i64::from(lo as i32)
            };
            if let Some(n) = self.str_at(name) {
                self.enumerators.entry(n.to_owned()).or_insert(value);
            }
        }
        Ok(())
    }
}

/// The `vlen` members of a struct or union (`struct btf_member`).
fn read_members(r: &mut Reader<'_>, vlen: usize, kind_flag: bool) -> Result<Vec<Member>, BtfError> {
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
    Ok(members)
}
