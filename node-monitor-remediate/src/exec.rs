//! Runs fence methods as commands: the agent in its own process group, parameters on its standard
//! input, a deadline, and the tail of its output for the Event when it fails. A run that is
//! cancelled (the task aborted) or times out takes its whole process group with it. Output is
//! read as it comes and only the last [`OUTPUT_KEEP`] bytes of each stream are kept: an agent
//! that prints without end costs bounded memory (the rest is read and discarded, so it never
//! blocks on a full pipe either).
use std::{process::Stdio, time::Duration};

use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _},
    process::Command,
};
use tracing::{info, warn};

use super::{
    methods::{MethodSpec, stdin_text},
    ports::StepError,
};
use node_monitor_core::remediation::Step;

/// Output shown from a failed method, per stream.
const OUTPUT_TAIL: usize = 1024;
/// Output kept while a method runs, per stream (its tail).
pub const OUTPUT_KEEP: usize = 64 * 1024;

/// The tail of a stream and how much was discarded before it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Captured {
    pub kept: Vec<u8>,
    pub discarded: u64,
}

impl Captured {
    fn trim(&mut self, keep: usize) {
        if self.kept.len() > keep {
            let cut = self.kept.len() - keep;
            self.kept.drain(..cut);
            self.discarded = self.discarded.saturating_add(cut as u64);
        }
    }

    /// The shown tail, saying how much came before it.
    fn describe(&self) -> String {
        let t = tail(&self.kept);
        let shown = t.len() as u64;
        let before = self
            .discarded
            .saturating_add((self.kept.len() as u64).saturating_sub(shown));
        if t.is_empty() || before == 0 || !t.starts_with('…') {
            t
        } else {
            format!("[{before} earlier bytes not shown] {t}")
        }
    }
}

/// Reads `r` to its end into `into`, keeping only the last `keep` bytes (memory stays below
/// twice that). Cancel-safe: what was read before a cancellation stays in `into`.
pub async fn capture(mut r: impl AsyncRead + Unpin, keep: usize, into: &mut Captured) {
    let mut chunk = [0u8; 8192];
    loop {
        match r.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                into.kept.extend_from_slice(&chunk[..n]);
                if into.kept.len() >= keep.saturating_mul(2).max(keep + chunk.len()) {
                    into.trim(keep);
                }
            }
        }
    }
    into.trim(keep);
}

/// How one method run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MethodOutcome {
    Success,
    Failed { status: String, output: String },
    TimedOut { after: Duration, output: String },
    SpawnFailed { error: String },
}

impl MethodOutcome {
    pub fn describe(&self, method: &str) -> String {
        match self {
            Self::Success => format!("method {method} succeeded"),
            Self::Failed { status, output } if output.is_empty() => {
                format!("method {method} failed: {status}")
            }
            Self::Failed { status, output } => {
                format!("method {method} failed: {status}: {output}")
            }
            Self::TimedOut { after, output } if output.is_empty() => {
                format!(
                    "method {method} timed out after {:.1}s",
                    after.as_secs_f64()
                )
            }
            Self::TimedOut { after, output } => {
                format!(
                    "method {method} timed out after {:.1}s: {output}",
                    after.as_secs_f64()
                )
            }
            Self::SpawnFailed { error } => format!("method {method} could not start: {error}"),
        }
    }
}

/// Kills the process group when dropped while armed (timeout, or the task aborted).
struct GroupGuard {
    pgid: Option<i32>,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    if text.len() <= OUTPUT_TAIL {
        return text.to_owned();
    }
    let mut start = text.len() - OUTPUT_TAIL;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &text[start..])
}

/// Runs one method for `node`.
pub async fn run_method(node: &str, step: Step, spec: &MethodSpec) -> MethodOutcome {
    let mut cmd = Command::new(&spec.agent);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("NODE_MONITOR_FENCE_NODE", node)
        .env("NODE_MONITOR_FENCE_STEP", step.as_str())
        .env("NODE_MONITOR_FENCE_METHOD", &spec.method)
        // Its own group: a timeout or a cancellation kills what the agent started too.
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return MethodOutcome::SpawnFailed {
                error: format!("{}: {e}", spec.agent),
            };
        }
    };
    let mut guard = GroupGuard {
        pgid: child.id().and_then(|p| i32::try_from(p).ok()),
    };
    if let Some(mut stdin) = child.stdin.take() {
        // An agent that exits without reading its input closes the pipe: not an error here, its
        // exit status tells.
        let _ = stdin.write_all(stdin_text(&spec.params).as_bytes()).await;
        drop(stdin);
    }
    info!(node, step = step.as_str(), method = %spec.method, agent = %spec.agent,
          origin = %spec.origin, timeout = ?spec.timeout, "running fence method");
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let mut out = Captured::default();
    let mut err = Captured::default();
    let waited = {
        let run = async {
            let read_out = async {
                if let Some(s) = stdout {
                    capture(s, OUTPUT_KEEP, &mut out).await;
                }
            };
            let read_err = async {
                if let Some(s) = stderr {
                    capture(s, OUTPUT_KEEP, &mut err).await;
                }
            };
            let (status, (), ()) = tokio::join!(child.wait(), read_out, read_err);
            status
        };
        tokio::time::timeout(spec.timeout, run).await
    };
    let output = [err.describe(), out.describe()]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" | ");
    match waited {
        Ok(Ok(status)) => {
            // The agent exited: its group is left alone (a reused process id is not ours).
            guard.pgid = None;
            if status.success() {
                MethodOutcome::Success
            } else {
                MethodOutcome::Failed {
                    status: status.to_string(),
                    output,
                }
            }
        }
        Ok(Err(e)) => MethodOutcome::Failed {
            status: format!("waiting for it failed: {e}"),
            output,
        },
        Err(_) => {
            warn!(node, method = %spec.method, timeout = ?spec.timeout, "fence method timed out; killing its process group");
            MethodOutcome::TimedOut {
                after: spec.timeout,
                output,
            }
        }
    }
}

/// Runs a step's methods in order; the step succeeds when every method does and stops at the
/// first failure (the proposal: a step is done when all its jobs succeeded).
pub async fn run_step(node: &str, step: Step, methods: &[MethodSpec]) -> Result<(), StepError> {
    if methods.is_empty() {
        return Err(StepError::NoMethods(step.as_str()));
    }
    for m in methods {
        let outcome = run_method(node, step, m).await;
        if outcome != MethodOutcome::Success {
            return Err(StepError::Method(outcome.describe(&m.method)));
        }
        info!(node, step = step.as_str(), method = %m.method, "fence method succeeded");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, os::unix::fs::PermissionsExt as _};

    use super::*;

    fn script(dir: &std::path::Path, name: &str, body: &str) -> String {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).expect("write script");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        p.display().to_string()
    }

    fn spec(agent: String, timeout_ms: u64) -> MethodSpec {
        MethodSpec {
            method: "test".into(),
            agent,
            params: BTreeMap::from([
                ("action".to_owned(), "off".to_owned()),
                ("nodename".to_owned(), "n1".to_owned()),
            ]),
            secret: None,
            timeout: Duration::from_millis(timeout_ms),
            origin: "test".into(),
        }
    }

    #[tokio::test]
    async fn parameters_arrive_on_stdin_and_the_exit_status_decides() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("stdin");
        let ok = script(
            dir.path(),
            "ok",
            &format!(
                "cat > {} && echo \"$NODE_MONITOR_FENCE_STEP $NODE_MONITOR_FENCE_NODE\" >> {}",
                out.display(),
                out.display()
            ),
        );
        assert_eq!(
            run_method("n1", Step::Isolation, &spec(ok, 10_000)).await,
            MethodOutcome::Success
        );
        let seen = std::fs::read_to_string(&out).expect("stdin recorded");
        assert_eq!(seen, "action=off\nnodename=n1\nisolation n1\n");

        let fail = script(dir.path(), "fail", "echo 'no route to PDU' >&2; exit 3");
        match run_method("n1", Step::Isolation, &spec(fail, 10_000)).await {
            MethodOutcome::Failed { status, output } => {
                assert!(status.contains('3'), "{status}");
                assert_eq!(output, "no route to PDU");
            }
            other => panic!("expected a failure, got {other:?}"),
        }
        let missing = dir.path().join("absent").display().to_string();
        assert!(matches!(
            run_method("n1", Step::Isolation, &spec(missing, 10_000)).await,
            MethodOutcome::SpawnFailed { .. }
        ));
    }

    #[tokio::test]
    async fn a_timeout_kills_the_whole_process_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("pid");
        // The agent forks a sleeper and waits: both must die.
        let hang = script(
            dir.path(),
            "hang",
            &format!("sleep 60 & echo $! > {}; wait", pidfile.display()),
        );
        let outcome = run_method("n1", Step::PowerManagement, &spec(hang, 300)).await;
        assert_eq!(
            outcome,
            MethodOutcome::TimedOut {
                after: Duration::from_millis(300),
                output: String::new(),
            }
        );
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .expect("pid written")
            .trim()
            .parse()
            .expect("a pid");
        let mut gone = false;
        for _ in 0..100 {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
            if state.is_none_or(|s| s.contains(") Z ")) {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(gone, "the agent's child {pid} survived the timeout");
    }

    #[tokio::test]
    async fn a_step_stops_at_the_first_failing_method() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("log");
        let a = script(dir.path(), "a", &format!("echo a >> {}", log.display()));
        let b = script(
            dir.path(),
            "b",
            &format!("echo b >> {}; exit 1", log.display()),
        );
        let c = script(dir.path(), "c", &format!("echo c >> {}", log.display()));
        let methods: Vec<MethodSpec> = [a, b, c]
            .into_iter()
            .map(|agent| spec(agent, 10_000))
            .collect();
        let err = run_step("n1", Step::PowerManagement, &methods)
            .await
            .expect_err("b fails");
        assert!(err.to_string().contains("failed"), "{err}");
        assert_eq!(err.metric_label(), "method_failed");
        assert_eq!(std::fs::read_to_string(&log).expect("log"), "a\nb\n");
        assert_eq!(
            run_step("n1", Step::Recovery, &[]).await,
            Err(StepError::NoMethods("recovery"))
        );
    }

    #[tokio::test]
    async fn capture_keeps_a_bounded_tail_of_an_endless_stream() {
        let mut c = Captured::default();
        // An endless stream: the capture is cut off by a deadline; what it holds stays bounded.
        let (reader, mut writer) = tokio::io::duplex(8192);
        let writer = tokio::spawn(async move {
            let line = [b'y'; 4096];
            while writer.write_all(&line).await.is_ok() {}
        });
        let _ = tokio::time::timeout(
            Duration::from_millis(300),
            capture(reader, OUTPUT_KEEP, &mut c),
        )
        .await;
        writer.abort();
        assert!(c.kept.len() <= 2 * OUTPUT_KEEP + 8192, "{}", c.kept.len());
        assert!(c.discarded > 0, "the stream was read on, not left to block");
        // A finite stream longer than the cap: its tail is kept exactly.
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut c = Captured::default();
        capture(&data[..], OUTPUT_KEEP, &mut c).await;
        assert_eq!(c.kept, data[data.len() - OUTPUT_KEEP..]);
        assert_eq!(c.discarded, (data.len() - OUTPUT_KEEP) as u64);
        // A short one is kept whole.
        let mut c = Captured::default();
        capture(&b"no route to PDU"[..], OUTPUT_KEEP, &mut c).await;
        assert_eq!(
            (c.kept.as_slice(), c.discarded),
            (&b"no route to PDU"[..], 0)
        );
    }

    #[tokio::test]
    async fn an_agent_that_prints_forever_is_timed_out_with_its_tail() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Prints without end on both streams and never exits.
        let chatty = script(
            dir.path(),
            "chatty",
            "yes 'stderr line' >&2 & exec yes 'stdout line'",
        );
        let outcome = run_method("n1", Step::Isolation, &spec(chatty, 1_000)).await;
        match outcome {
            MethodOutcome::TimedOut { after, output } => {
                assert_eq!(after, Duration::from_secs(1));
                assert!(output.contains("stdout line"), "{output}");
                assert!(output.contains("stderr line"), "{output}");
                assert!(output.contains("earlier bytes not shown"), "{output}");
                assert!(output.len() < 3 * OUTPUT_TAIL, "{}", output.len());
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        // A failing agent with a lot of output: the message names how much was left out.
        let loud = script(
            dir.path(),
            "loud",
            "head -c 300000 /dev/zero | tr '\\0' x; echo; echo 'the real error' >&2; exit 2",
        );
        match run_method("n1", Step::Isolation, &spec(loud, 10_000)).await {
            MethodOutcome::Failed { status, output } => {
                assert!(status.contains('2'), "{status}");
                assert!(output.starts_with("the real error | ["), "{output}");
                assert!(output.contains("earlier bytes not shown"), "{output}");
            }
            other => panic!("expected a failure, got {other:?}"),
        }
    }
}
