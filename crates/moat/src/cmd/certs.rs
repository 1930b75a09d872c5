//! `moat certs`: a private CA, a server and a client certificate (and optionally
//! a JWT signing key with a token) for trying TLS, mTLS and JWT configs locally.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// Arguments of `moat certs`.
#[derive(clap::Args)]
pub struct CertsArgs {
    /// Directory to write into (created if missing).
    #[arg(long, default_value = "certs")]
    pub out: PathBuf,
    /// DNS names and IP addresses of the server certificate (repeatable).
    #[arg(long = "host", default_values_t = ["localhost".to_string(), "127.0.0.1".to_string()])]
    pub hosts: Vec<String>,
    /// URI SAN of the client certificate (a SPIFFE identity, as Istio's mTLS peers carry).
    #[arg(long, default_value = "spiffe://cluster.local/ns/default/sa/client")]
    pub client_uri: String,
    /// Also write an ES256 signing key's JWKS (`jwks.json`) and a token from this
    /// issuer valid for one year (`token.jwt`), for RequestAuthentication.
    #[arg(long, value_name = "ISSUER")]
    pub jwt_issuer: Option<String>,
    /// Overwrite existing files.
    #[arg(long)]
    pub force: bool,
}

/// Files written, with whether each is private.
type Outputs = Vec<(&'static str, String, bool)>;

/// Runs `moat certs`: exit 0 when every file was written, 1 otherwise.
pub fn run(args: CertsArgs) -> ExitCode {
    match generate(&args).and_then(|files| write(&args.out, files, args.force)) {
        Ok(written) => {
            for p in written {
                outln!("{}", p.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("moat certs: {e}");
            ExitCode::from(1)
        }
    }
}

fn generate(args: &CertsArgs) -> anyhow::Result<Outputs> {
    let mut out: Outputs = Vec::new();
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name = rcgen::DistinguishedName::new();
    ca.distinguished_name
        .push(DnType::CommonName, "moat local CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key)?;
    out.push(("ca.crt", ca_cert.pem(), false));
    out.push(("ca.key", ca_key.serialize_pem(), true));
    let issuer = Issuer::new(ca, ca_key);

    let mut server = CertificateParams::new(args.hosts.clone())?;
    server.distinguished_name = rcgen::DistinguishedName::new();
    server.distinguished_name.push(
        DnType::CommonName,
        args.hosts
            .first()
            .map(String::as_str)
            .unwrap_or("localhost"),
    );
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    server.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let server_key = KeyPair::generate()?;
    let server_cert = server.signed_by(&server_key, &issuer)?;
    out.push(("server.crt", server_cert.pem(), false));
    out.push(("server.key", server_key.serialize_pem(), true));

    let mut client = CertificateParams::new(Vec::<String>::new())?;
    client.distinguished_name = rcgen::DistinguishedName::new();
    client.distinguished_name.push(DnType::CommonName, "client");
    client.subject_alt_names = vec![SanType::URI(args.client_uri.as_str().try_into()?)];
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    client.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let client_key = KeyPair::generate()?;
    let client_cert = client.signed_by(&client_key, &issuer)?;
    out.push(("client.crt", client_cert.pem(), false));
    out.push(("client.key", client_key.serialize_pem(), true));

    if let Some(iss) = &args.jwt_issuer {
        let jwt = moat_bench::generate::jwt(iss)?;
        out.push(("jwks.json", jwt.jwks + "\n", false));
        out.push(("token.jwt", jwt.token + "\n", true));
    }
    Ok(out)
}

fn write(dir: &Path, files: Outputs, force: bool) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    if !force {
        if let Some((name, _, _)) = files.iter().find(|(n, _, _)| dir.join(n).exists()) {
            anyhow::bail!("{} exists (--force overwrites)", dir.join(name).display());
        }
    }
    let mut written = Vec::new();
    for (name, content, private) in files {
        let path = dir.join(name);
        write_file(&path, content.as_bytes(), private)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// Writes a file; private keys and tokens are readable by their owner only.
fn write_file(path: &Path, content: &[u8], private: bool) -> std::io::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(if private { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut f = opts.open(path)?;
    f.write_all(content)
}
