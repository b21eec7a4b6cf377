//! An Artemis with TLS acceptors whose certificates the test makes: a CA,
//! a server certificate for `127.0.0.1` and `localhost`, an expired one,
//! a client certificate (`CN=wharf-client`) and a CA nobody uses.
//!
//! The broker instance is `scripts/artemis` with `WHARF_ARTEMIS_INSTANCE=tls`
//! on port 5690 (AMQP, plain), 5691 (TLS, PLAIN), 5692 (mutual TLS,
//! EXTERNAL), 5693 (an expired certificate) and 5694 (SCRAM); it is
//! restarted with fresh certificates once per test process.

use std::path::PathBuf;
use std::sync::OnceLock;

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, date_time_ymd,
};

use crate::artemis_users::{self, cache};
use crate::repo_root;

/// The plain AMQP port of the TLS broker.
pub const PLAIN_PORT: u16 = 5690;
/// TLS with SASL PLAIN.
pub const TLS_PORT: u16 = PLAIN_PORT + 1;
/// Mutual TLS with SASL EXTERNAL.
pub const MUTUAL_TLS_PORT: u16 = PLAIN_PORT + 2;
/// TLS with an expired server certificate.
pub const EXPIRED_PORT: u16 = PLAIN_PORT + 3;
/// No TLS; SASL SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN.
pub const SCRAM_PORT: u16 = PLAIN_PORT + 4;

/// Adds a user who logs in with SCRAM (both hashes) and has the role
/// `amq`; the broker re-reads its user files on the next login.
pub fn add_scram_user(user: &str, password: &str) -> anyhow::Result<()> {
    running()?;
    // Artemis's own tool salts and hashes the password as its login module
    // expects.
    let output = std::process::Command::new("java")
        .arg("-cp")
        .arg(cache().join("artemis/apache-artemis-2.40.0/lib/*"))
        .arg("org.apache.activemq.artemis.spi.core.security.jaas.SCRAMPropertiesLoginModule")
        .args([user, password])
        .output()
        .context("java")?;
    anyhow::ensure!(
        output.status.success(),
        "SCRAMPropertiesLoginModule: {output:?}"
    );
    let lines: String = String::from_utf8(output.stdout)?
        .lines()
        .filter(|line| line.contains("|SHA"))
        .map(|line| format!("{line}\n"))
        .collect();
    anyhow::ensure!(!lines.is_empty(), "no SCRAM credentials printed");
    artemis_users::add(&artemis_users::etc("tls"), user, &lines)
}

/// Where the certificates of the running TLS broker are.
pub struct TlsFiles {
    /// The folder holding them all.
    pub dir: PathBuf,
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// A CA that signed nothing the broker uses.
    pub other_ca: PathBuf,
    /// The client certificate (`CN=wharf-client`) and its key.
    pub client_cert: PathBuf,
    /// The client certificate's key.
    pub client_key: PathBuf,
}

/// The TLS broker, started with fresh certificates on first use.
pub fn running() -> anyhow::Result<&'static TlsFiles> {
    static BROKER: OnceLock<Result<TlsFiles, String>> = OnceLock::new();
    BROKER
        .get_or_init(|| start().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow::anyhow!("the TLS broker did not start: {e}"))
}

fn start() -> anyhow::Result<TlsFiles> {
    let dir = cache().join("artemis/tls-certs");
    std::fs::create_dir_all(&dir)?;
    let files = write_certificates(&dir)?;
    let status = std::process::Command::new(repo_root().join("scripts/artemis"))
        .arg("restart")
        .env("WHARF_ARTEMIS_INSTANCE", "tls")
        .env("WHARF_ARTEMIS_PORT", PLAIN_PORT.to_string())
        .env("WHARF_ARTEMIS_TLS_DIR", &dir)
        .status()
        .context("scripts/artemis")?;
    anyhow::ensure!(status.success(), "scripts/artemis restart: {status}");
    Ok(files)
}

fn ca(name: &str) -> anyhow::Result<(String, Issuer<'static, KeyPair>)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), Issuer::new(params, key)))
}

/// A certificate signed by `issuer`; its key first, then itself (the PEM
/// keystore Artemis reads), and the certificate alone.
fn leaf(
    issuer: &Issuer<'_, KeyPair>,
    names: &[&str],
    common_name: &str,
    purpose: ExtendedKeyUsagePurpose,
    expired: bool,
) -> anyhow::Result<(String, String)> {
    let key = KeyPair::generate()?;
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![purpose];
    if expired {
        params.not_before = date_time_ymd(2020, 1, 1);
        params.not_after = date_time_ymd(2021, 1, 1);
    }
    let cert = params.signed_by(&key, issuer)?;
    Ok((key.serialize_pem(), cert.pem()))
}

/// A fresh CA (PEM) and a server certificate it signed for `127.0.0.1`
/// and `localhost` (DER), with the certificate's key (PKCS#8 DER).
pub fn server_certificate() -> anyhow::Result<(String, Vec<u8>, Vec<u8>)> {
    let (ca_pem, issuer) = ca("wharf test CA")?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer)?;
    Ok((ca_pem, cert.der().to_vec(), key.serialize_der()))
}

fn write_certificates(dir: &std::path::Path) -> anyhow::Result<TlsFiles> {
    let (ca_pem, issuer) = ca("wharf test CA")?;
    let (other_pem, _) = ca("wharf test CA nobody uses")?;
    let server_names = ["127.0.0.1", "localhost"];
    let (server_key, server_cert) = leaf(
        &issuer,
        &server_names,
        "localhost",
        ExtendedKeyUsagePurpose::ServerAuth,
        false,
    )?;
    let (expired_key, expired_cert) = leaf(
        &issuer,
        &server_names,
        "localhost",
        ExtendedKeyUsagePurpose::ServerAuth,
        true,
    )?;
    let (client_key, client_cert) = leaf(
        &issuer,
        &[],
        "wharf-client",
        ExtendedKeyUsagePurpose::ClientAuth,
        false,
    )?;
    let write = |name: &str, text: String| -> anyhow::Result<PathBuf> {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| path.display().to_string())?;
        Ok(path)
    };
    write("server-keystore.pem", format!("{server_key}{server_cert}"))?;
    write(
        "expired-keystore.pem",
        format!("{expired_key}{expired_cert}"),
    )?;
    write("truststore.pem", ca_pem.clone())?;
    Ok(TlsFiles {
        dir: dir.to_owned(),
        ca: write("ca.pem", ca_pem)?,
        other_ca: write("other-ca.pem", other_pem)?,
        client_cert: write("client.pem", client_cert)?,
        client_key: write("client.key", client_key)?,
    })
}
