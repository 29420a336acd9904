//! Tracepoint formats: where each field of a tracepoint's record lives on the running kernel.
//!
//! Tracepoint records are a stable ABI in the sense that fields are not renamed, but offsets move
//! when fields are added (e.g. `oom/mark_victim` grew from `pid` alone to nine fields, and the
//! vmscan `gfp_flags` widened from 4 to 8 bytes). So the agent parses
//! `<tracefs>/events/<category>/<name>/format` (kernel/trace/trace_events.c, `f_show()`) and
//! writes the offsets into a map; the programs read fields where this says they are.
use std::path::{Path, PathBuf};

use node_monitor_common::config::{FieldLoc, TP_MAX_FIELDS, TpLayout, TpSlot, field_flags};

/// One `field:` line of a format file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatField {
    pub name: String,
    /// The declaration as printed (`unsigned long total_vm`, `__data_loc char[] comm`).
    pub decl: String,
    pub offset: u32,
    pub size: u32,
    pub signed: bool,
}

impl FormatField {
    fn is_data_loc(&self) -> bool {
        self.decl.starts_with("__data_loc")
    }
}

/// A parsed format file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TracepointFormat {
    pub name: String,
    pub id: Option<u32>,
    pub fields: Vec<FormatField>,
}

impl TracepointFormat {
    pub fn field(&self, name: &str) -> Option<&FormatField> {
        self.fields.iter().find(|f| f.name == name)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("format line {line}: {what} in {text:?}")]
    BadLine {
        line: usize,
        what: &'static str,
        text: String,
    },
    #[error("format has no fields")]
    NoFields,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("tracepoint {category}/{name} has no field {field}")]
    MissingField {
        category: &'static str,
        name: &'static str,
        field: &'static str,
    },
    #[error("tracepoint {category}/{name} field {field}: {what} {value} does not fit")]
    OutOfRange {
        category: &'static str,
        name: &'static str,
        field: &'static str,
        what: &'static str,
        value: u32,
    },
}

/// Parses a tracefs `format` file. Unknown lines are ignored; malformed `field:` lines are
/// errors naming the line.
pub fn parse_format(text: &str) -> Result<TracepointFormat, FormatError> {
    let mut fmt = TracepointFormat::default();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if let Some(name) = line.strip_prefix("name:") {
            fmt.name = name.trim().to_owned();
        } else if let Some(id) = line.strip_prefix("ID:") {
            fmt.id = id.trim().parse().ok();
        } else if line.starts_with("field:") {
            fmt.fields.push(parse_field(i + 1, line)?);
        }
    }
    if fmt.fields.is_empty() {
        return Err(FormatError::NoFields);
    }
    Ok(fmt)
}

fn parse_field(line_no: usize, line: &str) -> Result<FormatField, FormatError> {
    let bad = |what| FormatError::BadLine {
        line: line_no,
        what,
        text: line.to_owned(),
    };
    let mut decl = None;
    let mut offset = None;
    let mut size = None;
    let mut signed = false;
    for part in line.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = part.split_once(':').ok_or_else(|| bad("missing ':'"))?;
        let value = value.trim();
        match key.trim() {
            "field" => decl = Some(value.to_owned()),
            "offset" => offset = Some(value.parse().map_err(|_| bad("offset is not a number"))?),
            "size" => size = Some(value.parse().map_err(|_| bad("size is not a number"))?),
            "signed" => signed = value == "1",
            _ => {}
        }
    }
    let decl = decl.ok_or_else(|| bad("no declaration"))?;
    // The name is the declaration's last identifier, without an array suffix: `char comm[16]`,
    // `__data_loc char[] comm`, `unsigned long gfp_flags`.
    let last = decl
        .split_whitespace()
        .last()
        .ok_or_else(|| bad("empty declaration"))?;
    let name = last.split('[').next().unwrap_or(last);
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(bad("no field name"));
    }
    Ok(FormatField {
        name: name.to_owned(),
        decl: decl.clone(),
        offset: offset.ok_or_else(|| bad("no offset"))?,
        size: size.ok_or_else(|| bad("no size"))?,
        signed,
    })
}

/// The layout record for `slot` from its format: required fields must be present; optional
/// fields that are absent get size 0 (the program skips them).
pub fn layout(slot: &TpSlot, format: &TracepointFormat) -> Result<TpLayout, LayoutError> {
    let mut out = TpLayout::default();
    for (i, (field, required)) in slot.fields.iter().enumerate().take(TP_MAX_FIELDS) {
        let Some(f) = format.field(field) else {
            if *required {
                return Err(LayoutError::MissingField {
                    category: slot.category,
                    name: slot.name,
                    field,
                });
            }
            continue;
        };
        let range = |what, value: u32| LayoutError::OutOfRange {
            category: slot.category,
            name: slot.name,
            field,
            what,
            value,
        };
        let offset = u16::try_from(f.offset).map_err(|_| range("offset", f.offset))?;
        let size = u8::try_from(f.size).map_err(|_| range("size", f.size))?;
        let mut flags = 0;
        if f.signed {
            flags |= field_flags::SIGNED;
        }
        if f.is_data_loc() {
            flags |= field_flags::DATA_LOC;
        }
        out.fields[i] = FieldLoc {
            offset,
            size,
            flags,
        };
    }
    Ok(out)
}

/// Where tracefs is mounted, if it is (`/sys/kernel/tracing`, or the debugfs path older systems
/// use). A mount point counts only when it is not empty (the directory exists unmounted).
pub fn find() -> Option<PathBuf> {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| std::fs::read_dir(p).is_ok_and(|mut d| d.next().is_some()))
}

/// Mounts tracefs at `/sys/kernel/tracing` (what `mount -t tracefs nodev /sys/kernel/tracing`
/// does). Agents in a DaemonSet usually see the host's /sys without it mounted.
pub fn mount() -> Result<PathBuf, nix::Error> {
    let target = Path::new("/sys/kernel/tracing");
    nix::mount::mount(
        Some("nodev"),
        target,
        Some("tracefs"),
        nix::mount::MsFlags::MS_NOSUID
            | nix::mount::MsFlags::MS_NODEV
            | nix::mount::MsFlags::MS_NOEXEC,
        None::<&str>,
    )?;
    Ok(target.to_owned())
}

/// Reads and parses one tracepoint's format.
pub fn read_format(tracefs: &Path, category: &str, name: &str) -> Result<TracepointFormat, String> {
    let path = tracefs
        .join("events")
        .join(category)
        .join(name)
        .join("format");
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    parse_format(&text).map_err(|e| format!("parse {}: {e}", path.display()))
}

#[cfg(test)]
pub(crate) mod tests {
    use node_monitor_common::config::{oom_tp, reboot_tp};

    use super::*;

    /// A tracepoint's `format` file as tracefs prints it: every record starts with the fields of
    /// `struct trace_entry` (include/linux/trace_events.h), then a blank line and its own.
    macro_rules! format_file {
        ($head:literal, $fields:literal) => {
            concat!(
                $head,
                "\nformat:\n",
                "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n",
                "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n",
                "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n",
                "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n",
                "\n",
                $fields
            )
        };
    }

    /// `oom/mark_victim` on 6.18 (as read from this kernel).
    pub(crate) const MARK_VICTIM_6_18: &str = format_file!(
        "name: mark_victim\nID: 609",
        "\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] comm;\toffset:12;\tsize:4;\tsigned:0;
\tfield:unsigned long total_vm;\toffset:16;\tsize:8;\tsigned:0;
\tfield:unsigned long anon_rss;\toffset:24;\tsize:8;\tsigned:0;
\tfield:unsigned long file_rss;\toffset:32;\tsize:8;\tsigned:0;
\tfield:unsigned long shmem_rss;\toffset:40;\tsize:8;\tsigned:0;
\tfield:uid_t uid;\toffset:48;\tsize:4;\tsigned:0;
\tfield:unsigned long pgtables;\toffset:56;\tsize:8;\tsigned:0;
\tfield:short oom_score_adj;\toffset:64;\tsize:2;\tsigned:1;

print fmt: \"pid=%d comm=%s\", REC->pid, __get_str(comm)
"
    );

    /// `oom/mark_victim` before 6.1: only the pid.
    pub(crate) const MARK_VICTIM_5_15: &str = format_file!(
        "name: mark_victim\nID: 480",
        "\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;

print fmt: \"pid=%d\", REC->pid
"
    );

    pub(crate) const SYS_ENTER_REBOOT: &str = format_file!(
        "name: sys_enter_reboot\nID: 348",
        "\tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;
\tfield:int magic1;\toffset:16;\tsize:8;\tsigned:0;
\tfield:int magic2;\toffset:24;\tsize:8;\tsigned:0;
\tfield:unsigned int cmd;\toffset:32;\tsize:8;\tsigned:0;
\tfield:void * arg;\toffset:40;\tsize:8;\tsigned:0;
"
    );

    fn loc(offset: u16, size: u8, flags: u8) -> FieldLoc {
        FieldLoc {
            offset,
            size,
            flags,
        }
    }

    #[test]
    fn parses_the_6_18_oom_format() {
        let f = parse_format(MARK_VICTIM_6_18).unwrap();
        assert_eq!(f.name, "mark_victim");
        assert_eq!(f.id, Some(609));
        assert_eq!(f.fields.len(), 13);
        let comm = f.field("comm").unwrap();
        assert_eq!((comm.offset, comm.size, comm.signed), (12, 4, false));
        assert!(comm.is_data_loc());
        let l = layout(&oom_tp::SLOT, &f).unwrap();
        assert_eq!(l.fields[oom_tp::PID], loc(8, 4, field_flags::SIGNED));
        assert_eq!(l.fields[oom_tp::COMM], loc(12, 4, field_flags::DATA_LOC));
        assert_eq!(l.fields[oom_tp::TOTAL_VM], loc(16, 8, 0));
        assert_eq!(l.fields[oom_tp::UID], loc(48, 4, 0));
        assert_eq!(l.fields[oom_tp::PGTABLES], loc(56, 8, 0));
        assert_eq!(
            l.fields[oom_tp::OOM_SCORE_ADJ],
            loc(64, 2, field_flags::SIGNED)
        );
        // Slots past the tracepoint's fields stay empty.
        assert!(!l.fields[oom_tp::OOM_SCORE_ADJ + 1].is_present());
    }

    #[test]
    fn old_oom_format_keeps_pid_and_leaves_the_rest_absent() {
        let f = parse_format(MARK_VICTIM_5_15).unwrap();
        let l = layout(&oom_tp::SLOT, &f).unwrap();
        assert_eq!(l.fields[oom_tp::PID], loc(8, 4, field_flags::SIGNED));
        for i in [
            oom_tp::COMM,
            oom_tp::TOTAL_VM,
            oom_tp::UID,
            oom_tp::OOM_SCORE_ADJ,
        ] {
            assert!(!l.fields[i].is_present(), "field {i}");
        }
    }

    #[test]
    fn syscall_layout() {
        let r = layout(&reboot_tp::SLOT, &parse_format(SYS_ENTER_REBOOT).unwrap()).unwrap();
        assert_eq!(r.fields[reboot_tp::CMD], loc(32, 8, 0));
        assert_eq!(r.fields[reboot_tp::MAGIC1], loc(16, 8, 0));
    }

    #[test]
    fn a_missing_required_field_is_named() {
        let f = parse_format(MARK_VICTIM_5_15).unwrap();
        assert_eq!(
            layout(&reboot_tp::SLOT, &f).unwrap_err(),
            LayoutError::MissingField {
                category: "syscalls",
                name: "sys_enter_reboot",
                field: "cmd"
            }
        );
    }

    #[test]
    fn out_of_range_offsets_are_rejected() {
        let text = "name: x\n\tfield:int pid;\toffset:70000;\tsize:4;\tsigned:1;\n";
        let f = parse_format(text).unwrap();
        assert_eq!(
            layout(&oom_tp::SLOT, &f).unwrap_err(),
            LayoutError::OutOfRange {
                category: "oom",
                name: "mark_victim",
                field: "pid",
                what: "offset",
                value: 70000
            }
        );
    }

    #[test]
    fn malformed_formats_are_errors() {
        let cases = [
            (
                "field:int pid;\toffset:x;\tsize:4;",
                "offset is not a number",
            ),
            ("field:int pid;\tsize:4;", "no offset"),
            ("field:int pid;\toffset:8;", "no size"),
            ("field:;\toffset:8;\tsize:4;", "empty declaration"),
            ("field:int pid;\toffset 8;", "missing ':'"),
        ];
        for (line, what) in cases {
            match parse_format(line) {
                Err(FormatError::BadLine {
                    what: w, line: 1, ..
                }) => assert_eq!(w, what, "{line}"),
                other => panic!("{line}: {other:?}"),
            }
        }
        assert_eq!(parse_format("name: x\nID: 1\n"), Err(FormatError::NoFields));
    }
}
