//! Compiles c/task.c, the programs' CO-RE reads of kernel structs, to LLVM bitcode that
//! bpf-linker links (with LTO) into the Rust programs, and makes cargo rebuild the programs when
//! bpf-linker changes.
//!
//! The headers (bpf_helpers.h, bpf_core_read.h) are libbpf's, as libbpf-sys vendors them. The
//! compiler is the clang of bpf-linker's LLVM (xtask/src/setup.rs installs both), so that the
//! bitcode's format is the linker's; `NODE_MONITOR_EBPF_CLANG` names another.
use std::{env, fs, path::PathBuf, process::Command};

/// The clang of LLVM 22, bpf-linker's LLVM (`LLVM_MAJOR` in xtask/src/setup.rs).
const CLANG: &str = "/usr/lib/llvm-22/bin/clang";
const SOURCE: &str = "c/task.c";

fn main() {
    // aya-build passes `--cfg bpf_target_arch="<the host's architecture>"` (reboot.rs reads
    // system call arguments from that architecture's registers).
    println!(
        "cargo::rustc-check-cfg=cfg(bpf_target_arch, values(\"x86_64\", \"aarch64\", \"arm\", \"riscv64\", \"powerpc64\", \"s390x\", \"mips\", \"loongarch64\"))"
    );
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
    // The agent's build-dependency on this crate builds it for the host too: no C then.
    if env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("bpf") {
        return;
    }
    println!("cargo:rerun-if-env-changed=NODE_MONITOR_EBPF_CLANG");
    println!("cargo:rerun-if-changed={SOURCE}");
    let clang = env::var("NODE_MONITOR_EBPF_CLANG").unwrap_or_else(|_| CLANG.to_owned());
    println!("cargo:rerun-if-changed={clang}");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let include = out.join("include");
    fs::create_dir_all(include.join("bpf"))
        .unwrap_or_else(|e| panic!("creating {}: {e}", include.display()));
    for (name, text) in libbpf_sys::API_HEADERS {
        let path = include.join("bpf").join(name);
        fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
    let bitcode = out.join("task.bc");
    // -g: the types of the relocated accesses go into the object's BTF (bpf-linker --btf).
    let status = Command::new(&clang)
        .args(["-target", "bpfel", "-O2", "-g", "-emit-llvm", "-c"])
        .args(["-Wall", "-Werror"])
        .arg("-I")
        .arg(&include)
        .arg(SOURCE)
        .arg("-o")
        .arg(&bitcode)
        .status()
        .unwrap_or_else(|e| {
            panic!("running {clang} (install clang-22: scripts/setup.sh, or set NODE_MONITOR_EBPF_CLANG): {e}")
        });
    assert!(
        status.success(),
        "{clang} failed to compile {SOURCE}: {status}"
    );
    println!("cargo:rustc-link-arg={}", bitcode.display());
}
