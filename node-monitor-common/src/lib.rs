//! Types shared by node-monitor's eBPF programs and the agent. `no_std`, `#[repr(C)]`.
//!
//! Everything that crosses the kernel/user boundary is defined here once: the event envelope and
//! payloads written into the ring buffer ([`event`]), the configuration and layout records the
//! agent writes into maps before attaching ([`config`]), the per-CPU counter slots
//! ([`counters`]), map and program names ([`names`]) and the small decisions both sides must
//! agree on ([`logic`]).
//!
//! Wire types are padding-free `#[repr(C)]` structs of integers and byte arrays (checked at
//! compile time), so every bit pattern is a valid value and a record can be viewed as bytes and
//! read back from bytes without undefined behaviour.
#![no_std]

#[cfg(test)]
extern crate std;

pub mod config;
pub mod counters;
pub mod event;
pub mod logic;
pub mod names;

/// Length of a task's `comm` (`TASK_COMM_LEN` in `include/linux/sched.h`).
pub const TASK_COMM_LEN: usize = 16;

/// A padding-free `#[repr(C)]` type made only of integers and arrays of integers.
///
/// # Safety
/// Implementors must have no padding bytes and accept every bit pattern as a valid value; the
/// `plain!` macro checks the size against the sum of the fields at compile time.
pub unsafe trait Plain: Copy + 'static {}

/// The bytes of a plain value (to encode it, e.g. in tests and in the synthetic event path).
pub fn as_bytes<T: Plain>(value: &T) -> &[u8] {
    // SAFETY: `T: Plain` has no padding, so all `size_of::<T>()` bytes are initialised.
    unsafe { core::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }
}

/// Reads a plain value from the start of `bytes`; `None` when `bytes` is shorter than `T`.
pub fn from_bytes<T: Plain>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: the length was checked; `T: Plain` accepts any bit pattern; the read is unaligned.
    Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// Declares wire types `Plain` after checking at compile time that they have no padding.
macro_rules! plain {
    ($($ty:ty { $($field_ty:ty),+ $(,)? }),+ $(,)?) => {
        $(
            const _: () = assert!(
                size_of::<$ty>() == 0 $(+ size_of::<$field_ty>())+,
                concat!(stringify!($ty), " has padding")
            );
            // SAFETY: padding-free (asserted above) and made of integers only.
            unsafe impl $crate::Plain for $ty {}
            #[cfg(feature = "user")]
            // SAFETY: as above; aya reads these out of maps.
            unsafe impl aya::Pod for $ty {}
        )+
    };
}
pub(crate) use plain;
