//! Pure decision logic: no I/O, no async, time passed in.
