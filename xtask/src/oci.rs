//! OCI image archives built without a daemon or a registry: one gzip layer, a config, a manifest
//! and an index in an OCI image layout, packed as a tar that `ctr images import`, `podman load`
//! and `skopeo copy oci-archive:` read.
//!
//! The output is reproducible: entries are sorted, owned by root, dated at `mtime` (0 unless
//! `SOURCE_DATE_EPOCH` says otherwise), and gzip's header carries no time or name, so the same
//! inputs give the same digests.
use std::{
    collections::BTreeMap,
    io::Write as _,
    path::{Component, Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use flate2::{Compression, GzBuilder};
use serde_json::json;
use sha2::{Digest as _, Sha256};

const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const INDEX_TYPE: &str = "application/vnd.oci.image.index.v1+json";

/// One file of the image's root file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub contents: Vec<u8>,
    pub mode: u32,
}

/// An image to build.
#[derive(Debug, Clone)]
pub struct Image {
    /// The full reference, e.g. `ghcr.io/node-monitor/node-monitor:0.1.0`.
    pub name: String,
    pub entrypoint: Vec<String>,
    /// `uid[:gid]`, as in the image config's `User`.
    pub user: String,
    pub env: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// Files by absolute path in the image.
    pub files: BTreeMap<PathBuf, Entry>,
    /// Empty directories (with their mode) besides the parents of `files`.
    pub dirs: BTreeMap<PathBuf, u32>,
    /// The time stamped on every entry and in the config (seconds since the epoch).
    pub mtime: u64,
}

/// `sha256:<hex>` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let mut s = String::with_capacity(7 + 64);
    s.push_str("sha256:");
    for b in hash {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The tag part of a reference (`repo:tag`), for `org.opencontainers.image.ref.name`.
pub fn tag_of(name: &str) -> Result<&str> {
    let last = name.rsplit('/').next().unwrap_or(name);
    match last.rsplit_once(':') {
        Some((_, tag)) if !tag.is_empty() => Ok(tag),
        _ => bail!("image name {name:?} has no tag (expected repository:tag)"),
    }
}

/// `path` as a relative archive name; absolute, normal components only.
fn archive_name(path: &Path) -> Result<PathBuf> {
    let mut out = PathBuf::new();
    let mut comps = path.components();
    if comps.next() != Some(Component::RootDir) {
        bail!("image path {} is not absolute", path.display());
    }
    for c in comps {
        match c {
            Component::Normal(p) => out.push(p),
            _ => bail!("image path {} has a {c:?} component", path.display()),
        }
    }
    if out.as_os_str().is_empty() {
        bail!("image path {} names the root", path.display());
    }
    Ok(out)
}

/// The layer as an uncompressed tar: every parent directory, then files and directories in path
/// order.
pub fn layer_tar(image: &Image) -> Result<Vec<u8>> {
    let mut dirs: BTreeMap<PathBuf, u32> = BTreeMap::new();
    for (path, mode) in &image.dirs {
        dirs.insert(archive_name(path)?, *mode);
    }
    let mut files = BTreeMap::new();
    for (path, entry) in &image.files {
        let name = archive_name(path)?;
        let mut parent = name.parent();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            dirs.entry(p.to_owned()).or_insert(0o755);
            parent = p.parent();
        }
        files.insert(name, entry);
    }
    if let Some(clash) = files.keys().find(|f| dirs.contains_key(*f)) {
        bail!("{} is both a file and a directory", clash.display());
    }
    let mut names: Vec<(&PathBuf, Option<&Entry>, u32)> = dirs
        .iter()
        .map(|(p, m)| (p, None, *m))
        .chain(files.iter().map(|(p, e)| (p, Some(*e), e.mode)))
        .collect();
    names.sort_by(|a, b| a.0.cmp(b.0));

    let mut builder = tar::Builder::new(Vec::new());
    builder.mode(tar::HeaderMode::Deterministic);
    for (name, entry, mode) in names {
        let mut header = tar::Header::new_ustar();
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(image.mtime);
        header.set_mode(mode);
        match entry {
            None => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                let dir = format!("{}/", name.display());
                builder
                    .append_data(&mut header, dir, std::io::empty())
                    .context("tar directory")?;
            }
            Some(e) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(e.contents.len() as u64);
                builder
                    .append_data(&mut header, name, e.contents.as_slice())
                    .context("tar file")?;
            }
        }
    }
    builder.into_inner().context("finishing the layer tar")
}

fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    // No name and time 0 in the header: the same layer always compresses to the same bytes.
    let mut gz = GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), Compression::best());
    gz.write_all(bytes)?;
    Ok(gz.finish()?)
}

fn rfc3339(secs: u64) -> String {
    // Civil date from days since the epoch (Howard Hinnant's algorithm), to avoid a date crate.
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The blobs of an image: `(digest, bytes)` for the layer, the config and the manifest, and the
/// index that names the manifest.
pub struct Built {
    pub blobs: Vec<(String, Vec<u8>)>,
    pub index: Vec<u8>,
    pub manifest_digest: String,
}

/// The OCI architecture of a Rust target architecture: the image holds the build host's own
/// binaries and libraries, so it is the build host's architecture.
pub fn oci_arch(rust_arch: &str) -> Result<&'static str> {
    Ok(match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => {
            bail!("no OCI architecture for the build host's {other:?}: build on x86_64 or aarch64")
        }
    })
}

pub fn build(image: &Image) -> Result<Built> {
    let tag = tag_of(&image.name)?;
    let arch = oci_arch(std::env::consts::ARCH)?;
    let tar = layer_tar(image)?;
    let diff_id = digest(&tar);
    let layer = gzip(&tar)?;
    let layer_digest = digest(&layer);
    let created = rfc3339(image.mtime);
    let config = json!({
        "created": created,
        "architecture": arch,
        "os": "linux",
        "config": {
            "Entrypoint": image.entrypoint,
            "User": image.user,
            "Env": image.env,
            "Labels": image.labels,
        },
        "rootfs": { "type": "layers", "diff_ids": [diff_id] },
        "history": [{ "created": created, "created_by": "cargo xtask image" }],
    });
    let config = serde_json::to_vec(&config)?;
    let config_digest = digest(&config);
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": { "mediaType": CONFIG_TYPE, "digest": config_digest, "size": config.len() },
        "layers": [{ "mediaType": LAYER_TYPE, "digest": layer_digest, "size": layer.len() }],
    });
    let manifest = serde_json::to_vec(&manifest)?;
    let manifest_digest = digest(&manifest);
    let index = json!({
        "schemaVersion": 2,
        "mediaType": INDEX_TYPE,
        "manifests": [{
            "mediaType": MANIFEST_TYPE,
            "digest": manifest_digest,
            "size": manifest.len(),
            "platform": { "architecture": arch, "os": "linux" },
            "annotations": {
                "io.containerd.image.name": image.name,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    });
    Ok(Built {
        blobs: vec![
            (layer_digest, layer),
            (config_digest, config),
            (manifest_digest.clone(), manifest),
        ],
        index: serde_json::to_vec(&index)?,
        manifest_digest,
    })
}

/// The OCI image layout of `built`, packed as one tar.
pub fn archive(built: &Built, mtime: u64) -> Result<Vec<u8>> {
    let mut files: Vec<(String, &[u8])> = vec![
        ("oci-layout".into(), br#"{"imageLayoutVersion":"1.0.0"}"#),
        ("index.json".into(), built.index.as_slice()),
    ];
    for (d, bytes) in &built.blobs {
        let hex = d.strip_prefix("sha256:").unwrap_or(d);
        files.push((format!("blobs/sha256/{hex}"), bytes.as_slice()));
    }
    let mut builder = tar::Builder::new(Vec::new());
    for dir in ["blobs/", "blobs/sha256/"] {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_mtime(mtime);
        h.set_size(0);
        builder.append_data(&mut h, dir, std::io::empty())?;
    }
    for (name, bytes) in files {
        let mut h = tar::Header::new_ustar();
        h.set_mode(0o644);
        h.set_mtime(mtime);
        h.set_size(bytes.len() as u64);
        builder.append_data(&mut h, name, bytes)?;
    }
    Ok(builder.into_inner()?)
}

/// The shared libraries `ldd` lists for `binary`, as absolute paths (empty for a static binary).
pub fn parse_ldd(output: &str) -> Vec<PathBuf> {
    let mut libs = Vec::new();
    for line in output.lines().map(str::trim) {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)", "/lib64/ld-linux-x86-64.so.2 (0x…)";
        // "linux-vdso.so.1 (0x…)" is the kernel's and has no file.
        let path = match line.split_once(" => ") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/')),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    libs.sort();
    libs.dedup();
    libs
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn image(files: &[(&str, &[u8])]) -> Image {
        Image {
            name: "example.local/app:1.0".into(),
            entrypoint: vec!["/bin/app".into()],
            user: "0".into(),
            env: vec!["PATH=/bin".into()],
            labels: BTreeMap::new(),
            files: files
                .iter()
                .map(|(p, c)| {
                    (
                        PathBuf::from(p),
                        Entry {
                            contents: c.to_vec(),
                            mode: 0o755,
                        },
                    )
                })
                .collect(),
            dirs: BTreeMap::from([(PathBuf::from("/tmp"), 0o1777)]),
            mtime: 0,
        }
    }

    #[test]
    fn the_architecture_is_the_build_hosts() {
        assert_eq!(oci_arch("x86_64").unwrap(), "amd64");
        assert_eq!(oci_arch("aarch64").unwrap(), "arm64");
        assert!(
            oci_arch("riscv64")
                .unwrap_err()
                .to_string()
                .contains("riscv64")
        );
    }

    #[test]
    fn tags() {
        assert_eq!(tag_of("ghcr.io/a/b:0.1.0").unwrap(), "0.1.0");
        assert_eq!(tag_of("localhost:5000/a:x").unwrap(), "x");
        for bad in ["ghcr.io/a/b", "localhost:5000/a", "a:"] {
            let e = tag_of(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn the_layer_lists_parents_files_and_dirs_in_order() {
        let tar = layer_tar(&image(&[("/bin/app", b"x"), ("/lib/x/libc.so", b"yy")])).unwrap();
        let mut archive = tar::Archive::new(tar.as_slice());
        let got: Vec<(String, u32, u64)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().display().to_string(),
                    h.mode().unwrap(),
                    h.uid().unwrap(),
                )
            })
            .collect();
        let want = [
            ("bin/", 0o755),
            ("bin/app", 0o755),
            ("lib/", 0o755),
            ("lib/x/", 0o755),
            ("lib/x/libc.so", 0o755),
            ("tmp/", 0o1777),
        ];
        let got_names: Vec<(&str, u32)> = got.iter().map(|(n, m, _)| (n.as_str(), *m)).collect();
        assert_eq!(got_names, want);
        assert!(got.iter().all(|(_, _, uid)| *uid == 0));
    }

    #[test]
    fn bad_paths_are_refused_with_the_path() {
        for bad in ["bin/app", "/bin/../etc/passwd", "/"] {
            let e = layer_tar(&image(&[(bad, b"x")])).unwrap_err().to_string();
            assert!(
                e.contains(bad.trim_end_matches('/')) || bad == "/",
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn builds_are_reproducible_and_digests_match_the_blobs() {
        let a = build(&image(&[("/bin/app", b"x")])).unwrap();
        let b = build(&image(&[("/bin/app", b"x")])).unwrap();
        assert_eq!(a.manifest_digest, b.manifest_digest);
        let c = build(&image(&[("/bin/app", b"z")])).unwrap();
        assert_ne!(a.manifest_digest, c.manifest_digest);
        for (d, bytes) in &a.blobs {
            assert_eq!(&digest(bytes), d);
        }
        let index: Value = serde_json::from_slice(&a.index).unwrap();
        let m = &index["manifests"][0];
        assert_eq!(m["digest"], a.manifest_digest.as_str());
        assert_eq!(
            m["annotations"]["io.containerd.image.name"],
            "example.local/app:1.0"
        );
        assert_eq!(m["annotations"]["org.opencontainers.image.ref.name"], "1.0");
        // The config's diff_id is the digest of the uncompressed layer.
        let config: Value = serde_json::from_slice(&a.blobs[1].1).unwrap();
        let tar = layer_tar(&image(&[("/bin/app", b"x")])).unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], digest(&tar).as_str());
        assert_eq!(config["created"], "1970-01-01T00:00:00Z");
    }

    #[test]
    fn dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_996_799), "2026-11-29T23:59:59Z");
    }

    #[test]
    fn ldd_output() {
        let out = "\tlinux-vdso.so.1 (0x00007ffc)\n\
                   \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(out),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert!(parse_ldd("\tstatically linked\n").is_empty());
        assert!(parse_ldd("\tnot a dynamic executable\n").is_empty());
    }
}
