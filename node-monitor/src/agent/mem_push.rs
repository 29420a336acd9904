//! The memory push as the loop drives it: armed while a memory threshold is near (see
//! [`node_monitor_core::arming::mem_push`]), its programs attached while armed.
use node_monitor_core::{
    arming::mem_push::{PushPolicy, batch_pages, keep_attached},
    signals::Observations,
    signals::threshold::Threshold,
    units::clock::Timestamp,
};
use tracing::{debug, warn};

/// The memory push as the loop drives it.
pub(super) struct MemPush {
    pub(super) control: Box<dyn PushArm>,
    pub(super) policy: PushPolicy,
    /// The batch last written (0: disarmed); `None` before the first write or after a failure.
    pub(super) armed: Option<u64>,
    /// The last write failed (logged once until one succeeds).
    pub(super) failing: bool,
    /// When a pass last chose a non-zero batch.
    pub(super) last_armed: Option<Timestamp>,
    /// The programs' attachment last asked for.
    pub(super) attach_asked: bool,
}

impl MemPush {
    /// Disarmed, with nothing written yet.
    pub(super) fn new(control: Box<dyn PushArm>, policy: PushPolicy) -> Self {
        Self {
            control,
            policy,
            armed: None,
            failing: false,
            last_armed: None,
            attach_asked: false,
        }
    }

    /// Arms the push for the memory `thresholds` near in `observations`, disarms it when none
    /// is; writes the kernel's map only when the batch changes. Asks for the programs attached
    /// while armed, and detached once disarmed for [`node_monitor_core::arming::mem_push::DETACH_AFTER`]
    /// (the batch is written first: a program attached before it is armed returns at once).
    pub(super) fn arm(
        &mut self,
        observations: &Observations,
        thresholds: &[Threshold],
        now: Timestamp,
    ) {
        let batch = batch_pages(observations, thresholds, self.policy);
        if batch > 0 {
            self.last_armed = Some(now);
        }
        let changed = self.write_batch(batch);
        let attach = keep_attached(batch, now, self.last_armed);
        // Asked again at each new batch while armed: an attach that failed is retried (the
        // switch ignores a request for the state it is in).
        if attach != self.attach_asked || (attach && batch > 0 && changed) {
            self.control.set_attached(attach);
            self.attach_asked = attach;
        }
    }

    /// Writes `batch` to the kernel's map when it changed; whether it did.
    fn write_batch(&mut self, batch: u64) -> bool {
        if self.armed == Some(batch) {
            return false;
        }
        match self.control.arm(batch) {
            Ok(()) => {
                debug!(batch_pages = batch, "memory push armed");
                self.armed = Some(batch);
                self.failing = false;
                true
            }
            Err(e) => {
                if !self.failing {
                    warn!(error = %e, batch_pages = batch, "arming the memory push failed");
                }
                self.armed = None;
                self.failing = true;
                false
            }
        }
    }
}

/// Arms the kernel's memory push with a batch of pages (0 disarms).
pub(super) trait PushArm: Send {
    fn arm(&self, pages: u64) -> Result<(), crate::ebpf::ProbeError>;
    /// Asks for the push's programs attached or detached; returns at once (the work, which may
    /// wait for the kernel, is done elsewhere).
    fn set_attached(&self, attached: bool);
}

impl PushArm for crate::ebpf::MemPushControl {
    fn arm(&self, pages: u64) -> Result<(), crate::ebpf::ProbeError> {
        crate::ebpf::MemPushControl::arm(self, pages)
    }

    fn set_attached(&self, attached: bool) {
        crate::ebpf::MemPushControl::set_attached(self, attached);
    }
}
