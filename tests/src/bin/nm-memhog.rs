//! Memory pressure for the kernel tier: touches anonymous memory or churns the page cache, so a
//! small memory cgroup sees real reclaim and real OOM kills.
//!
//! ```text
//! nm-memhog anon <MiB>                       touch MiB of anonymous memory, then exit 0
//! nm-memhog pagecache <file> <MiB> <secs>    write a MiB file, then read it again and again
//! ```
//! In a memory cgroup below MiB, `anon` is OOM-killed (the host has no swap) and `pagecache`
//! makes the cgroup reclaim its own cache on every charge.
use std::{
    fs::File,
    io::{Read as _, Seek as _, SeekFrom, Write as _},
    time::{Duration, Instant},
};

const MIB: usize = 1 << 20;
const PAGE: usize = 4096;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, what: &str| -> usize {
        args.get(i)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| usage(&format!("{what} must be a number")))
    };
    match args.first().map(String::as_str) {
        Some("anon") => anon(num(1, "MiB")),
        Some("pagecache") => {
            let path = args.get(1).unwrap_or_else(|| usage("missing file"));
            pagecache(path, num(2, "MiB"), num(3, "secs"));
        }
        _ => usage("unknown mode"),
    }
}

fn usage(why: &str) -> ! {
    eprintln!("nm-memhog: {why}\nusage: nm-memhog anon <MiB> | pagecache <file> <MiB> <secs>");
    std::process::exit(2)
}

fn anon(mib: usize) {
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    for _ in 0..mib {
        let mut chunk = vec![0u8; MIB];
        // Write every page so it is really charged (a zeroed allocation may stay untouched).
        for i in (0..MIB).step_by(PAGE) {
            chunk[i] = 1;
        }
        chunks.push(chunk);
    }
    println!("touched {mib} MiB");
    std::hint::black_box(&chunks);
}

fn pagecache(path: &str, mib: usize, secs: usize) {
    let mut f = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap_or_else(|e| usage(&format!("open {path}: {e}")));
    let block = vec![0x5au8; MIB];
    for _ in 0..mib {
        f.write_all(&block)
            .unwrap_or_else(|e| usage(&format!("write {path}: {e}")));
    }
    f.sync_all()
        .unwrap_or_else(|e| usage(&format!("sync {path}: {e}")));
    let deadline = Instant::now() + Duration::from_secs(secs as u64);
    let mut buf = vec![0u8; MIB];
    let mut passes = 0u64;
    while Instant::now() < deadline {
        f.seek(SeekFrom::Start(0))
            .unwrap_or_else(|e| usage(&format!("seek: {e}")));
        while f
            .read(&mut buf)
            .unwrap_or_else(|e| usage(&format!("read: {e}")))
            > 0
        {}
        passes += 1;
    }
    println!("read {mib} MiB {passes} times");
}
