use super::{OBJECT, attach::tracepoint_denied_hint};

#[test]
fn the_object_reads_kernel_structs_through_core_relocations() {
    let mut obj = aya_obj::Object::parse(OBJECT).expect("the embedded eBPF object parses");
    assert!(
        obj.has_btf_relocations(),
        "no CO-RE relocation records in the object's .BTF.ext"
    );
    // Without kernel BTF the loader relocates against an empty BTF: every record is poisoned,
    // none is an error (the programs never reach them, see `NM_CORE`).
    obj.relocate_btf(&aya::Btf::new())
        .expect("relocating against an empty BTF poisons, never fails");
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
