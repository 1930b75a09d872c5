//! Criterion: one full in-memory TLS 1.3 handshake, audit off vs on.
//!
//! `cargo bench -p moat-tls --bench handshake`
//!
//! "on" = build the `HandshakeRecord`, serialize it to JSON and send it through
//! a bounded crossbeam channel (drained on the same thread), as the proxy does.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};
use moat_tls::rustls::pki_types::ServerName;
use moat_tls::rustls::{self, ClientConnection, ServerConnection};
use moat_tls::testing::{client_config, handshake_in_memory, TestPki};
use moat_tls::{handshake_record, ClientAuthMode, Role, TlsAcceptor};

fn handshakes(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let pki = TestPki::generate(dir.path()).expect("pki");
    let acceptor = TlsAcceptor::new(&pki.server_tls_config(ClientAuthMode::Disable), &pki.dir)
        .expect("acceptor");
    let server = acceptor.server_config().clone();
    let mut cc = (*client_config(&pki.ca, None, &["h2"], &[&rustls::version::TLS13])).clone();
    cc.resumption = rustls::client::Resumption::disabled();
    let client = Arc::new(cc);
    let name = ServerName::try_from("localhost").expect("valid name");
    let (tx, rx) = crossbeam_channel::bounded::<Vec<u8>>(1024);
    let mut buf = Vec::with_capacity(8192);

    let mut group = c.benchmark_group("tls13_handshake");
    group.bench_function("audit_off", |b| {
        b.iter(|| {
            let mut s = ServerConnection::new(server.clone()).expect("server");
            let mut cl = ClientConnection::new(client.clone(), name.clone()).expect("client");
            handshake_in_memory(&mut cl, &mut s, &mut buf).expect("handshake");
            (s, cl)
        })
    });
    group.bench_function("audit_on", |b| {
        b.iter(|| {
            let started = Instant::now();
            let mut s = ServerConnection::new(server.clone()).expect("server");
            let mut cl = ClientConnection::new(client.clone(), name.clone()).expect("client");
            let sig = handshake_in_memory(&mut cl, &mut s, &mut buf).expect("handshake");
            let record = handshake_record(
                &s,
                Role::Server,
                s.server_name(),
                sig,
                started.elapsed(),
                None,
            );
            let _ = tx.try_send(serde_json::to_vec(&record).expect("json"));
            while let Ok(line) = rx.try_recv() {
                std::hint::black_box(line);
            }
            (s, cl)
        })
    });
    group.finish();

    // The audit work alone, on one completed connection: record + JSON + channel.
    let mut s = ServerConnection::new(server.clone()).expect("server");
    let mut cl = ClientConnection::new(client.clone(), name.clone()).expect("client");
    let sig = handshake_in_memory(&mut cl, &mut s, &mut buf).expect("handshake");
    c.bench_function("tls13_audit_record_only", |b| {
        b.iter(|| {
            let record = handshake_record(
                &s,
                Role::Server,
                s.server_name(),
                sig,
                std::time::Duration::from_micros(200),
                None,
            );
            let _ = tx.try_send(serde_json::to_vec(&record).expect("json"));
            while let Ok(line) = rx.try_recv() {
                std::hint::black_box(line);
            }
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = handshakes
}
criterion_main!(benches);
