//! Where every source delivers: the queue's sender, the coalesced count and the sources' states,
//! shared between the source tasks and [`super::Wakeups`].

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Instant,
};

use tokio::sync::mpsc;

use super::vocab::{SourceKind, SourceState, WakeSource, Wakeup};

/// Shared between the tasks and the owner: where wake-ups go and what state each source is in.
#[derive(Debug, Clone)]
pub(crate) struct Sink {
    pub tx: mpsc::Sender<Wakeup>,
    pub coalesced: Arc<AtomicU64>,
    pub states: Arc<Mutex<BTreeMap<SourceKind, SourceState>>>,
}

impl Sink {
    /// Never waits: when the queue is full a wake-up is already pending, and the sampler reads
    /// the current state whichever wake-up it processes, so this one is coalesced (and counted).
    /// Returns false once the receiver is gone.
    pub fn deliver(&self, source: WakeSource) -> bool {
        let w = Wakeup {
            source,
            at: Instant::now(),
        };
        match self.tx.try_send(w) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.coalesced.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    pub fn set_state(&self, kind: SourceKind, state: SourceState) {
        match self.states.lock() {
            Ok(mut s) => {
                s.insert(kind, state);
            }
            // A panic while holding this lock cannot leave the map inconsistent (single
            // inserts), so the data is still good.
            Err(poisoned) => {
                poisoned.into_inner().insert(kind, state);
            }
        }
    }

    /// A running source stopped working: log it and report it.
    pub fn failed(&self, kind: SourceKind, reason: String) {
        tracing::warn!(source = kind.as_str(), %reason, "wake-up source stopped");
        self.set_state(kind, SourceState::Unavailable { reason });
    }
}
