use super::*;

const MS: u64 = 1_000_000;

#[test]
fn windows_tumble() {
    // (window start, now, window length, expired)
    let cases = [
        (0, 5 * MS, 1000 * MS, true), // no window yet
        (1, 1, 1000 * MS, false),
        (100 * MS, 1099 * MS, 1000 * MS, false),
        (100 * MS, 1100 * MS, 1000 * MS, true), // exactly one window later
        (100 * MS, 5000 * MS, 1000 * MS, true),
        (100 * MS, 50 * MS, 1000 * MS, false), // clock read before start on another CPU
    ];
    for (start, now, len, want) in cases {
        assert_eq!(window_expired(start, now, len), want, "{start} {now} {len}");
    }
}

#[test]
fn budget_is_inclusive() {
    let cases = [
        (0, 1, false),
        (9 * MS, 10 * MS, false),
        (10 * MS, 10 * MS, true),
        (11 * MS, 10 * MS, true),
    ];
    for (stall, budget, want) in cases {
        assert_eq!(budget_exceeded(stall, budget), want, "{stall} {budget}");
    }
}

#[test]
fn rate_limit() {
    let cases = [
        (0, 10, 1000, true), // never sent
        (10, 500, 1000, false),
        (10, 1010, 1000, true),
        (10, 1009, 1000, false),
        (2000, 1000, 1000, false), // a stale clock never underflows into "allowed"
        (10, 11, 0, true),         // no limit
    ];
    for (last, now, min, want) in cases {
        assert_eq!(
            rate_limit_allows(last, now, min),
            want,
            "{last} {now} {min}"
        );
    }
}

#[test]
fn kswapd_slots_are_bounded() {
    assert_eq!(kswapd_slot(0), 0);
    assert_eq!(kswapd_slot(3), 3);
    assert_eq!(kswapd_slot(63), 63);
    assert_eq!(kswapd_slot(64), 63);
    assert_eq!(kswapd_slot(i32::MAX), 63);
    assert_eq!(kswapd_slot(-1), 0);
}

#[test]
fn oom_scope_follows_the_last_reclaim() {
    let direct = ReclaimFlavor::Direct as u32;
    let memcg = ReclaimFlavor::Memcg as u32;
    let cases = [
        (memcg, true, OomScope::Memcg),
        (direct, true, OomScope::Global),
        (NO_RECLAIM_SEEN, true, OomScope::Global),
        (memcg, false, OomScope::Unknown),
        (NO_RECLAIM_SEEN, false, OomScope::Unknown),
    ];
    for (evidence, attached, want) in cases {
        assert_eq!(oom_scope(evidence, attached), want, "{evidence} {attached}");
    }
    assert_eq!(OomScope::Memcg.is_global(), Some(false));
    assert_eq!(OomScope::Global.is_global(), Some(true));
    assert_eq!(OomScope::Unknown.is_global(), None);
}

#[test]
fn reboot_commands_decode() {
    let cases = [
        (0x0123_4567, RebootCmd::Restart, "restart", true),
        (0xCDEF_0123, RebootCmd::Halt, "halt", true),
        (0x4321_FEDC, RebootCmd::PowerOff, "power_off", true),
        (0xA1B2_C3D4, RebootCmd::Restart2, "restart2", true),
        (0x4558_4543, RebootCmd::Kexec, "kexec", true),
        (0xD000_FCE2, RebootCmd::SoftwareSuspend, "sw_suspend", false),
        (0x89AB_CDEF, RebootCmd::CadOn, "cad_on", false),
        (0, RebootCmd::CadOff, "cad_off", false),
        (7, RebootCmd::Unknown(7), "unknown", false),
    ];
    for (raw, cmd, name, down) in cases {
        assert_eq!(RebootCmd::from_raw(raw), cmd);
        assert_eq!(cmd.as_str(), name);
        assert_eq!(cmd.goes_down(), down, "{name}");
    }
}

#[test]
fn reboot_gate_follows_the_kernels_checks() {
    const RESTART: u32 = 0x0123_4567;
    const CAD_ON: u32 = 0x89AB_CDEF;
    const M1: u32 = REBOOT_MAGIC1;
    const M2: u32 = REBOOT_MAGIC2[0];
    let root = RebootCaller {
        cap_effective: 0x1ff_ffff_ffff,
        pid_ns_level: 0,
        user_ns_level: 0,
    };
    let no_boot = RebootCaller {
        cap_effective: root.cap_effective & !(1 << CAP_SYS_BOOT),
        ..root
    };
    let container = RebootCaller {
        pid_ns_level: 1,
        ..root
    };
    let userns = RebootCaller {
        user_ns_level: 2,
        ..root
    };
    let only_boot = RebootCaller {
        cap_effective: 1 << CAP_SYS_BOOT,
        ..root
    };
    let cases = [
        (Some(root), M1, M2, RESTART, RebootGate::Allowed),
        (
            Some(only_boot),
            M1,
            REBOOT_MAGIC2[3],
            0x4558_4543,
            RebootGate::Allowed,
        ),
        (Some(root), M1, M2, 0x4321_FEDC, RebootGate::Allowed),
        (Some(root), M1, M2, 0xCDEF_0123, RebootGate::Allowed),
        (Some(root), M1, M2, 0xA1B2_C3D4, RebootGate::Allowed),
        // A container's own PID namespace: whatever its capabilities.
        (Some(container), M1, M2, RESTART, RebootGate::RefusedPidNs),
        (
            Some(RebootCaller {
                pid_ns_level: 3,
                cap_effective: 0,
                user_ns_level: 1,
            }),
            0,
            0,
            CAD_ON,
            RebootGate::RefusedPidNs,
        ),
        // Full capabilities, but in a child user namespace.
        (Some(userns), M1, M2, RESTART, RebootGate::RefusedUserNs),
        (Some(no_boot), M1, M2, RESTART, RebootGate::RefusedCap),
        (
            Some(RebootCaller::default()),
            M1,
            M2,
            RESTART,
            RebootGate::RefusedCap,
        ),
        (Some(root), M1, 7, RESTART, RebootGate::RefusedMagic),
        (
            Some(root),
            0xdead_beef,
            M2,
            RESTART,
            RebootGate::RefusedMagic,
        ),
        (Some(root), M1, M2, CAD_ON, RebootGate::NotShutdown),
        (Some(root), M1, M2, 0, RebootGate::NotShutdown),
        (Some(root), M1, M2, 0xD000_FCE2, RebootGate::NotShutdown),
        (Some(root), M1, M2, 42, RebootGate::NotShutdown),
        // Unknown caller: the arguments still decide what they can.
        (None, M1, M2, RESTART, RebootGate::Unverified),
        (None, M1, 1, RESTART, RebootGate::RefusedMagic),
        (None, M1, M2, CAD_ON, RebootGate::NotShutdown),
    ];
    for (caller, m1, m2, cmd, want) in cases {
        assert_eq!(
            reboot_gate(caller, m1, m2, cmd),
            want,
            "{caller:?} {m1:#x} {m2} {cmd:#x}"
        );
    }
}

#[test]
fn reboot_gates_have_stable_ids_names_and_slots() {
    for (i, g) in RebootGate::ALL.iter().enumerate() {
        assert_eq!(*g as u32, i as u32 + 1);
        assert_eq!(RebootGate::from_u32(*g as u32), Some(*g));
        assert!((*g as u32) < REBOOT_GATES);
    }
    assert_eq!(RebootGate::from_u32(0), None);
    assert_eq!(RebootGate::from_u32(8), None);
    let names: std::vec::Vec<&str> = RebootGate::ALL.iter().map(|g| g.as_str()).collect();
    assert_eq!(
        names,
        [
            "allowed",
            "refused_pidns",
            "refused_userns",
            "refused_cap",
            "refused_magic",
            "not_shutdown",
            "unverified"
        ]
    );
    let refused: std::vec::Vec<&str> = RebootGate::ALL.iter().filter_map(|g| g.refusal()).collect();
    assert_eq!(
        refused,
        ["pid_namespace", "user_namespace", "capability", "magic"]
    );
}

#[test]
fn reboot_magic_numbers() {
    // The magic numbers glibc's reboot(3) passes, and ones the kernel refuses.
    let cases = [
        (0xfee1_dead, 672_274_793, true),
        (0xfee1_dead, 85_072_278, true),
        (0xfee1_dead, 369_367_448, true),
        (0xfee1_dead, 537_993_216, true),
        (0xfee1_dead, 1, false),
        (0xdead_beef, 672_274_793, false),
    ];
    for (m1, m2, want) in cases {
        assert_eq!(reboot_magic_accepted(m1, m2), want, "{m1:#x} {m2}");
    }
}

#[test]
fn mem_push_counts_growth_and_bounds_credit() {
    // (case, net, pages, grow, batch, want net, want report)
    let cases = [
        ("growth below the batch", 0, 8, true, 256, 8, false),
        ("growth reaching the batch", 250, 8, true, 256, 258, true),
        ("growth exactly at the batch", 255, 1, true, 256, 256, true),
        ("a free lowers the count", 100, 4, false, 256, 96, false),
        ("a free goes negative", 0, 16, false, 256, -16, false),
        (
            "credit is bounded by the batch",
            -250,
            512,
            false,
            256,
            -256,
            false,
        ),
        ("a huge page", 0, 512, true, 256, 512, true),
        ("no overflow", i64::MAX - 1, 8, true, 256, i64::MAX, true),
    ];
    for (case, net, pages, grow, batch, want, report) in cases {
        assert_eq!(
            mem_push_step(net, pages, grow, batch),
            (want, report),
            "{case}"
        );
    }
}
