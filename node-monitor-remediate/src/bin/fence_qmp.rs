//! `fence_qmp`: the QMP fence agent ([`node_monitor_remediate::fence_qmp`]). Reads `name=value`
//! lines on standard input, as the ClusterLabs fence agents do, and exits 0 when the action is
//! done and confirmed (`status`: 0 on, 2 off), 1 on any error.
use std::io::Read as _;

use node_monitor_remediate::fence_qmp;

fn main() {
    let mut input = String::new();
    // The options are a few lines; more than 64 KiB is not a fence agent's input.
    if let Err(e) = std::io::stdin().take(64 << 10).read_to_string(&mut input) {
        eprintln!("Failed: reading the options from standard input: {e}");
        std::process::exit(1);
    }
    let (message, code) = match fence_qmp::parse(&input) {
        Ok(options) => fence_qmp::run(&options),
        Err(e) => (format!("Failed: {e}"), 1),
    };
    if code == 1 {
        eprintln!("{message}");
    } else {
        println!("{message}");
    }
    std::process::exit(code);
}
