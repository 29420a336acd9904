//! A process's CPU time and memory from `/proc` (proc(5)), for the benchmarks that measure the
//! agent, remediate and the control plane.
use anyhow::{Context as _, Result};

/// `utime + stime` of a process, in clock ticks (fields 14 and 15 of `/proc/<pid>/stat`; the
/// command may hold spaces, so fields count from after its closing parenthesis).
pub fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    let rest = stat
        .rsplit_once(')')
        .context("no ')' in /proc/<pid>/stat")?
        .1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11).context("no utime")?.parse()?;
    let stime: u64 = f.get(12).context("no stime")?.parse()?;
    Ok(utime + stime)
}

/// A `kB` field of `/proc/<pid>/status` (`key` with its colon: `"VmRSS:"`, `"VmHWM:"`).
pub fn status_kib(pid: u32, key: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with(key))
        .with_context(|| format!("no {key} in /proc/{pid}/status"))?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .with_context(|| format!("no value for {key}"))?
        .parse()?)
}

/// (CPU ticks, VmRSS KiB, VmHWM KiB) of a process.
pub fn figures(pid: u32) -> Result<(u64, u64, u64)> {
    Ok((
        cpu_ticks(pid)?,
        status_kib(pid, "VmRSS:")?,
        status_kib(pid, "VmHWM:")?,
    ))
}

/// Clock ticks per second (`_SC_CLK_TCK`), to turn [`cpu_ticks`] into seconds.
pub fn ticks_per_second() -> f64 {
    // SAFETY: sysconf takes a constant and has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    hz.max(1) as f64
}
