use super::*;

#[test]
fn decisions_follow_client_go() {
    let d = Duration::from_secs(15);
    let cases = [
        (None, 0, Decision::Acquire),
        (Some(""), 0, Decision::Acquire),
        (Some("me"), 0, Decision::Renew),
        (Some("me"), 100, Decision::Renew),
        (
            Some("other"),
            14,
            Decision::Follow {
                holder: "other".into(),
            },
        ),
        (Some("other"), 15, Decision::Acquire),
    ];
    for (holder, secs, want) in cases {
        assert_eq!(
            decide(holder, "me", Duration::from_secs(secs), d),
            want,
            "{holder:?} unchanged for {secs}s"
        );
    }
}

#[test]
fn lease_transitions_saturate() {
    let cases = [
        (None, false, 0),
        (None, true, 1),
        (Some(5), true, 6),
        (Some(5), false, 5),
        (Some(i32::MAX), true, i32::MAX),
        (Some(-3), true, 1),
    ];
    for (recorded, changed, want) in cases {
        assert_eq!(
            next_transitions(recorded, changed),
            want,
            "{recorded:?} {changed}"
        );
    }
}

#[test]
fn a_candidate_waits_for_the_duration_the_record_states() {
    let own = Duration::from_secs(15);
    let cases = [
        (Some(60), Duration::from_secs(60)),
        (Some(5), Duration::from_secs(5)),
        (None, own),
        (Some(0), own),
        (Some(-1), own),
        (Some(i32::MAX), Duration::from_secs(2_147_483_647)),
    ];
    for (record, want) in cases {
        assert_eq!(takeover_after(record, own), want, "{record:?}");
    }
    // The holder promised 60 s; we would give up after our own 15 s: not yet after 20 s.
    assert_eq!(
        decide(
            Some("other"),
            "me",
            Duration::from_secs(20),
            takeover_after(Some(60), own)
        ),
        Decision::Follow {
            holder: "other".into()
        }
    );
}

#[tokio::test]
async fn work_in_flight_is_abandoned_when_leadership_is_lost() {
    let (tx, mut rx) = watch::channel(true);
    // Finishes while leading.
    assert_eq!(run_while_leading(async { 7 }, &mut rx).await, Some(7));
    // A long pass (never finishing here) stops as soon as leadership goes.
    let flip = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        tx.send_replace(false);
        tx
    });
    let out = run_while_leading(std::future::pending::<()>(), &mut rx).await;
    assert_eq!(out, None);
    let tx = flip.await.expect("flip");
    // Not leading at all: nothing runs.
    let mut ran = false;
    assert_eq!(run_while_leading(async { ran = true }, &mut rx).await, None);
    assert!(!ran);
    drop(tx);
}
