//! The plugin's command line: values out of bounds refused before anything runs, by name.

use std::process::{Command, Output};

fn plugin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kubectl-node_monitor"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run kubectl-node_monitor {args:?}: {e}"))
}

/// (arguments, what the error must name)
#[test]
fn flags_out_of_bounds_are_refused_by_name() {
    let long = "t".repeat(16 * 1024 + 1);
    let cases: [(&[&str], &[&str]); 4] = [
        (&["status", "--token", ""], &["--token", "empty"]),
        (&["status", "--token", &long], &["--token", "16384"]),
        (
            &["status", "--agent-namespace", "Bad_NS"],
            &["--agent-namespace", "\"Bad_NS\"", "DNS label"],
        ),
        (
            &["trace", "--kind", "oom"],
            &["--kind", "\"oom\"", "oom_kill"],
        ),
    ];
    for (args, wants) in cases {
        let out = plugin(args);
        assert!(!out.status.success(), "{args:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{err}");
        for want in wants {
            assert!(err.contains(want), "{want} not in: {err}");
        }
    }
}
