//! The two ends of `scripts/tcp-perf`: an echo upstream and a load generator, each on a
//! single-threaded tokio runtime (to be pinned to one CPU).
//!
//! ```text
//! tcp_load echo ADDR                          echo every byte back; half-close on EOF
//! tcp_load load ADDR CONNS BYTES ROUNDS       per round: CONNS new connections at once,
//!                                             each sends BYTES, half-closes and reads the
//!                                             BYTES echoed; prints one line per round
//! ```
//!
//! A round's figure is `CONNS * BYTES` (the payload of one direction) divided by the
//! time from the first connect to the last byte read back; the proxy in between moves
//! twice that. The last line is the median over the rounds.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["echo", addr] => rt.block_on(echo(addr)),
        ["load", addr, conns, bytes, rounds] => rt.block_on(load(addr, conns, bytes, rounds)),
        _ => Err("usage: tcp_load echo ADDR | tcp_load load ADDR CONNS BYTES ROUNDS".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tcp_load: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn echo(addr: &str) -> Result<(), String> {
    let l = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    loop {
        let Ok((s, _)) = l.accept().await else {
            continue;
        };
        let _ = s.set_nodelay(true);
        tokio::spawn(async move {
            let (mut r, mut w) = s.into_split();
            let _ = tokio::io::copy(&mut r, &mut w).await;
            let _ = w.shutdown().await;
        });
    }
}

async fn load(addr: &str, conns: &str, bytes: &str, rounds: &str) -> Result<(), String> {
    let addr: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let conns: usize = conns.parse().map_err(|e| format!("CONNS: {e}"))?;
    let bytes: usize = bytes.parse().map_err(|e| format!("BYTES: {e}"))?;
    let rounds: usize = rounds.parse().map_err(|e| format!("ROUNDS: {e}"))?;
    let payload = std::sync::Arc::new(vec![0x5au8; bytes]);
    let mut rates = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let start = Instant::now();
        let tasks: Vec<_> = (0..conns)
            .map(|_| tokio::spawn(one(addr, payload.clone())))
            .collect();
        for t in tasks {
            t.await.map_err(|e| e.to_string())??;
        }
        let secs = start.elapsed().as_secs_f64();
        let mib_s = (conns * bytes) as f64 / (1 << 20) as f64 / secs;
        println!("round {round}: {:.1} ms, {mib_s:.1} MiB/s", secs * 1e3);
        rates.push(mib_s);
    }
    rates.sort_by(f64::total_cmp);
    match rates.get(rates.len() / 2) {
        Some(m) => println!("median {m:.1} MiB/s"),
        None => println!("median n/a"),
    }
    Ok(())
}

/// One connection: send the payload while reading the echo, half-close, read to EOF.
async fn one(addr: SocketAddr, payload: std::sync::Arc<Vec<u8>>) -> Result<(), String> {
    let s = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let _ = s.set_nodelay(true);
    let (mut r, mut w) = s.into_split();
    let writer = async {
        w.write_all(&payload).await?;
        w.shutdown().await
    };
    let reader = async {
        let mut buf = vec![0u8; 64 << 10];
        let mut total = 0usize;
        loop {
            match r.read(&mut buf).await? {
                0 => return Ok::<usize, std::io::Error>(total),
                n => total += n,
            }
        }
    };
    let (w, n) = tokio::join!(writer, reader);
    w.map_err(|e| format!("write: {e}"))?;
    let n = n.map_err(|e| format!("read: {e}"))?;
    if n != payload.len() {
        return Err(format!("{n} bytes echoed instead of {}", payload.len()));
    }
    Ok(())
}
