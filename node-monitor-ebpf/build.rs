//! Makes cargo rebuild the programs when bpf-linker changes (as aya-template does).
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
