use super::attach::tracepoint_denied_hint;

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
