//! Turns the node into observations: cgroups, statvfs, procfs, and the wake-up sources.
