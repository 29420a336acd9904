use super::*;

#[test]
fn single_values() {
    let cases: &[(&str, Result<u64, ParseError>)] = &[
        ("123\n", Ok(123)),
        ("  42  ", Ok(42)),
        ("0", Ok(0)),
        ("", Err(ParseError::Missing { field: "f" })),
        ("\n", Err(ParseError::Missing { field: "f" })),
        ("-1", Err(ParseError::invalid("f", "-1"))),
        ("12 34", Err(ParseError::invalid("f", "12 34"))),
        ("0x10", Err(ParseError::invalid("f", "0x10"))),
        (
            "99999999999999999999999",
            Err(ParseError::invalid("f", "99999999999999999999999")),
        ),
    ];
    for (text, want) in cases {
        assert_eq!(&parse_single_u64("f", text), want, "{text:?}");
    }
}

#[test]
fn limits() {
    let cases: &[(&str, Result<MemoryLimit, ParseError>)] = &[
        ("max\n", Ok(MemoryLimit::Unlimited)),
        ("536870912\n", Ok(MemoryLimit::Bytes(536_870_912))),
        // cgroup v1's "no limit" (PAGE_COUNTER_MAX pages).
        ("9223372036854771712\n", Ok(MemoryLimit::Unlimited)),
        ("4611686018427387904", Ok(MemoryLimit::Bytes(1 << 62))),
        ("unlimited", Err(ParseError::invalid("l", "unlimited"))),
        ("", Err(ParseError::Missing { field: "l" })),
    ];
    for (text, want) in cases {
        assert_eq!(&parse_memory_limit("l", text), want, "{text:?}");
    }
}

#[test]
fn memory_stat_v1_and_v2() {
    let v1 = "cache 1000\nrss 2000\ninactive_file 10\nactive_file 5\n\
                  total_cache 9000\ntotal_inactive_file 700\ntotal_active_file 300\n";
    assert_eq!(
        parse_memory_stat(v1),
        Ok(MemoryStat {
            total_inactive_file: Some(700),
            inactive_file: Some(10),
            total_active_file: Some(300),
            total_cache: Some(9000),
            active_file: Some(5),
            ..MemoryStat::default()
        })
    );
    let v2 = "anon 4096\nfile 8192\nkernel 100\ninactive_anon 0\ninactive_file 4000\n\
                  workingset_refault_file 3\n";
    assert_eq!(
        parse_memory_stat(v2),
        Ok(MemoryStat {
            inactive_file: Some(4000),
            anon: Some(4096),
            file: Some(8192),
            ..MemoryStat::default()
        })
    );
    // Unknown or odd lines for fields we do not use are skipped.
    assert_eq!(
        parse_memory_stat("weird\nfoo bar baz\n\nnew_field x\ninactive_file 1\n"),
        Ok(MemoryStat {
            inactive_file: Some(1),
            ..MemoryStat::default()
        })
    );
}

/// The page-cache fields of the reclaimable working set, from real files' layouts: v1 reads the
/// hierarchical `total_*` fields, not the cgroup's own; v2 its `file_dirty`/`file_writeback`.
#[test]
fn page_cache_fields_v1_and_v2() {
    let v1 = "cache 11\nshmem 12\nactive_file 13\ndirty 14\nwriteback 15\n\
              total_cache 9000\ntotal_rss 5\ntotal_shmem 1000\ntotal_mapped_file 7\n\
              total_dirty 40\ntotal_writeback 20\ntotal_inactive_file 3000\n\
              total_active_file 5000\ntotal_unevictable 0\n";
    let stat = parse_memory_stat(v1).expect("v1");
    assert_eq!(
        stat.page_cache(true),
        Ok(PageCache {
            active_file: 5000,
            file: 9000,
            shmem: 1000,
            dirty: 40,
            writeback: 20,
        })
    );
    let v2 = "anon 100\nfile 9000\nkernel 8\nshmem 1000\nfile_mapped 7\nfile_dirty 40\n\
              file_writeback 20\nswapcached 0\ninactive_anon 1\nactive_anon 2\n\
              inactive_file 3000\nactive_file 5000\nunevictable 0\n";
    let stat = parse_memory_stat(v2).expect("v2");
    assert_eq!(
        stat.page_cache(false),
        Ok(PageCache {
            active_file: 5000,
            file: 9000,
            shmem: 1000,
            dirty: 40,
            writeback: 20,
        })
    );
    // A field the formula needs that the kernel does not report is named.
    let no_shmem = "total_cache 1\ntotal_dirty 0\ntotal_writeback 0\ntotal_active_file 1\n";
    assert_eq!(
        parse_memory_stat(no_shmem).expect("parse").page_cache(true),
        Err(ParseError::Missing {
            field: "total_shmem"
        })
    );
    assert_eq!(
        parse_memory_stat("file 1\nshmem 0\nactive_file 1\nfile_dirty 0\n")
            .expect("parse")
            .page_cache(false),
        Err(ParseError::Missing {
            field: "file_writeback"
        })
    );
    // v1's own (non-hierarchical) fields never stand in for the totals.
    assert_eq!(
        parse_memory_stat("cache 1\nshmem 0\nactive_file 1\ndirty 0\nwriteback 0\n")
            .expect("parse")
            .page_cache(true),
        Err(ParseError::Missing {
            field: "total_active_file"
        })
    );
}

#[test]
fn memory_stat_malformed() {
    let cases: &[(&str, ParseError)] = &[
        (
            "total_inactive_file abc\n",
            ParseError::invalid("total_inactive_file", "abc"),
        ),
        (
            "inactive_file\n",
            ParseError::Missing {
                field: "inactive_file",
            },
        ),
        (
            "inactive_file -5\n",
            ParseError::invalid("inactive_file", "-5"),
        ),
        ("anon 1 2\n", ParseError::invalid("anon", "anon 1 2")),
        ("file 1.5\n", ParseError::invalid("file", "1.5")),
        (
            "total_dirty lots\n",
            ParseError::invalid("total_dirty", "lots"),
        ),
        (
            "file_writeback -1\n",
            ParseError::invalid("file_writeback", "-1"),
        ),
    ];
    for (text, want) in cases {
        assert_eq!(&parse_memory_stat(text), &Err(want.clone()), "{text:?}");
    }
}

#[test]
fn meminfo() {
    let ok = "MemTotal:       24684000 kB\nMemFree:        23000000 kB\n";
    assert_eq!(parse_meminfo_total(ok), Ok(24_684_000 * 1024));
    assert_eq!(parse_meminfo(ok), Ok((24_684_000 * 1024, None)));
    let with_available = "MemTotal:        2014000 kB\nMemFree:          100000 kB\n\
                          MemAvailable:     812000 kB\nMemAvailableX: 1 kB\n";
    assert_eq!(
        parse_meminfo(with_available),
        Ok((2_014_000 * 1024, Some(812_000 * 1024)))
    );
    // A malformed MemAvailable is not observed; MemTotal still is.
    assert_eq!(
        parse_meminfo("MemTotal: 4 kB\nMemAvailable: x kB\n"),
        Ok((4096, None))
    );
    let cases: &[(&str, ParseError)] = &[
        ("MemFree: 1 kB\n", ParseError::Missing { field: "MemTotal" }),
        ("", ParseError::Missing { field: "MemTotal" }),
        ("MemTotal:\n", ParseError::Missing { field: "MemTotal" }),
        (
            "MemTotal: lots kB\n",
            ParseError::invalid("MemTotal", "lots"),
        ),
        (
            "MemTotal: 100 MB\n",
            ParseError::Unit {
                field: "MemTotal",
                unit: "MB".into(),
                expected: "kB",
            },
        ),
        (
            "MemTotal: 100\n",
            ParseError::Unit {
                field: "MemTotal",
                unit: String::new(),
                expected: "kB",
            },
        ),
        (
            "MemTotal: 18446744073709551615 kB\n",
            ParseError::invalid("MemTotal", "18446744073709551615"),
        ),
    ];
    for (text, want) in cases {
        assert_eq!(&parse_meminfo_total(text), &Err(want.clone()), "{text:?}");
    }
}

#[test]
fn loadavg() {
    assert_eq!(
        parse_loadavg_tasks("1.36 3.49 4.53 2/3518 3715089\n"),
        Ok(3518)
    );
    let f = "loadavg tasks";
    let cases: &[(&str, ParseError)] = &[
        ("", ParseError::Missing { field: f }),
        ("1.0 2.0 3.0\n", ParseError::Missing { field: f }),
        ("1.0 2.0 3.0 3518 99\n", ParseError::invalid(f, "3518")),
        ("1.0 2.0 3.0 2/x 99\n", ParseError::invalid(f, "x")),
        ("1.0 2.0 3.0 2/ 99\n", ParseError::invalid(f, "")),
    ];
    for (text, want) in cases {
        assert_eq!(&parse_loadavg_tasks(text), &Err(want.clone()), "{text:?}");
    }
}

#[test]
fn id_lists() {
    assert_eq!(count_ids("procs", "1\n22\n333\n"), Ok(3));
    assert_eq!(count_ids("procs", ""), Ok(0));
    assert_eq!(count_ids("procs", "\n\n"), Ok(0));
    assert_eq!(
        count_ids("procs", "1\nabc\n"),
        Err(ParseError::invalid("procs", "abc"))
    );
    assert_eq!(
        count_ids("procs", "1\n-2\n"),
        Err(ParseError::invalid("procs", "-2"))
    );
}

#[test]
fn memory_events() {
    let text = "low 0\nhigh 5\nmax 7\noom 1\noom_kill 1\noom_group_kill 0\nsock_throttled 0\n";
    let ev = parse_memory_events(text).expect("parses");
    assert_eq!(
        ev,
        MemoryEvents {
            low: 0,
            high: 5,
            max: 7,
            oom: 1,
            oom_kill: 1,
            oom_group_kill: 0
        }
    );
    let later = MemoryEvents {
        max: 9,
        oom_kill: 2,
        ..ev
    };
    assert_eq!(
        later.delta_since(&ev),
        MemoryEvents {
            max: 2,
            oom_kill: 1,
            ..MemoryEvents::default()
        }
    );
    assert!(ev.delta_since(&ev).is_zero());
    // A counter going backwards (re-created cgroup) is not an increase.
    assert!(MemoryEvents::default().delta_since(&ev).is_zero());
    // Older kernels: no oom_group_kill line.
    assert_eq!(
        parse_memory_events("low 0\nhigh 0\nmax 1\noom 0\noom_kill 0\n").map(|e| e.max),
        Ok(1)
    );
    let cases: &[(&str, ParseError)] = &[
        ("", ParseError::Missing { field: "max" }),
        ("max 1\noom 0\n", ParseError::Missing { field: "oom_kill" }),
        (
            "max x\noom 0\noom_kill 0\n",
            ParseError::invalid("max", "x"),
        ),
        (
            "max\noom 0\noom_kill 0\n",
            ParseError::Missing { field: "max" },
        ),
        (
            "max 1\noom -1\noom_kill 0\n",
            ParseError::invalid("oom", "-1"),
        ),
    ];
    for (text, want) in cases {
        assert_eq!(&parse_memory_events(text), &Err(want.clone()), "{text:?}");
    }
}

#[test]
fn pressure() {
    let text = "some avg10=1.50 avg60=0.25 avg300=0.05 total=403477\n\
                    full avg10=0.00 avg60=0.00 avg300=0.00 total=12\n";
    let p = parse_pressure(text).expect("parses");
    assert_eq!(p.some.total_us, 403_477);
    assert!((p.some.avg10 - 1.5).abs() < 1e-9);
    assert_eq!(p.full.map(|f| f.total_us), Some(12));
    let only_some =
        parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n").expect("parses");
    assert_eq!(only_some.full, None);
    let cases: &[(&str, ParseError)] = &[
        ("", ParseError::Missing { field: "some" }),
        (
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
            ParseError::Missing { field: "some" },
        ),
        (
            "some avg10=0.00 avg60=0.00 total=0\n",
            ParseError::invalid("some", "some avg10=0.00 avg60=0.00 total=0"),
        ),
        (
            "some avg10=x avg60=0.00 avg300=0.00 total=0\n",
            ParseError::invalid("some", "avg10=x"),
        ),
        (
            "some avg10=-1 avg60=0.00 avg300=0.00 total=0\n",
            ParseError::invalid("some", "avg10=-1"),
        ),
        (
            "some avg10=NaN avg60=0.00 avg300=0.00 total=0\n",
            ParseError::invalid("some", "avg10=NaN"),
        ),
        (
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=1.5\n",
            ParseError::invalid("some", "total=1.5"),
        ),
        (
            "some avg10 avg60=0.00 avg300=0.00 total=0\n",
            ParseError::invalid("some", "avg10"),
        ),
    ];
    for (text, want) in cases {
        assert_eq!(&parse_pressure(text), &Err(want.clone()), "{text:?}");
    }
}

#[test]
fn oom_control() {
    assert_eq!(
        parse_oom_control("oom_kill_disable 0\nunder_oom 1\noom_kill 3\n"),
        Ok(OomControl {
            oom_kill_disable: false,
            under_oom: true,
            oom_kill: Some(3)
        })
    );
    assert_eq!(
        parse_oom_control("oom_kill_disable 1\nunder_oom 0\n"),
        Ok(OomControl {
            oom_kill_disable: true,
            under_oom: false,
            oom_kill: None
        })
    );
    let cases: &[(&str, ParseError)] = &[
        ("", ParseError::Missing { field: "under_oom" }),
        ("under_oom 2\n", ParseError::invalid("under_oom", "2")),
        (
            "oom_kill_disable yes\nunder_oom 0\n",
            ParseError::invalid("oom_kill_disable", "yes"),
        ),
        (
            "under_oom 0\noom_kill x\n",
            ParseError::invalid("oom_kill", "x"),
        ),
    ];
    for (text, want) in cases {
        assert_eq!(&parse_oom_control(text), &Err(want.clone()), "{text:?}");
    }
}

#[test]
fn pod_log_dirs() {
    assert_eq!(
        pod_log_dir_uid("kube-system_coredns-abc_0a1b2c3d-4e5f-6789-abcd-ef0123456789"),
        Some("0a1b2c3d-4e5f-6789-abcd-ef0123456789")
    );
    assert_eq!(pod_log_dir_uid("nounderscore"), None);
    assert_eq!(pod_log_dir_uid("ns_name_"), None);
}

#[test]
fn invalid_values_are_bounded_in_messages() {
    let long = "9".repeat(500);
    let Err(ParseError::Invalid { value, .. }) = parse_single_u64("f", &long) else {
        panic!("expected an invalid-value error");
    };
    assert_eq!(value.len(), 64);
}
