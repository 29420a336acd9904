//! The event stream: the ring buffer registered with tokio (epoll on the map's fd), drained in
//! batches and decoded into [`KernelEvent`]s.
use std::collections::VecDeque;

use aya::maps::{MapData, RingBuf};
use node_monitor_common::event::DecodeError;
use tokio::io::unix::AsyncFd;
use tracing::warn;

use super::event::KernelEvent;

/// Records decoded per wake-up before yielding back to the runtime.
const BATCH: usize = 512;

/// Why [`EventStream::next`] returned no event.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// A malformed record (counted and logged; the stream goes on).
    #[error("malformed kernel event record")]
    Decode(#[source] DecodeError),
    /// The ring buffer cannot be polled any more (the stream is over).
    #[error("polling the event ring buffer")]
    Io(#[source] std::io::Error),
}

impl StreamError {
    /// Whether the stream is over.
    pub fn is_fatal(&self) -> bool {
        matches!(self, Self::Io(_))
    }
}

/// Kernel events as they arrive.
pub struct EventStream {
    fd: AsyncFd<RingBuf<MapData>>,
    pending: VecDeque<Result<KernelEvent, DecodeError>>,
    reclaim_attached: bool,
    received: u64,
    decode_errors: u64,
}

impl EventStream {
    pub(crate) fn new(fd: AsyncFd<RingBuf<MapData>>, reclaim_attached: bool) -> Self {
        Self {
            fd,
            pending: VecDeque::with_capacity(BATCH),
            reclaim_attached,
            received: 0,
            decode_errors: 0,
        }
    }

    /// The next event. A malformed record is an `Err(StreamError::Decode)` (call again); an
    /// `Err(StreamError::Io)` ends the stream.
    pub async fn next(&mut self) -> Result<KernelEvent, StreamError> {
        loop {
            if let Some(r) = self.pending.pop_front() {
                return r.map_err(StreamError::Decode);
            }
            let mut guard = self.fd.readable_mut().await.map_err(StreamError::Io)?;
            let drained = Self::drain(
                guard.get_inner_mut(),
                &mut self.pending,
                self.reclaim_attached,
                &mut self.received,
                &mut self.decode_errors,
            );
            // Only a ring buffer read empty may wait for the next wake-up: epoll is
            // edge-triggered for tokio, so a batch cut short must be finished first.
            if drained < BATCH {
                guard.clear_ready();
            }
        }
    }

    /// The events already in the ring buffer, without waiting.
    pub fn try_drain(&mut self) -> Vec<Result<KernelEvent, StreamError>> {
        let mut out: Vec<_> = self
            .pending
            .drain(..)
            .map(|r| r.map_err(StreamError::Decode))
            .collect();
        let mut batch = VecDeque::new();
        loop {
            let n = Self::drain(
                self.fd.get_mut(),
                &mut batch,
                self.reclaim_attached,
                &mut self.received,
                &mut self.decode_errors,
            );
            out.extend(batch.drain(..).map(|r| r.map_err(StreamError::Decode)));
            if n < BATCH {
                return out;
            }
        }
    }

    fn drain(
        ring: &mut RingBuf<MapData>,
        out: &mut VecDeque<Result<KernelEvent, DecodeError>>,
        reclaim_attached: bool,
        received: &mut u64,
        decode_errors: &mut u64,
    ) -> usize {
        let mut n = 0;
        while n < BATCH {
            let Some(item) = ring.next() else { break };
            n += 1;
            *received += 1;
            let decoded = KernelEvent::decode(&item, reclaim_attached);
            if let Err(e) = &decoded {
                *decode_errors += 1;
                warn!(error = %e, len = item.len(), "malformed kernel event record");
            }
            out.push_back(decoded);
        }
        n
    }

    /// Records read from the ring buffer (well-formed or not).
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Records that could not be decoded.
    pub fn decode_errors(&self) -> u64 {
        self.decode_errors
    }
}
