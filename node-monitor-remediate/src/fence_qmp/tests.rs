use std::io::{Cursor, Read, Write};

use super::*;

/// A QMP peer that answers from a script and records what it was sent.
struct Scripted {
    answers: Cursor<Vec<u8>>,
    sent: Vec<u8>,
}

impl Scripted {
    fn new(lines: &[&str]) -> Self {
        let mut text = lines.join("\n");
        text.push('\n');
        Scripted {
            answers: Cursor::new(text.into_bytes()),
            sent: Vec::new(),
        }
    }
}

impl Read for Scripted {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.answers.read(buf)
    }
}

impl Write for Scripted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.sent.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const GREETING: &str = r#"{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}}, "capabilities": ["oob"]}}"#;
const OK: &str = r#"{"return": {}}"#;
const RUNNING: &str = r#"{"return": {"status": "running", "running": true}}"#;
const STOPPED: &str = r#"{"return": {"status": "prelaunch", "running": false}}"#;

/// The commands the agent sent, in order.
fn commands(s: &Session<Scripted>) -> Vec<String> {
    String::from_utf8_lossy(&s.reader.get_ref().sent)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["execute"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

fn session(answers: &[&str]) -> Session<Scripted> {
    let mut all = vec![GREETING, OK];
    all.extend_from_slice(answers);
    Session::open(Scripted::new(&all)).expect("open")
}

#[test]
fn options_are_read_from_name_value_lines_with_the_clusterlabs_defaults() {
    let o = parse("# qmp\nnodename=nm-a\naction=off\nip=10.0.2.2\nipport=4444\n").unwrap();
    assert_eq!(
        o,
        Options {
            action: Action::Off,
            ip: "10.0.2.2".into(),
            port: 4444,
            timeout: Duration::from_secs(20)
        }
    );
    let o = parse("ip=host\nipport=1\npower_timeout=600").unwrap();
    assert_eq!(o.action, Action::Reboot);
    assert_eq!(o.timeout, Duration::from_secs(600));
}

#[test]
fn bad_options_are_refused_naming_the_key_and_the_value() {
    for (input, says) in [
        ("ip=h\nipport=0", "ipport=\"0\""),
        ("ip=h\nipport=70000", "ipport=\"70000\""),
        ("ip=h\nipport=x", "ipport=\"x\""),
        ("ip=h\nipport=1\naction=destroy", "action=\"destroy\""),
        ("ip=h\nipport=1\npower_timeout=0", "power_timeout=\"0\""),
        ("ip=h\nipport=1\npower_timeout=601", "power_timeout=\"601\""),
        ("ip=a b\nipport=1", "ip=\"a b\""),
        ("ipport=1", "ip is missing"),
        ("ip=h", "ipport is missing"),
        ("ip=h\nipport", "\"ipport\" is not name=value"),
    ] {
        let e = parse(input).expect_err(input);
        assert!(e.contains(says), "{input:?}: {e}");
    }
}

#[test]
fn off_stops_and_resets_the_machine_and_confirms_it_does_not_run() {
    let mut s = session(&[
        OK,
        r#"{"event": "STOP"}"#,
        OK,
        r#"{"event": "RESET"}"#,
        STOPPED,
    ]);
    assert_eq!(act(&mut s, Action::Off), ("Success: Powered OFF".into(), 0));
    assert_eq!(
        commands(&s),
        ["qmp_capabilities", "stop", "system_reset", "query-status"]
    );
}

#[test]
fn off_fails_when_the_machine_still_runs() {
    let mut s = session(&[OK, OK, RUNNING]);
    let (msg, code) = act(&mut s, Action::Off);
    assert_eq!(code, 1);
    assert!(msg.contains("still runs"), "{msg}");
}

#[test]
fn on_continues_a_stopped_machine_and_leaves_a_running_one_alone() {
    let mut s = session(&[STOPPED, OK, RUNNING]);
    assert_eq!(act(&mut s, Action::On), ("Success: Powered ON".into(), 0));
    assert_eq!(
        commands(&s),
        ["qmp_capabilities", "query-status", "cont", "query-status"]
    );
    let mut s = session(&[RUNNING, RUNNING]);
    assert_eq!(act(&mut s, Action::On).1, 0);
    assert!(!commands(&s).contains(&"cont".to_owned()));
}

#[test]
fn status_exits_0_for_on_2_for_off_and_1_on_an_error() {
    assert_eq!(act(&mut session(&[RUNNING]), Action::Status).1, 0);
    assert_eq!(act(&mut session(&[STOPPED]), Action::Status).1, 2);
    let err = r#"{"error": {"class": "GenericError", "desc": "no"}}"#;
    assert_eq!(act(&mut session(&[err]), Action::Status).1, 1);
    assert_eq!(act(&mut session(&[]), Action::Status).1, 1);
}

#[test]
fn reboot_is_off_then_on() {
    let mut s = session(&[OK, OK, STOPPED, STOPPED, OK, RUNNING]);
    assert_eq!(act(&mut s, Action::Reboot), ("Success: Rebooted".into(), 0));
    assert_eq!(
        commands(&s),
        [
            "qmp_capabilities",
            "stop",
            "system_reset",
            "query-status",
            "query-status",
            "cont",
            "query-status"
        ]
    );
}

#[test]
fn a_peer_that_is_not_qmp_is_refused() {
    let e = Session::open(Scripted::new(&["SSH-2.0-OpenSSH_9.2"]))
        .err()
        .expect("refused");
    assert!(e.contains("QMP sent"), "{e}");
    let e = Session::open(Scripted::new(&[r#"{"hello": 1}"#]))
        .err()
        .expect("refused");
    assert!(e.contains("not a QMP greeting"), "{e}");
}
