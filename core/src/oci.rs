//! Modules kept in OCI registries: `oci://REGISTRY/REPOSITORY:TAG` or
//! `oci://REGISTRY/REPOSITORY@sha256:…`, checked as the distribution spec
//! reads them, so a reference the config accepts is one a registry can
//! answer.

use std::fmt;

use sha2::{Digest, Sha256};

/// The scheme a `module` names a registry artefact with.
pub const SCHEME: &str = "oci://";

/// A module in a registry: where it is and which version.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ModuleReference {
    /// `host[:port]`.
    pub registry: String,
    /// `path/of/repo`, lowercase.
    pub repository: String,
    /// What is pulled: a tag that may move, or a digest that may not.
    pub version: Version,
}

/// Which version of a repository a reference names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Version {
    /// A tag: resolved to a digest at each pull, so it may move.
    Tag(String),
    /// `sha256:` and 64 hex digits: the content itself.
    Digest(String),
}

impl ModuleReference {
    /// Parses `oci://REGISTRY/REPOSITORY(:TAG|@sha256:HEX)`; a reference
    /// without either names the tag `latest`.
    pub fn parse(text: &str) -> Result<ModuleReference, String> {
        let rest = text
            .strip_prefix(SCHEME)
            .ok_or_else(|| format!("`{text}` does not start with `{SCHEME}`"))?;
        let (registry, path) = rest.split_once('/').ok_or_else(|| {
            format!("`{text}` names no repository: `{SCHEME}REGISTRY/REPOSITORY:TAG`")
        })?;
        check_registry(registry).map_err(|why| format!("`{text}`: registry `{registry}` {why}"))?;
        let (repository, version) = if let Some((repository, digest)) = path.split_once('@') {
            check_digest(digest).map_err(|why| format!("`{text}`: digest {why}"))?;
            (repository, Version::Digest(digest.to_owned()))
        } else {
            // A colon after the last slash starts the tag.
            let last = path.rfind('/').map_or(0, |i| i + 1);
            match path[last..].split_once(':') {
                Some((name, tag)) => {
                    check_tag(tag).map_err(|why| format!("`{text}`: tag `{tag}` {why}"))?;
                    (&path[..last + name.len()], Version::Tag(tag.to_owned()))
                }
                None => (path, Version::Tag("latest".to_owned())),
            }
        };
        check_repository(repository)
            .map_err(|why| format!("`{text}`: repository `{repository}` {why}"))?;
        Ok(ModuleReference {
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            version,
        })
    }

    /// Whether the reference's content may change: a tag may move.
    pub fn is_tag(&self) -> bool {
        matches!(self.version, Version::Tag(_))
    }

    /// The reference without the scheme, as registries' clients write it.
    pub fn without_scheme(&self) -> String {
        let text = self.to_string();
        text[SCHEME.len()..].to_owned()
    }

    /// A file name for what this reference resolves to: the same for the
    /// same reference, safe whatever the reference holds.
    pub fn file_name(&self) -> String {
        let digest = Sha256::digest(self.to_string().as_bytes());
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        format!("{hex}.wasm")
    }
}

impl fmt::Display for ModuleReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.registry, self.repository)?;
        match &self.version {
            Version::Tag(tag) => write!(f, ":{tag}"),
            Version::Digest(digest) => write!(f, "@{digest}"),
        }
    }
}

/// `sha256:` and 64 lowercase hex digits: the one algorithm every registry
/// serves.
pub fn check_digest(digest: &str) -> Result<(), String> {
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| format!("`{digest}` is not `sha256:` and 64 hex digits"))?;
    if hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(format!(
            "`{digest}` is not `sha256:` and 64 lowercase hex digits"
        ))
    }
}

fn check_registry(registry: &str) -> Result<(), String> {
    let (host, port) = match registry.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || registry.starts_with('[') => {
            (host, Some(port))
        }
        _ => (registry, None),
    };
    if host.is_empty() || host.len() > 253 {
        return Err("is not a host name".to_owned());
    }
    let bracketed = host.starts_with('[') && host.ends_with(']');
    if !bracketed
        && !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    {
        return Err("is not a host name".to_owned());
    }
    if let Some(port) = port
        && port.parse::<u16>().is_err()
    {
        return Err(format!(
            "has a port `{port}` that is not a number up to 65535"
        ));
    }
    Ok(())
}

/// Path components of lowercase letters and digits, joined by `.`, `_`,
/// `__` or `-` runs (the distribution spec's grammar).
fn check_repository(repository: &str) -> Result<(), String> {
    if repository.is_empty() || repository.len() > 255 {
        return Err("must be 1 to 255 characters".to_owned());
    }
    for component in repository.split('/') {
        let alphanumeric = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let bytes = component.as_bytes();
        let ends_ok = bytes.first().is_some_and(|&b| alphanumeric(b))
            && bytes.last().is_some_and(|&b| alphanumeric(b));
        if !ends_ok
            || !bytes
                .iter()
                .all(|&b| alphanumeric(b) || b"._-".contains(&b))
        {
            return Err(format!(
                "has a path component `{component}` that is not lowercase letters and digits joined by `.`, `_` or `-`"
            ));
        }
    }
    Ok(())
}

fn check_tag(tag: &str) -> Result<(), String> {
    let bytes = tag.as_bytes();
    let first_ok = bytes
        .first()
        .is_some_and(|&b| b.is_ascii_alphanumeric() || b == b'_');
    if first_ok
        && bytes.len() <= 128
        && bytes
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    {
        Ok(())
    } else {
        Err(
            "is not 1 to 128 letters, digits, `_`, `.` or `-` (not starting with `.` or `-`)"
                .to_owned(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:6c3c624b58dbbcd3c0dd82b4c53f04194d1247c6eebdaab7c610cf7d66709b3b";

    #[test]
    fn references_parse_as_registries_read_them() {
        let r = ModuleReference::parse("oci://127.0.0.1:5000/team/orders:v1.2").expect("valid");
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "team/orders");
        assert_eq!(r.version, Version::Tag("v1.2".into()));
        assert_eq!(r.to_string(), "oci://127.0.0.1:5000/team/orders:v1.2");
        assert_eq!(r.without_scheme(), "127.0.0.1:5000/team/orders:v1.2");

        let r = ModuleReference::parse(&format!("oci://ghcr.io/a/b@{DIGEST}")).expect("valid");
        assert_eq!(r.version, Version::Digest(DIGEST.into()));
        assert!(!r.is_tag());

        let r = ModuleReference::parse("oci://registry.example/handler").expect("valid");
        assert_eq!(r.version, Version::Tag("latest".into()));
    }

    #[test]
    fn bad_references_are_refused_naming_the_part() {
        for (text, part) in [
            ("https://ghcr.io/a:b", "does not start"),
            ("oci://ghcr.io", "no repository"),
            ("oci://ghcr.io/Team/x:v1", "repository"),
            ("oci://ghcr.io/a//b:v1", "repository"),
            ("oci://ghcr.io/a:-v1", "tag"),
            ("oci://ghcr.io/a:v1/../x", "repository"),
            ("oci://ghcr.io/a@sha256:abc", "digest"),
            ("oci://ghcr.io/a@md5:6c3c", "digest"),
            ("oci://gh cr.io/a:v1", "registry"),
            ("oci://ghcr.io:99999/a:v1", "port"),
            ("oci://ghcr.io/a:v1\n", "tag"),
        ] {
            let error = ModuleReference::parse(text).expect_err(text);
            assert!(error.contains(part), "{text}: {error}");
        }
    }

    #[test]
    fn file_names_are_plain_and_differ_per_reference() {
        let a = ModuleReference::parse("oci://r/a:v1")
            .expect("valid")
            .file_name();
        let b = ModuleReference::parse("oci://r/a:v2")
            .expect("valid")
            .file_name();
        assert_ne!(a, b);
        assert!(a.ends_with(".wasm") && a.len() == 37);
    }
}
