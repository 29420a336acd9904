//! The BTF format: the header, the type section (each `struct btf_type` followed by its
//! kind-specific data) and the string section.
use super::{BTF_MAGIC, Btf, BtfError, Entry, Type};

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

    /// Skips `words` 32-bit words of kind-specific data, which must be there.
    fn skip(&mut self, words: usize, what: &'static str) -> Result<(), BtfError> {
        for _ in 0..words {
            self.u32(what)?;
        }
        Ok(())
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
        };
        let mut r = Reader {
            bytes: types_bytes,
            at: 0,
        };
        while r.at < types_bytes.len() {
            let id = btf.types.len() as u32;
            let name_off = r.u32("btf_type.name_off")?;
            let ty = Self::read_type(&mut r, id)?;
            btf.types.push(Entry { name_off, ty });
        }
        Ok(btf)
    }

    /// Type `id`: the rest of its `struct btf_type` (after `name_off`) and its kind-specific
    /// data, kept only as far as [`Type`] needs it.
    fn read_type(r: &mut Reader<'_>, id: u32) -> Result<Type, BtfError> {
        let info = r.u32("btf_type.info")?;
        let size_or_type = r.u32("btf_type.size")?;
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        Ok(match kind {
            1 => {
                r.u32("int encoding")?;
                Type::Other
            }
            2 => Type::Ptr { ty: size_or_type },
            3 => {
                r.skip(3, "btf_array")?;
                Type::Other
            }
            4 => {
                r.skip(3 * vlen, "btf_member")?;
                Type::Struct
            }
            5 => {
                r.skip(3 * vlen, "btf_member")?;
                Type::Union
            }
            6 => {
                r.skip(2 * vlen, "btf_enum")?;
                Type::Enum
            }
            19 => {
                r.skip(3 * vlen, "btf_enum64")?;
                Type::Enum
            }
            7 => Type::Fwd,
            8 => Type::Typedef { ty: size_or_type },
            9 | 10 | 11 | 18 => Type::Modifier { ty: size_or_type },
            12 | 16 => Type::Other,
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
                r.skip(3 * vlen, "btf_var_secinfo")?;
                Type::Other
            }
            17 => {
                r.u32("decl_tag.component_idx")?;
                Type::Other
            }
            kind => return Err(BtfError::UnknownKind { id, kind }),
        })
    }
}
