//! `wharf new`: a ready-to-build handler project from a template, with the
//! language's SDK copied in so the project builds without this repository.

use std::fmt;
use std::path::Path;

use anyhow::{Context as _, bail};

/// A file of a new project: its path in the project and its contents.
type File = (&'static str, &'static [u8]);

/// The templates and SDKs built into this binary, by language.
static TEMPLATES: &[(&str, &[File])] = include!(concat!(env!("OUT_DIR"), "/templates.rs"));

/// A language `wharf new` can start a project in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    /// Rust, built for `wasm32-wasip2` with `wit-bindgen`.
    Rust,
    /// JavaScript, built with componentize-js.
    Js,
    /// Python, built with componentize-py.
    Python,
    /// Go, built with the Go toolchain for wasip1 and `wharf componentize`.
    Go,
    /// C, built with clang and wasi-libc and `wharf componentize`.
    C,
}

impl Language {
    /// Every language, in the order the docs list them.
    pub const ALL: [Language; 5] = [
        Language::Rust,
        Language::Js,
        Language::Python,
        Language::Go,
        Language::C,
    ];

    /// The name used on the command line and in the template folders.
    pub fn name(self) -> &'static str {
        match self {
            Language::Rust => "rust",
            Language::Js => "js",
            Language::Python => "python",
            Language::Go => "go",
            Language::C => "c",
        }
    }

    fn files(self) -> &'static [File] {
        TEMPLATES
            .iter()
            .find(|(name, _)| *name == self.name())
            .map_or(&[], |(_, files)| *files)
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Language {
    type Err = String;

    fn from_str(text: &str) -> Result<Language, String> {
        Language::ALL
            .into_iter()
            .find(|l| l.name() == text)
            .ok_or_else(|| {
                let known: Vec<_> = Language::ALL.iter().map(|l| l.name()).collect();
                format!(
                    "unknown language `{text}`; pick one of {}",
                    known.join(", ")
                )
            })
    }
}

/// Writes a new project for `language` into `dir`, whose last component is
/// the project's name. Refuses to write into a folder that is not empty.
pub fn scaffold(language: Language, dir: &Path) -> anyhow::Result<()> {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| {
            !n.is_empty()
                && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                && n.starts_with(|c: char| c.is_ascii_alphabetic())
        })
        .with_context(|| {
            format!(
                "`{}`: a project name starts with a letter and has only letters, digits, `-` and `_`",
                dir.display()
            )
        })?;
    if dir
        .read_dir()
        .is_ok_and(|mut entries| entries.next().is_some())
    {
        bail!("`{}` already exists and is not empty", dir.display());
    }
    let files = language.files();
    if files.is_empty() {
        bail!("this wharf binary was built without the {language} template");
    }
    for (relative, contents) in files {
        let path = dir.join(fill(relative, name));
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create `{}`", parent.display()))?;
        }
        let contents = match std::str::from_utf8(contents) {
            Ok(text) => fill(text, name).into_bytes(),
            Err(_) => contents.to_vec(),
        };
        std::fs::write(&path, contents)
            .with_context(|| format!("cannot write `{}`", path.display()))?;
        if relative.ends_with(".sh") || relative.ends_with("/build") {
            make_executable(&path)?;
        }
    }
    Ok(())
}

/// Replaces the template placeholders: `{{name}}` as given and
/// `{{name_snake}}` with `-` turned into `_` (for identifiers).
fn fill(text: &str, name: &str) -> String {
    text.replace("{{name}}", name)
        .replace("{{name_snake}}", &name.replace('-', "_"))
}

fn make_executable(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut permissions = std::fs::metadata(path)?.permissions();
    permissions.set_mode(0o755);
    std::fs::set_permissions(path, permissions)
        .with_context(|| format!("cannot make `{}` executable", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_language_has_a_template() {
        for language in Language::ALL {
            assert!(!language.files().is_empty(), "{language}");
        }
    }

    #[test]
    fn placeholders_are_filled() {
        assert_eq!(
            fill("name = \"{{name}}\" lib {{name_snake}}", "my-handler"),
            "name = \"my-handler\" lib my_handler"
        );
    }

    #[test]
    fn languages_parse_by_name() {
        assert_eq!("go".parse(), Ok(Language::Go));
        assert!(
            "cobol"
                .parse::<Language>()
                .expect_err("cobol is no language here")
                .contains("rust, js")
        );
    }
}
