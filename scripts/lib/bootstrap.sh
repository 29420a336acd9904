# Sourced by the entry points in scripts/: what compiling the chores (`cargo xtask`, xtask/) needs
# on a fresh machine, rustup and a C linker; everything else is installed by `cargo xtask setup`.
export PATH="$HOME/.cargo/bin:$PATH"
command -v rustup >/dev/null || { echo "rustup is required (https://rustup.rs)" >&2; exit 1; }
if ! command -v cc >/dev/null; then
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  echo "bootstrap: installing a C toolchain (gcc, libc6-dev); linking Rust needs one" >&2
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-remove --no-install-recommends \
    gcc libc6-dev >&2
fi
