//! The guest VM tier (qemu and the guest image, under /tmp/nm-vm.lock): cgroup v2 with the stand-in
//! and systemd-logind (the kernel matrix is the real-node tier's, one kernel per boot). One test binary for the tier (`cargo test -p node-monitor-tests --test vm`);
//! each module is one concern, run alone with a filter (`-- vm_shutdown::`).
mod vm_fence_qmp;
mod vm_shutdown;
