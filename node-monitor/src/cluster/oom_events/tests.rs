use super::*;

const MI: u64 = 1 << 20;

fn pod(containers: &[(&str, Option<&str>)], statuses: &[(&str, &str)]) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-0", "namespace": "apps", "uid": "u1"},
        "spec": {"containers": containers.iter().map(|(n, l)| serde_json::json!({
            "name": n,
            "resources": l.map_or_else(|| serde_json::json!({}), |l| serde_json::json!({"limits": {"memory": l}})),
        })).collect::<Vec<_>>()},
        "status": {"containerStatuses": statuses.iter().map(|(n, id)| serde_json::json!({
            "name": n, "containerID": format!("containerd://{id}"), "image": "", "imageID": "",
            "ready": true, "restartCount": 0,
        })).collect::<Vec<_>>()},
    }))
    .expect("pod")
}

fn kill(global: Option<bool>, container_id: Option<&str>) -> OomKill {
    OomKill {
        victim_pid: 4242,
        victim_comm: Some("stress".to_owned()),
        global,
        memory: Some(OomMemory {
            total_vm_bytes: 100 * MI,
            anon_rss_bytes: 31 * MI,
            file_rss_bytes: MI,
            shmem_rss_bytes: 0,
            pgtables_bytes: 0,
        }),
        pod_uid: "u1".to_owned(),
        container_id: container_id.map(str::to_owned),
    }
}

/// (case, pod, kill) → (container, message), or no Event.
#[test]
fn the_event_names_the_container_the_limit_and_the_rss() {
    let two = pod(
        &[("app", Some("32Mi")), ("side", None)],
        &[("app", "abc"), ("side", "def")],
    );
    let single = pod(&[("app", Some("64Mi"))], &[]);
    type Case<'a> = (
        &'a str,
        &'a Pod,
        OomKill,
        Option<(Option<&'a str>, &'a str)>,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            "memcg kill in a limited container",
            &two,
            kill(Some(false), Some("abc")),
            Some((
                Some("app"),
                "Memory cgroup out of memory: Killed process 4242 (stress) in container app: limit 32Mi, RSS 32.0Mi (anon 31.0Mi, file 1.0Mi, shmem 0B)",
            )),
        ),
        (
            "memcg kill in a container without a limit",
            &two,
            kill(Some(false), Some("def")),
            Some((
                Some("side"),
                "Memory cgroup out of memory: Killed process 4242 (stress) in container side: limit node, RSS 32.0Mi (anon 31.0Mi, file 1.0Mi, shmem 0B)",
            )),
        ),
        (
            "a node-level kill names no limit",
            &two,
            kill(Some(true), Some("abc")),
            Some((
                Some("app"),
                "Out of memory: Killed process 4242 (stress) in container app: limit node, RSS 32.0Mi (anon 31.0Mi, file 1.0Mi, shmem 0B)",
            )),
        ),
        (
            "an unknown container of a two-container pod",
            &two,
            kill(Some(false), Some("zzz")),
            Some((
                None,
                "Memory cgroup out of memory: Killed process 4242 (stress) in container <unknown>: limit node, RSS 32.0Mi (anon 31.0Mi, file 1.0Mi, shmem 0B)",
            )),
        ),
        (
            "a single-container pod whose status does not name the id yet",
            &single,
            kill(Some(false), Some("new")),
            Some((
                Some("app"),
                "Memory cgroup out of memory: Killed process 4242 (stress) in container app: limit 64Mi, RSS 32.0Mi (anon 31.0Mi, file 1.0Mi, shmem 0B)",
            )),
        ),
        (
            "the pod-level cgroup of a single-container pod names no container",
            &single,
            kill(Some(false), None),
            Some((
                None,
                "Memory cgroup out of memory: Killed process 4242 (stress) in container <unknown>: limit node, RSS 32.0Mi (anon 31.0Mi, file 1.0Mi, shmem 0B)",
            )),
        ),
    ];
    for (case, pod, kill, want) in cases {
        let got = oom_event(&kill, pod);
        let got = got
            .as_ref()
            .map(|e| (e.container.as_deref(), e.message.as_str()));
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn a_kill_of_another_pod_gets_no_event() {
    let mut k = kill(Some(false), Some("abc"));
    k.pod_uid = "other".to_owned();
    assert_eq!(
        oom_event(&k, &pod(&[("app", None)], &[("app", "abc")])),
        None
    );
}

#[test]
fn no_memory_figures_say_unknown() {
    let mut k = kill(Some(false), Some("abc"));
    k.memory = None;
    k.victim_comm = None;
    let ev = oom_event(&k, &pod(&[("app", Some("1Gi"))], &[("app", "abc")])).expect("event");
    assert_eq!(
        ev.message,
        "Memory cgroup out of memory: Killed process 4242 (?) in container app: limit 1Gi, RSS unknown"
    );
}

#[test]
fn the_event_is_a_warning_on_the_pod_and_its_container() {
    let ev = oom_event(
        &kill(Some(false), Some("abc")),
        &pod(&[("app", Some("32Mi"))], &[("app", "abc")]),
    )
    .expect("event");
    let reporter = Reporter {
        component: "node-monitor",
        instance: "n1".to_owned(),
        host: Some("n1".to_owned()),
    };
    let first = Timestamp::from_second(1_700_000_000).expect("valid");
    let now = Timestamp::from_second(1_700_000_060).expect("valid");
    let obj = series_object(&reporter, &ev.record(), 3, first, now);
    assert_eq!(obj.type_.as_deref(), Some("Warning"));
    assert_eq!(obj.reason.as_deref(), Some("OOMKilling"));
    assert_eq!(obj.reporting_component.as_deref(), Some("node-monitor"));
    assert_eq!(obj.reporting_instance.as_deref(), Some("n1"));
    assert_eq!(obj.count, Some(3));
    assert_eq!(obj.first_timestamp, Some(Time(first)));
    assert_eq!(obj.last_timestamp, Some(Time(now)));
    let inv = obj.involved_object;
    assert_eq!(inv.kind.as_deref(), Some("Pod"));
    assert_eq!(inv.uid.as_deref(), Some("u1"));
    assert_eq!(inv.name.as_deref(), Some("web-0"));
    assert_eq!(inv.namespace.as_deref(), Some("apps"));
    assert_eq!(inv.field_path.as_deref(), Some("spec.containers{app}"));
    assert_eq!(obj.metadata.namespace.as_deref(), Some("apps"));
}

fn key(pod: &str, container: &str) -> SeriesKey {
    key_in("default", pod, container)
}

fn key_in(namespace: &str, pod: &str, container: &str) -> SeriesKey {
    SeriesKey {
        namespace: namespace.to_owned(),
        pod_uid: pod.to_owned(),
        container: container.to_owned(),
        reason: REASON,
    }
}

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + s).expect("valid")
}

/// A table of occurrences (second, pod, container) → writes, with the created Event named
/// after its occurrence.
#[test]
fn repeats_within_the_window_patch_the_series_and_later_ones_start_anew() {
    let mut s = OomSeries::new(Duration::from_secs(600), 16, 100, 100);
    let steps: &[(i64, &str, &str, Write)] = &[
        (
            0,
            "p",
            "app",
            Write::Create {
                count: 1,
                first: at(0),
            },
        ),
        (
            30,
            "p",
            "app",
            Write::Patch {
                name: "ev-0".into(),
                count: 2,
            },
        ),
        (
            40,
            "p",
            "side",
            Write::Create {
                count: 1,
                first: at(40),
            },
        ),
        (
            50,
            "q",
            "app",
            Write::Create {
                count: 1,
                first: at(50),
            },
        ),
        // 600 s after the latest occurrence of (p, app): still the series.
        (
            630,
            "p",
            "app",
            Write::Patch {
                name: "ev-0".into(),
                count: 3,
            },
        ),
        // More than 600 s later: a new Event.
        (
            1231,
            "p",
            "app",
            Write::Create {
                count: 1,
                first: at(1231),
            },
        ),
        (
            1232,
            "p",
            "app",
            Write::Patch {
                name: "ev-1231".into(),
                count: 2,
            },
        ),
    ];
    for (t, pod, c, want) in steps {
        let got = s.observe(&key(pod, c), at(*t));
        assert_eq!(&got, want, "at {t}s, {pod}/{c}");
        if matches!(got, Write::Create { .. }) {
            s.created(&key(pod, c), format!("ev-{t}"));
        }
    }
}

#[test]
fn the_rate_limit_drops_writes_but_keeps_counting() {
    // Burst 2, then 1 per minute.
    let mut s = OomSeries::new(Duration::from_secs(600), 16, 2, 1);
    assert_eq!(
        s.observe(&key("p", "a"), at(0)),
        Write::Create {
            count: 1,
            first: at(0)
        }
    );
    s.created(&key("p", "a"), "ev".into());
    assert_eq!(
        s.observe(&key("p", "a"), at(1)),
        Write::Patch {
            name: "ev".into(),
            count: 2
        }
    );
    assert_eq!(s.observe(&key("p", "a"), at(2)), Write::Drop);
    assert_eq!(s.observe(&key("q", "a"), at(3)), Write::Drop);
    // A minute later one token is back; the series carries the dropped occurrence.
    assert_eq!(
        s.observe(&key("p", "a"), at(62)),
        Write::Patch {
            name: "ev".into(),
            count: 4
        }
    );
    assert_eq!(s.observe(&key("q", "a"), at(63)), Write::Drop);
    // q's first Event, once allowed, counts the dropped occurrences.
    assert_eq!(
        s.observe(&key("q", "a"), at(130)),
        Write::Create {
            count: 3,
            first: at(3)
        }
    );
}

#[test]
fn the_series_map_is_bounded_and_forgets_the_least_recent() {
    let mut s = OomSeries::new(Duration::from_secs(600), 2, 100, 100);
    s.observe(&key("a", "c"), at(0));
    s.created(&key("a", "c"), "ev-a".into());
    s.observe(&key("b", "c"), at(1));
    s.observe(&key("a", "c"), at(2));
    s.observe(&key("c", "c"), at(3)); // forgets b, the least recently seen
    assert_eq!(s.len(), 2);
    assert_eq!(
        s.observe(&key("a", "c"), at(4)),
        Write::Patch {
            name: "ev-a".into(),
            count: 3
        }
    );
    assert_eq!(
        s.observe(&key("b", "c"), at(5)),
        Write::Create {
            count: 1,
            first: at(5)
        }
    );
}

#[test]
fn a_lost_event_is_created_again_with_the_series_count() {
    let mut s = OomSeries::new(Duration::from_secs(600), 4, 100, 100);
    s.observe(&key("a", "c"), at(0));
    s.created(&key("a", "c"), "ev".into());
    s.lost(&key("a", "c"));
    assert_eq!(
        s.observe(&key("a", "c"), at(1)),
        Write::Create {
            count: 2,
            first: at(0)
        }
    );
}

#[test]
fn sizes_are_written_in_binary_units() {
    assert_eq!(bytes(0), "0B");
    assert_eq!(bytes(1023), "1023B");
    assert_eq!(bytes(1536), "1.5Ki");
    assert_eq!(bytes(32 * MI), "32.0Mi");
    assert_eq!(bytes(3 << 30), "3.0Gi");
}

/// One tenant whose pods are OOM-killed in a loop spends at most its share of the node's Event
/// budget: another namespace's kill still gets its Event.
#[test]
fn one_tenant_cannot_spend_the_whole_event_budget() {
    // Burst 4, 4 per minute; each namespace half of it.
    let mut s = OomSeries::new(Duration::from_secs(600), 64, 4, 4).with_tenant_share(0.5);
    let mut written = 0;
    for i in 0..20 {
        if s.observe(&key_in("noisy", &format!("p{i}"), "a"), at(i)) != Write::Drop {
            written += 1;
        }
    }
    assert_eq!(written, 2, "the noisy namespace is held to its share");
    assert_eq!(
        s.observe(&key_in("quiet", "q", "a"), at(21)),
        Write::Create {
            count: 1,
            first: at(21)
        },
        "another tenant's kill is still written"
    );
    // The default series shares the node's budget the same way.
    let mut d = OomSeries::default();
    let noisy = (0..100)
        .filter(|i| d.observe(&key_in("noisy", &format!("p{i}"), "a"), at(0)) != Write::Drop)
        .count();
    assert_eq!(noisy as u32, RATE_BURST / 2);
    assert_ne!(d.observe(&key_in("quiet", "q", "a"), at(0)), Write::Drop);
}
