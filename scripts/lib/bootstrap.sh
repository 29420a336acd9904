# Sourced by the entry points in scripts/: what compiling the chores (`cargo xtask`, xtask/) needs
# on a fresh machine: rustup, the pinned host toolchain (rust-toolchain.toml) and a C linker.
# Everything else is installed by `cargo xtask setup`.
export PATH="$HOME/.cargo/bin:$PATH"
command -v rustup >/dev/null || { echo "rustup is required (https://rustup.rs)" >&2; exit 1; }
host_toolchain=$(sed -n 's/^channel = "\(.*\)"$/\1/p' rust-toolchain.toml)
[[ -n "$host_toolchain" ]] || { echo "bootstrap: no channel in rust-toolchain.toml" >&2; exit 1; }
if ! rustup toolchain list | grep -q "^${host_toolchain}-"; then
  echo "bootstrap: installing Rust ${host_toolchain}" >&2
  rustup toolchain install "$host_toolchain" --profile minimal --component clippy,rustfmt >&2
fi
if ! command -v cc >/dev/null; then
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  echo "bootstrap: installing a C toolchain (gcc, libc6-dev); linking Rust needs one" >&2
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-remove --no-install-recommends \
    gcc libc6-dev >&2
fi
