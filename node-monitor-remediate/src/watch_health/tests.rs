//! The Lease watch's freshness check on tokio's paused clock: a list stands for the API server,
//! a map for the watch's cache.
use std::{cell::RefCell, collections::BTreeMap, rc::Rc, time::Duration};

use node_monitor_core::remediation::RemediationConfig;

use super::{WatchFreshness, confirm_watch};

/// What the API server lists (name → resourceVersion), whether it answers, and the watch cache.
#[derive(Default)]
struct World {
    listed: BTreeMap<String, String>,
    list_hangs: bool,
    list_fails: bool,
    cached: BTreeMap<String, String>,
}

/// Runs the check against `world` for `run` of the paused clock; returns the view's age then.
async fn check_for(
    world: &Rc<RefCell<World>>,
    freshness: &WatchFreshness,
    run: Duration,
    every: Duration,
) -> Option<Duration> {
    let list = || {
        let world = world.clone();
        async move {
            let (hangs, fails, listed) = {
                let w = world.borrow();
                (w.list_hangs, w.list_fails, w.listed.clone())
            };
            if hangs {
                std::future::pending::<()>().await;
            }
            if fails {
                return Err("503 Service Unavailable".to_owned());
            }
            Ok(listed.into_iter().collect())
        }
    };
    let cached = |name: &str| world.borrow().cached.get(name).cloned();
    let checking = confirm_watch(list, cached, freshness, every);
    assert!(
        tokio::time::timeout(run, checking).await.is_err(),
        "the check runs until dropped"
    );
    freshness.age()
}

fn set(map: &mut BTreeMap<String, String>, version: &str) {
    for n in ["n1", "n2"] {
        map.insert(n.to_owned(), version.to_owned());
    }
}

/// A watch that keeps up is confirmed every round; one that stops delivering (the API server's
/// Leases move on, the cache does not) ages past `apiStaleAfter`, so the controller judges no
/// node dead on it; once it catches up it is confirmed again.
#[tokio::test(start_paused = true)]
async fn a_stalled_lease_watch_ages_and_a_caught_up_one_is_confirmed() {
    let stale_after = RemediationConfig::default().storm.api_stale_after;
    let every = Duration::from_secs(2);
    let world = Rc::new(RefCell::new(World::default()));
    set(&mut world.borrow_mut().listed, "5");
    set(&mut world.borrow_mut().cached, "5");
    let freshness = WatchFreshness::default();

    let age = check_for(&world, &freshness, Duration::from_secs(30), every).await;
    assert!(age.is_some_and(|a| a <= every), "{age:?}");

    // The watch stalls: the nodes renew (version 6), the cache stays at 5.
    set(&mut world.borrow_mut().listed, "6");
    let age = check_for(&world, &freshness, Duration::from_secs(30), every).await;
    assert!(age.is_some_and(|a| a > stale_after), "{age:?}");
    assert!(
        age.is_some_and(|a| a >= Duration::from_secs(30)),
        "never confirmed during the stall: {age:?}"
    );

    // A cache ahead of the list (the watch delivered a renewal after the list) is current too.
    set(&mut world.borrow_mut().cached, "7");
    let age = check_for(&world, &freshness, Duration::from_secs(5), every).await;
    assert!(age.is_some_and(|a| a <= every), "{age:?}");
}

/// A list that never answers (a black-holed API server) or fails confirms nothing: the view ages
/// from its last confirmation, whatever the cache holds.
#[tokio::test(start_paused = true)]
async fn an_unanswered_or_failed_list_confirms_nothing() {
    let stale_after = RemediationConfig::default().storm.api_stale_after;
    let every = Duration::from_secs(2);
    for (hangs, fails) in [(true, false), (false, true)] {
        let world = Rc::new(RefCell::new(World::default()));
        set(&mut world.borrow_mut().listed, "5");
        set(&mut world.borrow_mut().cached, "5");
        let freshness = WatchFreshness::default();
        check_for(&world, &freshness, Duration::from_secs(5), every).await;
        {
            let mut w = world.borrow_mut();
            w.list_hangs = hangs;
            w.list_fails = fails;
        }
        let age = check_for(&world, &freshness, Duration::from_secs(30), every).await;
        assert!(
            age.is_some_and(|a| a > stale_after && a >= Duration::from_secs(30)),
            "hangs={hangs} fails={fails}: {age:?}"
        );
    }
    // Never confirmed at all: no age, which the controller takes as stale.
    let world = Rc::new(RefCell::new(World::default()));
    set(&mut world.borrow_mut().listed, "5");
    world.borrow_mut().list_hangs = true;
    let freshness = WatchFreshness::default();
    let age = check_for(&world, &freshness, Duration::from_secs(30), every).await;
    assert_eq!(age, None);
}
