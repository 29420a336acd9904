//! Compiles c/task.c (the CO-RE reads of kernel structs) to LLVM bitcode that bpf-linker links
//! with the Rust programs, and makes cargo rebuild the programs when bpf-linker changes.
use std::{env, fs, path::PathBuf, process::Command};

fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
    if env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("bpf") {
        return;
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let include = out.join("include");
    fs::create_dir_all(include.join("bpf")).expect("create include dir");
    for (name, text) in libbpf_sys::API_HEADERS {
        fs::write(include.join("bpf").join(name), text).expect("write header");
    }
    let bc = out.join("task.bc");
    println!("cargo:rerun-if-changed=c/task.c");
    let status = Command::new("/usr/lib/llvm-22/bin/clang")
        .args(["-target", "bpfel", "-O2", "-g", "-emit-llvm", "-c"])
        .arg("-I")
        .arg(&include)
        .arg("c/task.c")
        .arg("-o")
        .arg(&bc)
        .status()
        .expect("run clang");
    assert!(status.success(), "clang failed");
    println!("cargo:rustc-link-arg={}", bc.display());
}
