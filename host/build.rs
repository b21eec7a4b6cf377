//! Embeds the project templates and guest SDKs for `wharf new`, so the
//! binary alone can start a handler project in any supported language.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Languages `wharf new` knows, with the folder their SDK is copied to.
const LANGUAGES: &[(&str, &str, &str)] = &[
    ("rust", "rust", "wharf-guest"),
    ("js", "js", "wharf"),
    ("python", "python", "wharf"),
    ("go", "go", "wharf-sdk"),
    ("c", "c", "wharf"),
];

/// Build outputs and caches that must never reach a new project.
const SKIPPED: &[&str] = &["node_modules", "__pycache__", "target", ".venv", "build"];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest.parent().expect("host/ has a parent").to_owned();
    let mut out = String::from("&[\n");
    for (lang, sdk, sdk_dir) in LANGUAGES {
        let template = root.join("templates").join(lang);
        let sdk_root = root.join("guest-sdk").join(sdk);
        println!("cargo:rerun-if-changed={}", template.display());
        println!("cargo:rerun-if-changed={}", sdk_root.display());
        let mut files = Vec::new();
        collect(&template, &template, "", &mut files);
        let mut sdk_files = Vec::new();
        collect(&sdk_root, &sdk_root, sdk_dir, &mut sdk_files);
        // The SDK's README documents the SDK in this repository; the new
        // project gets the template's own.
        sdk_files.retain(|(relative, _)| *relative != format!("{sdk_dir}/README.md"));
        files.extend(sdk_files);
        files.sort();
        writeln!(out, "    (\"{lang}\", &[").expect("string write");
        for (relative, path) in files {
            writeln!(
                out,
                "        ({relative:?}, include_bytes!({:?}).as_slice()),",
                path.display().to_string()
            )
            .expect("string write");
        }
        out.push_str("    ]),\n");
    }
    out.push_str("]\n");
    let dest = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo")).join("templates.rs");
    std::fs::write(dest, out).expect("write templates.rs");
}

/// Every file under `dir` (following symlinks), as (path in the new project, path on disk).
fn collect(base: &Path, dir: &Path, prefix: &str, files: &mut Vec<(String, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if SKIPPED.contains(&name.as_str()) || name.ends_with(".wasm") {
            continue;
        }
        let path = entry.path();
        println!("cargo:rerun-if-changed={}", path.display());
        if path.is_dir() {
            collect(base, &path, prefix, files);
        } else if path.is_file() {
            let inside = path.strip_prefix(base).expect("under base");
            let relative = Path::new(prefix).join(inside);
            let canonical = path.canonicalize().expect("readable file");
            files.push((relative.to_string_lossy().into_owned(), canonical));
        }
    }
}
