use node_monitor_common::config::TaskOffsets;

use super::{attach::tracepoint_denied_hint, *};

#[test]
fn caller_offsets_are_written_with_or_without_the_oom_ones() {
    let task = TaskOffsets {
        task_pid: 10,
        valid: 1,
        // As `Btf::task_offsets` fills them when it can.
        task_cred: 99,
        caller_valid: 1,
        ..TaskOffsets::default()
    };
    let caller = TaskOffsets {
        task_thread_pid: 1,
        pid_level: 2,
        task_cred: 3,
        cred_cap_effective: 4,
        cred_user_ns: 5,
        user_ns_level: 6,
        caller_valid: 1,
        ..TaskOffsets::default()
    };
    let both = offsets_to_write(Some(&task), Some(&caller));
    assert_eq!((both.task_pid, both.valid), (10, 1));
    assert_eq!(
        (both.task_cred, both.user_ns_level, both.caller_valid),
        (3, 6, 1)
    );
    let no_oom = offsets_to_write(None, Some(&caller));
    assert_eq!(
        (no_oom.valid, no_oom.caller_valid, no_oom.pid_level),
        (0, 1, 2)
    );
    let no_caller = offsets_to_write(Some(&task), None);
    assert_eq!((no_caller.valid, no_caller.caller_valid), (1, 0));
    assert_eq!(offsets_to_write(None, None), TaskOffsets::default());
}

#[test]
fn a_refused_tracepoint_names_perf_event_paranoid_only_when_it_is_the_cause() {
    let denied = "`perf_event_open_trace_point` failed: Permission denied (os error 13)";
    let cases = [
        (denied, Some(3), true),
        (denied, Some(4), true),
        (denied, Some(2), false),
        (denied, None, false),
        (
            "`perf_event_open_trace_point` failed: No such file or directory",
            Some(3),
            false,
        ),
    ];
    for (error, paranoid, hinted) in cases {
        let hint = tracepoint_denied_hint(error, paranoid);
        assert_eq!(
            hint.contains("perf_event_paranoid"),
            hinted,
            "{error} {paranoid:?}: {hint}"
        );
    }
}
