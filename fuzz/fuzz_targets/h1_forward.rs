//! "One request in, one request out" on moat's HTTP/1.1 wire path: arbitrary client
//! bytes through moat's request head parser and body decoder, and the upstream request
//! moat writes (body in memory, and streamed in chunks) parsed by hyper's HTTP/1.1
//! server, a parser that is not moat's own. Whatever moat accepts must reach hyper as
//! exactly one request, with moat's method and target and exactly the body moat
//! decoded (the body its phases inspect), and nothing after it.
#![no_main]
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use tokio::io::AsyncWriteExt;

/// Every request hyper's server parses out of `wire`: (method, target, body), and
/// how the connection ended (`None`: cleanly).
fn hyper_parse(wire: &[u8]) -> (Vec<(String, String, Bytes)>, Option<String>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (mut client, server) = tokio::io::duplex(wire.len() + 64);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
            let log = log.clone();
            async move {
                let method = req.method().to_string();
                let target = req.uri().to_string();
                if let Ok(b) = req.into_body().collect().await {
                    log.lock().unwrap().push((method, target, b.to_bytes()));
                }
                Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new())))
            }
        });
        client.write_all(wire).await.expect("duplex write");
        client.shutdown().await.expect("duplex shutdown");
        let served = tokio::spawn(async move {
            // The whole request is written before the write side is closed: a
            // half-closed client must not abort the request in flight.
            // The oracle judges framing, not limits: its field count (hyper's default
            // is 100) is set above the 512 fields moat's parser reads plus the few
            // moat adds (x-forwarded-*, x-request-id), which a request near moat's
            // configured maximum (100 by default) already exceeds.
            hyper::server::conn::http1::Builder::new()
                .max_headers(1024)
                .half_close(true)
                .serve_connection(TokioIo::new(server), svc)
                .await
        });
        // Drain the responses so the server never blocks on a full pipe.
        let drain = tokio::spawn(async move {
            let mut sink = Vec::new();
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut client, &mut sink).await;
        });
        let failed = match served.await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("{e:?}")),
            Err(e) => Some(format!("server task: {e}")),
        };
        let _ = drain.await;
        let got = seen.lock().unwrap().clone();
        (got, failed)
    })
}

fuzz_target!(|data: &[u8]| {
    let Some(f) = moat_proxy::fuzzing::forward_request(data) else {
        return;
    };
    for (how, wire) in [("buffered", &f.buffered), ("streamed", &f.streamed)] {
        let (seen, failed) = hyper_parse(wire);
        assert!(
            failed.is_none(),
            "{how}: hyper could not parse moat's request ({failed:?}): {:?}",
            String::from_utf8_lossy(wire)
        );
        assert_eq!(
            seen.len(),
            1,
            "{how}: hyper saw {} requests in {:?}",
            seen.len(),
            String::from_utf8_lossy(wire)
        );
        let (method, target, body) = &seen[0];
        assert_eq!(method, &f.method, "{how}");
        assert_eq!(target, &f.target, "{how}");
        assert_eq!(body, &f.body, "{how}: body differs");
    }
});
