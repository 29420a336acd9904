//! The guest VM tier (qemu and the guest image, under /tmp/nm-vm.lock): cgroup v2, systemd-logind,
//! the kernel matrix. One test binary for the tier (`cargo test -p node-monitor-tests --test vm`);
//! each module is one concern, run alone with a filter (`-- vm_kernels::`).
mod vm_cgroup2;
mod vm_kernels;
mod vm_shutdown;
