use node_monitor_core::flight::{EventKind, FlightEvent, FlightRecorder, PodPoint, Sample};

use super::*;

/// `n` records as the recorder freezes them, each with a few samples.
fn records(n: u64) -> Vec<Arc<FlightRecord>> {
    let mut r = FlightRecorder::new();
    for i in 0..n {
        let at = 1_000_000 + i * 60_000;
        for k in 0..5 {
            r.sample(Sample {
                at_ms: at - 5_000 + k * 1_000,
                signals: Vec::new(),
                top_pods: vec![PodPoint {
                    pod: format!("default/p{i}"),
                    working_set: 100 << 20,
                }],
                pod_figures_age_ms: Some(0),
                psi: None,
                thresholds_met: Vec::new(),
                evict: Vec::new(),
                prediction: None,
            });
        }
        r.event(FlightEvent {
            at_ms: at,
            kind: EventKind::OomKill {
                pod: format!("default/p{i}"),
                comm: "hog".into(),
                pid: 42,
                global: Some(false),
            },
        });
    }
    r.shared_records()
}

fn errors() -> Family<ReasonLabels, Counter> {
    Family::default()
}

fn count(errors: &Family<ReasonLabels, Counter>, reason: &str) -> u64 {
    errors
        .get_or_create(&ReasonLabels {
            reason: reason.to_owned(),
        })
        .get()
}

/// What is saved is read back as it was, oldest first; no file reads as no record; the write
/// leaves no temporary file behind.
#[test]
fn records_round_trip_through_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = FlightStore::new(dir.path());
    assert!(store.load().expect("no file").is_empty());
    let saved = records(3);
    assert_eq!(store.save(&saved).expect("save"), 3);
    let loaded = store.load().expect("load");
    let want: Vec<FlightRecord> = saved.iter().map(|r| (**r).clone()).collect();
    assert_eq!(loaded, want);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, [FILE]);
    // A later save replaces the file whole.
    assert_eq!(store.save(&saved[2..]).expect("save"), 1);
    assert_eq!(store.load().expect("load"), want[2..]);
    // And a restart restores them, counting nothing.
    let e = errors();
    assert_eq!(store.restore(&e), want[2..]);
    assert_eq!(count(&e, "corrupt") + count(&e, "oversized"), 0);
}

/// A file over the bound keeps the newest records that fit.
#[test]
fn a_save_over_the_bound_leaves_out_the_oldest_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let saved = records(4);
    let one = serde_json::to_vec(&*saved[0]).expect("json").len();
    let store = FlightStore::new(dir.path()).with_max_bytes(2 * one + one / 2);
    assert_eq!(store.save(&saved).expect("save"), 2);
    let ids: Vec<u64> = store.load().expect("load").iter().map(|r| r.id).collect();
    assert_eq!(ids, [2, 3]);
}

/// A corrupt file, one of another format version and an oversized one are each counted by
/// reason and set aside (replacing the earlier one set aside), never read; the agent starts
/// with no record and the next save writes a good file.
#[test]
fn a_bad_file_is_counted_and_set_aside() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = FlightStore::new(dir.path()).with_max_bytes(64 << 10);
    let e = errors();
    let file = dir.path().join(FILE);
    let aside = dir.path().join(SET_ASIDE);
    for (content, reason) in [
        (b"{\"version\":1,\"records\":[{\"id\":".to_vec(), "corrupt"),
        (b"\x00\xff garbage".to_vec(), "corrupt"),
        (br#"{"version":2,"records":[]}"#.to_vec(), "corrupt"),
        (vec![b' '; (64 << 10) + 1], "oversized"),
    ] {
        std::fs::write(&file, &content).expect("write");
        let before = count(&e, reason);
        assert!(store.restore(&e).is_empty(), "{reason}");
        assert_eq!(count(&e, reason), before + 1, "{reason}");
        assert!(!file.exists(), "{reason}: set aside");
        assert_eq!(std::fs::read(&aside).expect("set aside"), content);
    }
    assert!(matches!(
        store.load(),
        Ok(v) if v.is_empty()
    ));
    let saved = records(1);
    store.save(&saved).expect("save");
    assert_eq!(store.restore(&e).len(), 1);
}

/// A FIFO planted at the record file's path neither blocks start-up nor is read: it is counted
/// as unreadable, and the next save replaces it with a real file.
#[test]
fn a_fifo_at_the_record_path_does_not_block() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = FlightStore::new(dir.path());
    let e = errors();
    let file = dir.path().join(FILE);
    nix::unistd::mkfifo(&file, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    let before = count(&e, "unreadable");
    assert!(store.restore(&e).is_empty());
    assert_eq!(count(&e, "unreadable"), before + 1);
    store.save(&records(1)).expect("save over the FIFO");
    assert!(std::fs::metadata(&file).expect("file").is_file());
    assert_eq!(store.restore(&e).len(), 1);
}

/// The writer thread writes what it is handed; a failed write is counted, and the next
/// succeeds once the directory is back.
#[test]
fn the_writer_writes_the_latest_snapshot_and_counts_failures() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    std::fs::create_dir(&state).expect("mkdir");
    let store = FlightStore::new(&state);
    let e = errors();
    let writer = FlightWriter::spawn(store.clone(), e.clone()).expect("thread");
    let wait = |what: &str, done: &dyn Fn() -> bool| {
        for _ in 0..500 {
            if done() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("{what} never happened");
    };
    writer.submit(records(2));
    wait("two records on disk", &|| {
        store.load().is_ok_and(|r| r.len() == 2)
    });
    std::fs::remove_dir_all(&state).expect("rm");
    writer.submit(records(3));
    wait("a failed write counted", &|| count(&e, "write") >= 1);
    std::fs::create_dir(&state).expect("mkdir");
    writer.submit(records(3));
    wait("three records on disk", &|| {
        store.load().is_ok_and(|r| r.len() == 3)
    });
}

/// A flush returns once what was submitted is on disk: no polling, the file read at once.
#[test]
fn a_flush_returns_once_the_submitted_records_are_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = FlightStore::new(dir.path());
    let writer = FlightWriter::spawn(store.clone(), errors()).expect("thread");
    assert!(writer.flush(Duration::ZERO), "nothing submitted: flushed");
    for n in 1..=20 {
        writer.submit(records(n % 4 + 1));
        assert!(writer.flush(Duration::from_secs(30)), "flush {n} timed out");
        assert_eq!(
            store.load().expect("the file").len(),
            usize::try_from(n % 4 + 1).expect("small"),
            "after flush {n}"
        );
    }
}

/// A flush whose write cannot finish within its bound says so instead of waiting on.
#[test]
fn a_flush_is_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = FlightStore::new(dir.path());
    let writer = FlightWriter::spawn(store, errors()).expect("thread");
    // Records pending, and the writer held off the slot past the flush's bound.
    let (lock, _) = &*writer.slot;
    let mut held = lock.lock().expect("slot");
    held.records = Some(records(1));
    let w = writer.clone();
    let flusher = std::thread::spawn(move || w.flush(Duration::from_millis(100)));
    std::thread::sleep(Duration::from_secs(1));
    drop(held);
    assert!(
        !flusher.join().expect("flusher"),
        "a flush past its bound returns false"
    );
}

/// An empty `stateDir` keeps no file; a missing directory is created.
#[test]
fn open_creates_the_state_directory() {
    assert!(open("").is_none());
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("a/b");
    let store = open(state.to_str().expect("utf-8"))
        .expect("configured")
        .expect("created");
    assert!(state.is_dir());
    assert_eq!(store.path(), state.join(FILE));
}
