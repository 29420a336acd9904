//! Bounded input and pipe-safe output for the subcommands and the configuration readers.
//!
//! A configuration file or snapshot is read only if it is a regular file, and only up to a bound:
//! `/dev/zero`, a FIFO or a runaway file gets an error that names the path, never an unbounded
//! read or a process blocked on an open. Output to a pipe whose reader went away
//! (`node-monitor check-config | head -1`) ends the command quietly, as for any Unix filter.
//! Files the agent writes on the host are replaced atomically ([`write_atomically`]).
use std::{
    io::{self, Read, Write},
    path::{Path, PathBuf},
};

/// The largest configuration file or snapshot read: far above any real one.
pub const MAX_INPUT_BYTES: u64 = 4 * 1024 * 1024;

/// Why an input could not be read. Each message names the path.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{what} {path} is not a regular file ({kind}); refusing to read it")]
    NotAFile {
        what: &'static str,
        path: PathBuf,
        kind: &'static str,
    },
    #[error("{what} {path} is larger than {limit} bytes; refusing to read it")]
    TooLarge {
        what: &'static str,
        path: PathBuf,
        limit: u64,
    },
    #[error("{what} {path} is not UTF-8 text")]
    NotText { what: &'static str, path: PathBuf },
}

fn kind_of(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Reads the regular file at `path` as UTF-8, at most `limit` bytes. `what` names the input in
/// errors ("the config file").
pub fn read_file_bounded(
    path: &Path,
    what: &'static str,
    limit: u64,
) -> Result<String, InputError> {
    let io_err = |source| InputError::Io {
        what,
        path: path.to_owned(),
        source,
    };
    // stat first: opening a FIFO would block until a writer appears.
    let meta = std::fs::metadata(path).map_err(io_err)?;
    if !meta.file_type().is_file() {
        return Err(InputError::NotAFile {
            what,
            path: path.to_owned(),
            kind: kind_of(meta.file_type()),
        });
    }
    let file = std::fs::File::open(path).map_err(io_err)?;
    read_bounded(file, path, what, limit)
}

/// Reads a procfs or cgroupfs file up to `limit` bytes: such files report a size of 0, so no
/// `stat` bounds them, and a tenant decides how long some are (its mounts in `mountinfo`, its
/// processes in `cgroup.procs`). `Ok(None)` when the file is longer than `limit`.
pub fn read_proc_bounded(path: &Path, limit: u64) -> io::Result<Option<Vec<u8>>> {
    let file = std::fs::File::open(path)?;
    let mut out = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut out)?;
    Ok((out.len() as u64 <= limit).then_some(out))
}

/// Checks, without opening it, that `path` is a regular file of at most `limit` bytes: for
/// readers that open the file themselves (kube's kubeconfig loader), which would otherwise block
/// on a FIFO or read a runaway file whole.
pub fn check_regular_file(path: &Path, what: &'static str, limit: u64) -> Result<(), InputError> {
    let meta = std::fs::metadata(path).map_err(|source| InputError::Io {
        what,
        path: path.to_owned(),
        source,
    })?;
    if !meta.file_type().is_file() {
        return Err(InputError::NotAFile {
            what,
            path: path.to_owned(),
            kind: kind_of(meta.file_type()),
        });
    }
    if meta.len() > limit {
        return Err(InputError::TooLarge {
            what,
            path: path.to_owned(),
            limit,
        });
    }
    Ok(())
}

/// Reads standard input as UTF-8, at most `limit` bytes.
pub fn read_stdin_bounded(what: &'static str, limit: u64) -> Result<String, InputError> {
    read_bounded(io::stdin().lock(), Path::new("-"), what, limit)
}

fn read_bounded(
    r: impl Read,
    path: &Path,
    what: &'static str,
    limit: u64,
) -> Result<String, InputError> {
    let mut bytes = Vec::new();
    r.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| InputError::Io {
            what,
            path: path.to_owned(),
            source,
        })?;
    if bytes.len() as u64 > limit {
        return Err(InputError::TooLarge {
            what,
            path: path.to_owned(),
            limit,
        });
    }
    String::from_utf8(bytes).map_err(|_| InputError::NotText {
        what,
        path: path.to_owned(),
    })
}

/// Whether `e` (anywhere in its chain) is a write to a pipe whose reader is gone.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// `text` with every control character a terminal could act on written as a `\u00XX` escape: C0
/// controls but newline and tab, DEL, and the C1 controls (U+0080–U+009F, among them the 8-bit
/// CSI). Process names, pod names and kernel strings are chosen by workloads; printed as they
/// are, an escape sequence in one would move the operator's cursor, rewrite the screen or set
/// the terminal's title. The escape is valid in a JSON string, so JSON output stays JSON.
pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char =
        |c: char| (c.is_control() && c != '\n' && c != '\t') || ('\u{80}'..='\u{9f}').contains(&c);
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Prints `text` and a newline on stdout, its control characters escaped
/// ([`terminal_safe`]). A closed pipe is not an error: the reader has what it wanted.
pub fn print_line(text: &str) -> io::Result<()> {
    let text = terminal_safe(text);
    let mut out = io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

/// Replaces `dir/name` with `contents` atomically: written to `dir/.<name>.tmp`, synced, renamed
/// over it, then the directory synced, so a reader or a crash sees the old file or the new one,
/// never half of either.
pub fn write_atomically(dir: &Path, name: &str, contents: &[u8]) -> io::Result<PathBuf> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(contents)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, &path)?;
    // The rename itself is durable once the directory is synced.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    /// A workload's escape sequences reach no terminal: C0 (ESC, BEL, CR) and C1 (CSI) controls
    /// and DEL are written as `\u00XX`; newlines, tabs and other text stay as they are; a JSON
    /// string with such an escape still parses to the original characters.
    #[test]
    fn control_characters_are_escaped_for_terminals() {
        use super::terminal_safe;
        assert_eq!(terminal_safe("pod web-1\tok\nnext"), "pod web-1\tok\nnext");
        assert_eq!(
            terminal_safe("comm=\u{1b}]0;owned\u{7}x\r\u{9b}2J\u{7f}é"),
            "comm=\\u001b]0;owned\\u0007x\\u000d\\u009b2J\\u007fé"
        );
        let json = serde_json::json!({"comm": "a\u{9b}b"}).to_string();
        let safe = terminal_safe(&json);
        assert!(!safe.contains('\u{9b}'), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe).expect("still JSON");
        assert_eq!(back["comm"], "a\u{9b}b");
    }

    #[test]
    fn proc_files_are_read_up_to_their_bound() {
        let dir = tempfile::tempdir().expect("dir");
        let f = dir.path().join("mountinfo");
        std::fs::write(&f, "0123456789").expect("write");
        assert_eq!(
            read_proc_bounded(&f, 10).expect("read").as_deref(),
            Some(b"0123456789".as_slice())
        );
        assert_eq!(
            read_proc_bounded(&f, 9).expect("read"),
            None,
            "one byte over"
        );
        assert!(read_proc_bounded(&dir.path().join("gone"), 9).is_err());
    }

    use super::*;

    #[test]
    fn refuses_devices_fifos_and_directories_naming_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let cases: [(&Path, &str); 3] = [
            (Path::new("/dev/zero"), "a character device"),
            (&fifo, "a FIFO"),
            (dir.path(), "a directory"),
        ];
        for (path, kind) in cases {
            let e = read_file_bounded(path, "the config file", MAX_INPUT_BYTES)
                .expect_err("must be refused");
            let msg = e.to_string();
            assert!(
                msg.contains(kind) && msg.contains(&path.display().to_string()),
                "{msg}"
            );
        }
    }

    #[test]
    fn a_file_read_by_another_reader_is_checked_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("kubeconfig");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let e = check_regular_file(&fifo, "the kubeconfig", MAX_INPUT_BYTES).expect_err("FIFO");
        assert!(e.to_string().contains("a FIFO"), "{e}");
        let big = dir.path().join("big");
        std::fs::write(&big, "x".repeat(101)).expect("write");
        let e = check_regular_file(&big, "the kubeconfig", 100).expect_err("too large");
        assert!(e.to_string().contains("larger than 100 bytes"), "{e}");
        check_regular_file(&big, "the kubeconfig", 101).expect("at the limit");
    }

    #[test]
    fn reads_up_to_the_limit_and_no_further() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, "x".repeat(100)).expect("write");
        assert_eq!(
            read_file_bounded(&path, "the config file", 100)
                .expect("at the limit")
                .len(),
            100
        );
        let e = read_file_bounded(&path, "the config file", 99).expect_err("above the limit");
        assert!(e.to_string().contains("larger than 99 bytes"), "{e}");
        std::fs::write(&path, [0xff, 0xfe]).expect("write");
        let e = read_file_bounded(&path, "the config file", 100).expect_err("not text");
        assert!(e.to_string().contains("not UTF-8"), "{e}");
        let e = read_file_bounded(&dir.path().join("missing"), "the config file", 100)
            .expect_err("missing");
        assert!(e.to_string().contains("missing"), "{e}");
    }

    #[test]
    fn a_broken_pipe_is_recognised_through_context() {
        let e = anyhow::Error::from(io::Error::from(io::ErrorKind::BrokenPipe))
            .context("writing to stdout");
        assert!(is_broken_pipe(&e));
        let other = anyhow::Error::from(io::Error::from(io::ErrorKind::PermissionDenied));
        assert!(!is_broken_pipe(&other));
    }
}
