//! The gateway's JWKS client (`moat_proxy::jwks_fetch`) against real local servers:
//! plain HTTP, HTTPS with a test CA (and refused without it), a non-200 status, the
//! document size limit, the timeout, a call from inside a tokio runtime, and an
//! authorization engine loading an `https://` JWKS through it.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use moat_authz::{AuthzConfig, AuthzEngine, JwksFetcher, MAX_DOCUMENT_BYTES};
use moat_proxy::jwks_fetch::HttpJwksFetcher;
use moat_tls::testing::TestCa;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// RFC 8037's Ed25519 example public key.
const JWKS: &str = r#"{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"k1","use":"sig","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#;

/// What the server answers: a status and a body, or nothing at all (hangs).
#[derive(Clone)]
enum Reply {
    Answer(u16, String),
    Hang,
}

/// A server on 127.0.0.1 (TLS when `tls` is given) answering every request with `reply`.
struct Server {
    addr: SocketAddr,
    _rt: std::thread::JoinHandle<()>,
}

fn start(reply: Reply, tls: Option<&TestCa>) -> Server {
    let acceptor = tls.map(|ca| {
        let cert = ca.server_cert(&["127.0.0.1"]);
        let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert_der.clone()], cert.key_der())
        .unwrap();
        tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
    });
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let addr = std_listener.local_addr().unwrap();
    let rt = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    continue;
                };
                let (reply, acceptor) = (reply.clone(), acceptor.clone());
                tokio::spawn(async move {
                    match acceptor {
                        Some(a) => {
                            if let Ok(s) = a.accept(sock).await {
                                answer(s, reply).await;
                            }
                        }
                        None => answer(sock, reply).await,
                    }
                });
            }
        });
    });
    Server { addr, _rt: rt }
}

async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, reply: Reply) {
    let mut head = Vec::new();
    let mut b = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&b[..n]),
        }
    }
    match reply {
        Reply::Hang => tokio::time::sleep(Duration::from_secs(60)).await,
        Reply::Answer(status, body) => {
            let msg = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(msg.as_bytes()).await;
            let _ = s.shutdown().await;
        }
    }
}

const T: Duration = Duration::from_secs(5);

#[test]
fn plain_http() {
    let s = start(Reply::Answer(200, JWKS.into()), None);
    let body = HttpJwksFetcher::new()
        .fetch(&format!("http://{}/jwks", s.addr), T)
        .unwrap();
    assert_eq!(body, JWKS);
}

#[test]
fn https_verified_against_the_given_roots_only() {
    let ca = TestCa::new("jwks test CA");
    let s = start(Reply::Answer(200, JWKS.into()), Some(&ca));
    let url = format!("https://{}/jwks", s.addr);
    let body = HttpJwksFetcher::with_roots(ca.root_store())
        .fetch(&url, T)
        .unwrap();
    assert_eq!(body, JWKS);
    let e = HttpJwksFetcher::new().fetch(&url, T).unwrap_err();
    assert!(
        e.contains("TLS"),
        "webpki roots do not trust the test CA: {e}"
    );
}

#[test]
fn non_200_is_an_error() {
    let s = start(Reply::Answer(503, "down".into()), None);
    let e = HttpJwksFetcher::new()
        .fetch(&format!("http://{}/jwks", s.addr), T)
        .unwrap_err();
    assert!(e.contains("status 503"), "{e}");
}

#[test]
fn document_size_limit() {
    let at_limit = "x".repeat(MAX_DOCUMENT_BYTES);
    let s = start(Reply::Answer(200, at_limit.clone()), None);
    let body = HttpJwksFetcher::new()
        .fetch(&format!("http://{}/jwks", s.addr), T)
        .unwrap();
    assert_eq!(body.len(), MAX_DOCUMENT_BYTES);
    let s = start(Reply::Answer(200, at_limit + "x"), None);
    let e = HttpJwksFetcher::new()
        .fetch(&format!("http://{}/jwks", s.addr), T)
        .unwrap_err();
    assert!(e.contains("body"), "{e}");
}

#[test]
fn timeout_bounds_the_fetch() {
    let s = start(Reply::Hang, None);
    let t0 = Instant::now();
    let e = HttpJwksFetcher::new()
        .fetch(
            &format!("http://{}/jwks", s.addr),
            Duration::from_millis(300),
        )
        .unwrap_err();
    assert!(e.contains("timed out"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[test]
fn unsupported_scheme_is_refused() {
    let e = HttpJwksFetcher::new()
        .fetch("ftp://127.0.0.1/jwks", T)
        .unwrap_err();
    assert!(e.contains("unsupported URL scheme"), "{e}");
}

#[test]
fn works_from_inside_a_tokio_runtime() {
    let s = start(Reply::Answer(200, JWKS.into()), None);
    let url = format!("http://{}/jwks", s.addr);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let body = rt.block_on(async { HttpJwksFetcher::new().fetch(&url, T) });
    assert_eq!(body.unwrap(), JWKS);
}

#[test]
fn engine_loads_an_https_jwks_through_it() {
    let ca = TestCa::new("jwks test CA");
    let s = start(Reply::Answer(200, JWKS.into()), Some(&ca));
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ra.yaml");
    std::fs::write(
        &p,
        format!(
            "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: jwt, namespace: foo}}\nspec:\n  jwtRules:\n  - issuer: \"https://issuer.example.com\"\n    jwksUri: \"https://{}/jwks\"\n",
            s.addr
        ),
    )
    .unwrap();
    let cfg = AuthzConfig {
        enabled: true,
        policies: vec![p],
        ..Default::default()
    };
    let e = AuthzEngine::build_with(
        &cfg,
        dir.path(),
        Arc::new(HttpJwksFetcher::with_roots(ca.root_store())),
        false,
    )
    .unwrap();
    assert_eq!(e.jwks_kids(), vec![vec!["k1".to_string()]]);
}
