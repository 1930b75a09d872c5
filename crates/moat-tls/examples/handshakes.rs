//! In-memory TLS 1.3 handshake throughput, audit off vs on.
//!
//! ```text
//! cargo run --release -p moat-tls --example handshakes -- [HANDSHAKES] [ROUNDS]
//! ```
//!
//! Full (non-resumed) TLS 1.3 handshakes between a rustls client and the
//! server configuration built by `TlsAcceptor`, bytes exchanged through
//! memory buffers on one thread. "on" additionally builds the
//! `HandshakeRecord`, serializes it to JSON and sends it through a bounded
//! crossbeam channel, which this thread drains (the consumer's cost is counted too).
//! Variants alternate in rounds so that machine noise hits each one alike.
//!
//! Besides wall time, the thread's on-CPU time and run-queue wait are read from
//! `/proc/thread-self/schedstat` (Linux): on a shared machine the CPU-time rate
//! is the better estimate of one core's throughput.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use moat_tls::rustls::pki_types::ServerName;
use moat_tls::rustls::{self, ClientConnection, ServerConnection};
use moat_tls::testing::{client_config, handshake_in_memory, TestPki};
use moat_tls::{handshake_record, ClientAuthMode, Role, TlsAcceptor};

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Plain,
    Off,
    On,
}

/// (on-CPU ns, run-queue wait ns) of this thread, from the scheduler's accounting.
fn schedstat() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let mut it = text
        .split_whitespace()
        .map(|v| v.parse::<u64>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

#[derive(Clone, Copy, Default)]
struct Cost {
    wall: Duration,
    cpu_ns: u64,
    wait_ns: u64,
}

fn run(
    mode: Mode,
    n: usize,
    plain: &Arc<rustls::ServerConfig>,
    server: &Arc<rustls::ServerConfig>,
    client: &Arc<rustls::ClientConfig>,
    tx: &crossbeam_channel::Sender<Vec<u8>>,
    rx: &crossbeam_channel::Receiver<Vec<u8>>,
) -> Cost {
    let name = ServerName::try_from("localhost").expect("valid name");
    let mut buf = Vec::with_capacity(8192);
    let (cpu0, wait0) = schedstat();
    let started = Instant::now();
    for _ in 0..n {
        let hs_start = Instant::now();
        let cfg = if mode == Mode::Plain { plain } else { server };
        let mut s = ServerConnection::new(cfg.clone()).expect("server connection");
        let mut c = ClientConnection::new(client.clone(), name.clone()).expect("client connection");
        let sig = handshake_in_memory(&mut c, &mut s, &mut buf).expect("handshake");
        if mode == Mode::On {
            let record = handshake_record(
                &s,
                Role::Server,
                s.server_name(),
                sig,
                hs_start.elapsed(),
                None,
            );
            let json = serde_json::to_vec(&record).expect("serialize");
            // Lossy like the proxy's audit queue: drop when full.
            let _ = tx.try_send(json);
            while let Ok(line) = rx.try_recv() {
                std::hint::black_box(line);
            }
        }
        std::hint::black_box((&s, &c));
    }
    let wall = started.elapsed();
    let (cpu1, wait1) = schedstat();
    Cost {
        wall,
        cpu_ns: cpu1.saturating_sub(cpu0),
        wait_ns: wait1.saturating_sub(wait0),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let rounds: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(10)
        .max(1);
    let dir = tempfile::tempdir().expect("temp dir");
    let pki = TestPki::generate(dir.path()).expect("pki");
    let acceptor = TlsAcceptor::new(&pki.server_tls_config(ClientAuthMode::Disable), &pki.dir)
        .expect("acceptor");
    let server = acceptor.server_config().clone();
    // Plain rustls with the same certificate, without moat's signature recording.
    let plain = Arc::new(
        rustls::ServerConfig::builder_with_provider(moat_tls::crypto_provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(vec![pki.server.cert_der.clone()], pki.server.key_der())
            .expect("cert"),
    );
    let mut cc = (*client_config(&pki.ca, None, &["h2"], &[&rustls::version::TLS13])).clone();
    cc.resumption = rustls::client::Resumption::disabled();
    let client = Arc::new(cc);
    let (tx, rx) = crossbeam_channel::bounded(1024);

    // Warm-up.
    for mode in [Mode::Plain, Mode::Off, Mode::On] {
        run(mode, 200, &plain, &server, &client, &tx, &rx);
    }
    let per_round = n.div_ceil(rounds);
    let mut totals = [Cost::default(); 3];
    for round in 0..rounds {
        // Rotate the order each round.
        let order = [[0, 1, 2], [1, 2, 0], [2, 0, 1]][round % 3];
        for i in order {
            let mode = [Mode::Plain, Mode::Off, Mode::On][i];
            let c = run(mode, per_round, &plain, &server, &client, &tx, &rx);
            totals[i].wall += c.wall;
            totals[i].cpu_ns += c.cpu_ns;
            totals[i].wait_ns += c.wait_ns;
        }
    }
    let total = per_round * rounds;
    println!("TLS 1.3 full handshakes in memory, {total} per variant, {rounds} rounds");
    println!("variant      wall hs/s   cpu hs/s   cpu us/hs   run-queue wait");
    let mut wall_rates = [0.0; 3];
    let mut cpu_rates = [0.0; 3];
    for (i, label) in ["plain rustls", "audit off   ", "audit on    "]
        .iter()
        .enumerate()
    {
        let t = totals[i];
        wall_rates[i] = total as f64 / t.wall.as_secs_f64();
        cpu_rates[i] = if t.cpu_ns > 0 {
            total as f64 / (t.cpu_ns as f64 / 1e9)
        } else {
            f64::NAN
        };
        println!(
            "{label} {:10.1} {:10.1} {:11.1} {:12.1}%",
            wall_rates[i],
            cpu_rates[i],
            t.cpu_ns as f64 / 1e3 / total as f64,
            t.wait_ns as f64 / t.wall.as_nanos().max(1) as f64 * 100.0
        );
    }
    let pct = |a: f64, b: f64| (a / b - 1.0) * 100.0;
    println!(
        "on vs off   : wall {:+.2}%, cpu {:+.2}% (handshakes/s)",
        pct(wall_rates[2], wall_rates[1]),
        pct(cpu_rates[2], cpu_rates[1])
    );
    println!(
        "off vs plain: wall {:+.2}%, cpu {:+.2}% (handshakes/s)",
        pct(wall_rates[1], wall_rates[0]),
        pct(cpu_rates[1], cpu_rates[0])
    );
}
