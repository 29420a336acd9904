//! Pure decision logic: no I/O, no async, time passed in.
pub mod kubelet_layout;
pub mod signals;
