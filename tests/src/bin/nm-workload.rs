//! The program simulated containers run: holds or ramps resident anonymous memory, forks sleeper
//! processes, sleeps, and exits cleanly on SIGTERM/SIGINT.
//!
//! ```text
//! nm-workload --hold 64Mi                                  # allocate 64 MiB, touch it, hold it
//! nm-workload --ramp-to 2Gi --step 16Mi --interval 50ms    # grow by 16 MiB every 50 ms, then hold
//! nm-workload --procs 5                                    # fork 5 sleepers, then hold
//! nm-workload --sleep 2s --exit-code 3                     # sleep 2 s, exit 3
//! nm-workload --sleep --term-delay 3s                      # on SIGTERM, exit 3 s later
//! nm-workload --ramp-to 600Mi --step 64Mi --cycles 10      # a sawtooth: ramp, free all, again
//! nm-workload --cache-file /data/f --cache-size 1Gi --cache-passes 5   # page cache from reads
//! ```
//! Progress goes to stdout (one line per event, `key=value` fields) so tests can read it from the
//! container log.
use std::{
    io::Write as _,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use node_monitor_tests::standin::decide::parse_bytes;

#[derive(Parser, Debug)]
#[command(about = "Simulated container workload: memory, processes, sleep")]
struct Args {
    /// Allocate this much resident anonymous memory at once (a quantity: 64Mi, 1G, 1048576).
    #[arg(long, value_parser = bytes)]
    hold: Option<u64>,
    /// Grow resident anonymous memory up to this size, `--step` every `--interval`.
    #[arg(long, value_parser = bytes)]
    ramp_to: Option<u64>,
    /// Ramp step (default 16Mi).
    #[arg(long, value_parser = bytes, default_value = "16Mi")]
    step: u64,
    /// Ramp interval (e.g. 50ms, 1s; default 100ms).
    #[arg(long, value_parser = duration, default_value = "100ms")]
    interval: Duration,
    /// Fork this many sleeping child processes.
    #[arg(long, default_value_t = 0)]
    procs: u32,
    /// After the work, sleep this long and exit (default: hold until signalled). A bare `--sleep`
    /// sleeps until signalled.
    #[arg(long, value_parser = duration, num_args = 0..=1, default_missing_value = "0s")]
    sleep: Option<Duration>,
    /// Exit code after `--sleep` ends.
    #[arg(long, default_value_t = 0)]
    exit_code: i32,
    /// On SIGTERM/SIGINT, take this long to exit, as a server finishing its requests does.
    #[arg(long, value_parser = duration, default_value = "0s")]
    term_delay: Duration,
    /// Run the ramp this many times, freeing everything it allocated after each (a sawtooth);
    /// the last one's memory is held.
    #[arg(long, default_value_t = 1)]
    cycles: u32,
    /// Write a file of `--cache-size` here, then read it `--cache-passes` times: page cache
    /// from reads, which the kernel can reclaim.
    #[arg(long)]
    cache_file: Option<std::path::PathBuf>,
    /// The cache file's size.
    #[arg(long, value_parser = bytes, default_value = "512Mi")]
    cache_size: u64,
    /// How many times the cache file is read after it is written.
    #[arg(long, default_value_t = 3)]
    cache_passes: u32,
}

/// Writes `size` bytes to `path` in 1 MiB chunks and reads the file back `passes` times.
fn fill_cache(path: &std::path::Path, size: u64, passes: u32) -> Result<()> {
    use std::io::Read as _;
    let chunk = vec![0x5au8; 1 << 20];
    let mut f =
        std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?;
    let mut written = 0u64;
    while written < size {
        let n = chunk
            .len()
            .min(usize::try_from(size - written).unwrap_or(usize::MAX));
        f.write_all(&chunk[..n])
            .with_context(|| format!("write {}", path.display()))?;
        written += n as u64;
    }
    f.sync_all()
        .with_context(|| format!("sync {}", path.display()))?;
    say(&format!("cache written bytes={written}"));
    let mut buf = vec![0u8; 1 << 20];
    for pass in 1..=passes {
        let mut f =
            std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
        while f
            .read(&mut buf)
            .with_context(|| format!("read {}", path.display()))?
            > 0
        {}
        say(&format!("cache read pass={pass}"));
    }
    Ok(())
}

fn bytes(s: &str) -> Result<u64, String> {
    parse_bytes(s).ok_or_else(|| format!("{s:?} is not a byte quantity (e.g. 64Mi, 1G)"))
}

fn duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration (e.g. 50ms, 2s, 1m)");
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| bad())?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(bad()),
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "nm-workload: {line}");
    let _ = out.flush();
}

/// Waits up to `timeout` (forever when `None`) for SIGTERM or SIGINT, which are blocked so they
/// queue instead of killing the process. Returns whether one arrived.
fn wait_signal(set: &SigSet, timeout: Option<Duration>) -> bool {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(t.subsec_nanos()),
    });
    let ts_ptr = ts.as_ref().map_or(std::ptr::null(), |t| t as *const _);
    loop {
        // SAFETY: `set` is a valid signal set; `ts_ptr` is null or points to a live timespec.
        let r = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), ts_ptr) };
        if r > 0 {
            return true;
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            _ => return false, // EAGAIN: the timeout passed
        }
    }
}

fn fork_sleepers(n: u32) -> Result<()> {
    for _ in 0..n {
        // SAFETY: single-threaded here; the child only calls async-signal-safe functions.
        match unsafe { nix::unistd::fork() }.context("fork a sleeper")? {
            nix::unistd::ForkResult::Child => {
                // SAFETY: prctl/sigprocmask/pause are async-signal-safe.
                unsafe {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    let mut empty: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut empty);
                    libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
                    loop {
                        libc::pause();
                    }
                }
            }
            nix::unistd::ForkResult::Parent { .. } => {}
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None).context("block SIGTERM/SIGINT")?;
    if args.step == 0 {
        bail!("--step must be positive");
    }
    say(&format!("start pid={}", std::process::id()));

    fork_sleepers(args.procs)?;
    if args.procs > 0 {
        say(&format!("forked procs={}", args.procs));
    }

    // Every byte is written so the memory is resident, not just reserved.
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut total: u64 = 0;
    if let Some(n) = args.hold {
        held.push(vec![
            0xa5;
            usize::try_from(n).context("--hold is too large")?
        ]);
        total += n;
        say(&format!("holding bytes={total}"));
    }
    if let Some(path) = &args.cache_file {
        fill_cache(path, args.cache_size, args.cache_passes)?;
    }
    for cycle in 1..=args.cycles.max(1) {
        let Some(target) = args.ramp_to else {
            break;
        };
        if cycle > 1 {
            held.clear();
            held.shrink_to_fit();
            total = args.hold.unwrap_or(0);
            if let Some(n) = args.hold {
                held.push(vec![
                    0xa5;
                    usize::try_from(n).context("--hold is too large")?
                ]);
            }
            say(&format!("freed cycle={cycle}"));
            if wait_signal(&set, Some(args.interval)) {
                say("signalled; exiting");
                return Ok(());
            }
        }
        let started = Instant::now();
        while total < target {
            let n = args.step.min(target - total);
            held.push(vec![
                0xa5;
                usize::try_from(n).context("--step is too large")?
            ]);
            total += n;
            say(&format!(
                "ramp bytes={total} elapsed_ms={}",
                started.elapsed().as_millis()
            ));
            if total < target && wait_signal(&set, Some(args.interval)) {
                say("signalled; exiting");
                return Ok(());
            }
        }
        say(&format!("holding bytes={total}"));
    }

    let signalled = match args.sleep {
        Some(d) if !d.is_zero() => wait_signal(&set, Some(d)),
        _ => wait_signal(&set, None),
    };
    // Keep the allocations alive until here.
    std::hint::black_box(&held);
    if signalled {
        if !args.term_delay.is_zero() {
            say(&format!(
                "signalled; exiting in ms={}",
                args.term_delay.as_millis()
            ));
            std::thread::sleep(args.term_delay);
        }
        say("signalled; exiting");
        return Ok(());
    }
    say(&format!("done exit_code={}", args.exit_code));
    std::process::exit(args.exit_code);
}
