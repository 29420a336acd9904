//! `node-monitor-remediate`'s command line: bad flags and unreadable configuration are refused
//! with an error that names them, before it looks for an API server; the leading `remediate`
//! word of the releases where it was a subcommand of `node-monitor` is still accepted.
use std::process::{Command, Output};

fn remediate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_node-monitor-remediate"))
        .args(args)
        .env("RUST_LOG", "warn")
        // No API server is reachable: neither in-cluster variables nor a kubeconfig.
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .output()
        .unwrap_or_else(|e| panic!("cannot run node-monitor-remediate {args:?}: {e}"))
}

/// What is not a regular file is refused as the configuration, naming the path and its kind.
#[test]
fn configuration_that_is_not_a_regular_file_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    let fifo = fifo.to_str().expect("utf-8");
    let dir_path = dir.path().to_str().expect("utf-8");
    for (path, want) in [
        (
            "/dev/zero",
            "/dev/zero is not a regular file (a character device)",
        ),
        (fifo, "is not a regular file (a FIFO)"),
        (dir_path, "is not a regular file (a directory)"),
    ] {
        for args in [
            vec!["--config", path],
            // As the 0.1 manifests run it: `remediate` first.
            vec!["remediate", "--config", path],
        ] {
            let out = remediate(&args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && stderr.contains(want),
                "{args:?}: exit {:?}, stderr: {stderr}",
                out.status
            );
        }
        let e = node_monitor_remediate::load_config(Some(std::path::Path::new(path)))
            .expect_err("remediate settings");
        let msg = format!("{e:#}");
        assert!(
            msg.contains(path) && msg.contains("not a regular file"),
            "{msg}"
        );
    }
}

/// The leading `remediate` word is accepted, with a warning that it is no longer needed.
#[test]
fn the_legacy_subcommand_word_is_accepted_with_a_warning() {
    let out = remediate(&["remediate", "--config", "/dev/zero"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no longer needed"), "{stderr}");
    let out = remediate(&["--config", "/dev/zero"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("no longer needed"), "{stderr}");
}

/// A flag out of its bounds names the flag and the value, and never panics.
#[test]
fn flags_out_of_bounds_are_refused_by_name() {
    for (args, wants) in [
        (vec!["--namespace=-x"], vec!["--namespace", "\"-x\""]),
        (
            vec!["--metrics-addr", "nowhere"],
            vec!["--metrics-addr", "nowhere"],
        ),
    ] {
        let out = remediate(&args);
        assert!(!out.status.success(), "{args:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{err}");
        for want in wants {
            assert!(err.contains(want), "{want} not in: {err}");
        }
    }
}
