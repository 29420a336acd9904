//! File reads for the hot path: one reusable path buffer and one reusable content buffer, so a
//! pass over hundreds of cgroup files allocates nothing once the buffers have grown.
//!
//! Files read on every pass can be kept open in a slot and re-read with `pread` at offset 0:
//! opening a cgroup file costs more than reading it (kernfs allocates a seq_file per open), so
//! this cuts a pass over hundreds of pods to a fraction. A kept file whose cgroup went away
//! fails (ENODEV); it is dropped and opened again, which then reports the cgroup gone.

use std::{
    fs::File,
    io,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
};

use super::{SamplerError, parse::ParseError};

/// Where a read may keep its file open. `None`: open, read, close.
pub(crate) type Slot<'a> = Option<&'a mut Option<File>>;

/// The files of one cgroup that a pass reads, kept open between passes.
#[derive(Debug, Default)]
pub(crate) struct CgroupFiles {
    pub usage: Option<File>,
    pub stat: Option<File>,
    pub limit: Option<File>,
    pub pids: Option<File>,
}

impl CgroupFiles {
    /// How many descriptors a pod's files take at most.
    pub const PER_POD: usize = 3;
}

#[derive(Debug, Default)]
pub(crate) struct Reader {
    path: PathBuf,
    buf: Vec<u8>,
}

impl Reader {
    /// Reads `dir/file` and returns it as text.
    pub fn read(&mut self, slot: Slot<'_>, dir: &Path, file: &str) -> Result<&str, SamplerError> {
        self.path.as_mut_os_string().clear();
        self.path.push(dir);
        self.path.push(file);
        let n = fill(&self.path, slot, &mut self.buf)?;
        text(&self.path, &self.buf[..n])
    }

    /// Reads `path` and returns it as text.
    pub fn read_path(&mut self, slot: Slot<'_>, path: &Path) -> Result<&str, SamplerError> {
        let n = fill(path, slot, &mut self.buf)?;
        text(path, &self.buf[..n])
    }

    /// The path of the last [`Reader::read`], for error messages.
    pub fn last_path(&self) -> &Path {
        &self.path
    }

    /// Reads and parses `dir/file`; parse errors name the file.
    pub fn parse<T>(
        &mut self,
        slot: Slot<'_>,
        dir: &Path,
        file: &str,
        parse: impl FnOnce(&str) -> Result<T, ParseError>,
    ) -> Result<T, SamplerError> {
        let text = self.read(slot, dir, file)?;
        parse(text).map_err(|source| SamplerError::Parse {
            path: self.path.clone(),
            source,
        })
    }

    /// Reads and parses `path`; parse errors name the file.
    pub fn parse_path<T>(
        &mut self,
        slot: Slot<'_>,
        path: &Path,
        parse: impl FnOnce(&str) -> Result<T, ParseError>,
    ) -> Result<T, SamplerError> {
        let text = self.read_path(slot, path)?;
        parse(text).map_err(|source| SamplerError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }
}

fn text<'a>(path: &Path, bytes: &'a [u8]) -> Result<&'a str, SamplerError> {
    std::str::from_utf8(bytes).map_err(|_| SamplerError::NotUtf8 {
        path: path.to_path_buf(),
    })
}

fn fill(path: &Path, slot: Slot<'_>, buf: &mut Vec<u8>) -> Result<usize, SamplerError> {
    let err = |source| SamplerError::Read {
        path: path.to_path_buf(),
        source,
    };
    match slot {
        Some(slot) => {
            if let Some(f) = slot.as_ref() {
                match read_all_at(f, buf) {
                    Ok(n) => return Ok(n),
                    // Stale (the cgroup was removed, maybe re-created): open it again.
                    Err(_) => *slot = None,
                }
            }
            let f = File::open(path).map_err(err)?;
            let n = read_all_at(&f, buf).map_err(err)?;
            *slot = Some(f);
            Ok(n)
        }
        None => {
            let f = File::open(path).map_err(err)?;
            read_all_at(&f, buf).map_err(err)
        }
    }
}

/// The whole file from offset 0, into `buf` (grown as needed, never shrunk); returns the length.
fn read_all_at(f: &File, buf: &mut Vec<u8>) -> io::Result<usize> {
    if buf.len() < 4096 {
        buf.resize(4096, 0);
    }
    let mut n = 0;
    loop {
        if n == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match f.read_at(&mut buf[n..], n as u64) {
            Ok(0) => return Ok(n),
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Whether a read failed because the cgroup (or file) is gone: a pod that terminated between
/// discovery and reading is not an error. Removed cgroups answer ENOENT, or ENODEV for a file
/// that was open when the directory went away.
pub(crate) fn is_gone(e: &SamplerError) -> bool {
    match e {
        SamplerError::Read { source, .. } => {
            source.kind() == io::ErrorKind::NotFound || source.raw_os_error() == Some(libc::ENODEV)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::{parse::parse_single_u64, warn::ErrorChain};

    #[test]
    fn reads_reuse_buffers_and_name_paths_in_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        std::fs::write(d.join("a"), "12\n").expect("write");
        std::fs::write(d.join("bad"), [0xff, 0xfe]).expect("write");
        let mut r = Reader::default();
        assert_eq!(r.read(None, d, "a").expect("reads"), "12\n");
        let v = r.parse(None, d, "a", |t| parse_single_u64("a", t));
        assert_eq!(v.expect("parses"), 12);
        // A kept file is re-read from offset 0 and sees new content.
        let mut slot = None;
        assert_eq!(r.read(Some(&mut slot), d, "a").expect("reads"), "12\n");
        assert!(slot.is_some());
        std::fs::write(d.join("a"), "345678\n").expect("write");
        assert_eq!(r.read(Some(&mut slot), d, "a").expect("reads"), "345678\n");
        // Larger than the initial buffer, then smaller again.
        let big = "x".repeat(10_000);
        std::fs::write(d.join("big"), &big).expect("write");
        assert_eq!(r.read(None, d, "big").expect("reads"), big);
        assert_eq!(r.read(None, d, "a").expect("reads"), "345678\n");
        let missing = r.read(None, d, "missing").expect_err("missing file");
        assert!(is_gone(&missing));
        assert!(missing.to_string().contains("missing"), "{missing}");
        let not_utf8 = r.read(None, d, "bad").expect_err("not utf-8");
        assert!(matches!(not_utf8, SamplerError::NotUtf8 { .. }));
        assert!(!is_gone(&not_utf8));
        let parse = r
            .parse(None, d, "bad", |_| Ok(()))
            .expect_err("not utf-8 before parsing");
        assert!(matches!(parse, SamplerError::NotUtf8 { .. }));
        std::fs::write(d.join("word"), "abc\n").expect("write");
        let e = r
            .parse(None, d, "word", |t| parse_single_u64("word", t))
            .expect_err("not a number");
        let msg = ErrorChain(&e).to_string();
        assert!(msg.contains("word") && msg.contains("\"abc\""), "{msg}");
    }
}
