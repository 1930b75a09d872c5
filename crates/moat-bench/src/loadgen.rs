//! The load generator: closed loop (N connections as fast as possible, like wrk)
//! and open loop (a fixed rate spread over N connections, latency measured from
//! the intended send time, like wrk2 and Fortio), over HTTP/1.1 keep-alive or h2,
//! plain or TLS.
//!
//! One generator runs on one thread with a current-thread tokio runtime, pinned
//! to a CPU. HTTP/1.1 requests are serialized once; responses are parsed by
//! [`crate::http1::ResponseReader`], which only finds the status and the end of
//! the body. This is what makes it fast enough not to be the bottleneck.
//!
//! ## Coordinated omission
//!
//! In open-loop mode connection `c` of `N` sends its `i`-th request at the
//! intended time `start + c/rate + i·N/rate`. When the server is slow, the next
//! intended time passes while the connection still waits; the request is then
//! sent late and its latency is counted from the intended time, so a stall shows
//! up in every request that should have been sent during it. When the connection
//! was idle at the intended time, latency is counted from the actual send: the
//! only delay there is the generator's own timer (tokio timers have 1 ms
//! granularity) and charging it to the server would inflate every sample.

use std::cell::{Cell, RefCell};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use moat_tls::MaybeTls;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::http1::ResponseReader;
use crate::stats::{self, LatencySummary};

/// Wire protocol of a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// HTTP/1.1 with keep-alive.
    #[default]
    Http1,
    /// HTTP/2 (prior knowledge over plain TCP, ALPN `h2` over TLS).
    H2,
}

/// Where load is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Socket address.
    pub addr: SocketAddr,
    /// `Host` header (and TLS server name).
    pub host: String,
    /// Use TLS (certificates are not verified: this measures, it does not authenticate).
    pub tls: bool,
    /// Path prefix prepended to every request path (from a `--target` URL).
    pub base_path: String,
}

impl Target {
    /// Parses `http://127.0.0.1:8080[/base]` or `https://...`. Only IP literals and
    /// `localhost` are accepted: a benchmark sends load to this machine only.
    pub fn parse(url: &str) -> Result<Target, String> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else {
            return Err(format!(
                "`{url}`: expected http://HOST:PORT or https://HOST:PORT"
            ));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let authority_ip = authority.replacen("localhost", "127.0.0.1", 1);
        let addr: SocketAddr = authority_ip.parse().map_err(|_| {
            format!("`{url}`: expected an IP address and port, e.g. 127.0.0.1:8080")
        })?;
        Ok(Target {
            addr,
            host: authority.to_string(),
            tls,
            base_path: path.trim_end_matches('/').to_string(),
        })
    }
}

/// One request to send (a template: the same bytes every time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestTemplate {
    /// Method, e.g. `GET`.
    pub method: String,
    /// Path and query, e.g. `/api/items?id=1`.
    pub path: String,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// Body (empty for none).
    pub body: Bytes,
}

impl RequestTemplate {
    /// A `GET path` with no body.
    pub fn get(path: &str) -> Self {
        RequestTemplate {
            method: "GET".into(),
            path: path.into(),
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    /// Serializes for HTTP/1.1.
    pub fn to_http1(&self, target: &Target, close: bool) -> Bytes {
        let mut out = Vec::with_capacity(256 + self.body.len());
        out.extend_from_slice(self.method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(target.base_path.as_bytes());
        out.extend_from_slice(self.path.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        out.extend_from_slice(target.host.as_bytes());
        out.extend_from_slice(b"\r\n");
        for (k, v) in &self.headers {
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(v.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if !self.body.is_empty() || !matches!(self.method.as_str(), "GET" | "HEAD" | "DELETE") {
            out.extend_from_slice(format!("Content-Length: {}\r\n", self.body.len()).as_bytes());
        }
        if close {
            out.extend_from_slice(b"Connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
        Bytes::from(out)
    }

    fn to_http2(&self, target: &Target) -> Result<http::Request<Full<Bytes>>, String> {
        let scheme = if target.tls { "https" } else { "http" };
        let uri = format!(
            "{scheme}://{}{}{}",
            target.host, target.base_path, self.path
        );
        let mut b = http::Request::builder()
            .method(self.method.as_str())
            .uri(uri)
            .version(http::Version::HTTP_2);
        for (k, v) in &self.headers {
            b = b.header(k.as_str(), v.as_str());
        }
        b.body(Full::new(self.body.clone()))
            .map_err(|e| format!("invalid request template: {e}"))
    }
}

/// Closed or open loop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// Every connection sends its next request as soon as the previous response arrived.
    Closed,
    /// A fixed total rate in requests per second.
    Open {
        /// Requests per second over all connections.
        rate: f64,
    },
}

/// Called on the generator thread when the measured window starts (warm-up over).
///
/// It must not block: the generator thread is the one sending requests, and a
/// blocked generator would charge its own delay to the server in an open loop.
/// Hand the work to another thread (the scenario runner sends on a channel).
#[derive(Clone)]
pub struct MeasureHook(pub Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for MeasureHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MeasureHook")
    }
}

/// A load to generate.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// Where to send it.
    pub target: Target,
    /// Protocol.
    pub protocol: Protocol,
    /// Requests, sent round-robin on each connection.
    pub requests: Vec<RequestTemplate>,
    /// Connections.
    pub connections: usize,
    /// Concurrent streams per h2 connection (1 for HTTP/1.1).
    pub streams: usize,
    /// Closed or open loop.
    pub mode: Mode,
    /// Load sent before measuring (same connections, same rate); not recorded.
    pub warmup: Duration,
    /// Measured duration (the upper bound when `max_requests` is set).
    pub duration: Duration,
    /// Stop after this many measured requests.
    pub max_requests: Option<u64>,
    /// Open a new connection (and TLS handshake) for every request.
    pub new_connection_per_request: bool,
    /// The client certificate presented when a TLS target asks for one (mTLS).
    pub client_identity: Option<Arc<crate::tls::ClientIdentity>>,
    /// How long in-flight requests may finish after the end before they count as timeouts.
    pub grace: Duration,
    /// Called when the measured window starts.
    pub on_measure_start: Option<MeasureHook>,
}

impl LoadSpec {
    /// A closed-loop HTTP/1.1 spec with defaults (1 s warm-up, 5 s).
    pub fn closed(target: Target, requests: Vec<RequestTemplate>, connections: usize) -> Self {
        LoadSpec {
            target,
            protocol: Protocol::Http1,
            requests,
            connections,
            streams: 1,
            mode: Mode::Closed,
            warmup: Duration::from_secs(1),
            duration: Duration::from_secs(5),
            max_requests: None,
            new_connection_per_request: false,
            client_identity: None,
            grace: Duration::from_secs(2),
            on_measure_start: None,
        }
    }
}

/// Errors by kind.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorCounts {
    /// Connect, read or write failures and malformed responses.
    pub io: u64,
    /// Requests still in flight when the run ended plus grace.
    pub timeouts: u64,
    /// 4xx responses.
    pub status_4xx: u64,
    /// 5xx responses.
    pub status_5xx: u64,
    /// gRPC answers (a `grpc-status` in the response head or trailers) other than
    /// `0` (OK): an HTTP 200 that failed as a call.
    #[serde(default)]
    pub grpc: u64,
}

impl ErrorCounts {
    /// All errors.
    pub fn total(&self) -> u64 {
        self.io + self.timeouts + self.status_4xx + self.status_5xx + self.grpc
    }
}

/// What a load run measured.
#[derive(Debug, Clone)]
pub struct LoadResult {
    /// Latency histogram of measured requests, nanoseconds.
    pub histogram: Histogram<u64>,
    /// Measured requests that completed with a response (any status).
    pub responses: u64,
    /// Errors during the measured window.
    pub errors: ErrorCounts,
    /// Length of the measured window in seconds.
    pub elapsed_s: f64,
    /// Response bytes read in the measured window.
    pub bytes: u64,
    /// Connections opened (including warm-up and reconnects).
    pub connections_opened: u64,
    /// Responses including warm-up (to divide the gateway's CPU time by).
    pub total_responses: u64,
    /// CPU seconds the generator thread used (warm-up included).
    pub generator_cpu_s: f64,
}

impl LoadResult {
    /// Completed responses per second.
    pub fn rps(&self) -> f64 {
        if self.elapsed_s > 0.0 {
            self.responses as f64 / self.elapsed_s
        } else {
            0.0
        }
    }
    /// Responses per CPU-second of the generator thread: its capacity when it has
    /// a whole core, whatever else the machine is doing.
    pub fn responses_per_generator_cpu_s(&self) -> f64 {
        if self.generator_cpu_s > 0.0 {
            self.total_responses as f64 / self.generator_cpu_s
        } else {
            0.0
        }
    }
    /// Latency summary.
    pub fn summary(&self) -> LatencySummary {
        LatencySummary::from_histogram(&self.histogram)
    }
}

/// Runs `spec` on a new thread pinned to `cpu` (when given) and waits for it.
pub fn run(spec: &LoadSpec, cpu: Option<usize>) -> anyhow::Result<LoadResult> {
    validate(spec)?;
    let spec = spec.clone();
    let handle = std::thread::Builder::new()
        .name("moat-bench-load".into())
        .spawn(move || -> anyhow::Result<LoadResult> {
            if let Some(c) = cpu {
                crate::sys::pin_current_thread(c)
                    .map_err(|e| anyhow::anyhow!("pinning the load generator to cpu {c}: {e}"))?;
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let local = tokio::task::LocalSet::new();
            let cpu0 = crate::sys::thread_cpu_seconds();
            let mut res = local.block_on(&rt, run_local(spec))?;
            res.generator_cpu_s = crate::sys::thread_cpu_seconds() - cpu0;
            Ok(res)
        })?;
    handle
        .join()
        .map_err(|_| anyhow::anyhow!("load generator thread panicked"))?
}

fn validate(spec: &LoadSpec) -> anyhow::Result<()> {
    anyhow::ensure!(spec.connections >= 1, "connections must be at least 1");
    anyhow::ensure!(
        spec.connections <= 10_000,
        "connections must be at most 10000"
    );
    anyhow::ensure!(
        spec.streams >= 1 && spec.streams <= 1_000,
        "streams must be within 1..=1000"
    );
    anyhow::ensure!(
        spec.protocol == Protocol::H2 || spec.streams == 1,
        "streams > 1 needs h2"
    );
    anyhow::ensure!(!spec.requests.is_empty(), "no request to send");
    if let Mode::Open { rate } = spec.mode {
        anyhow::ensure!(
            rate.is_finite() && rate > 0.0 && rate <= 10_000_000.0,
            "rate must be within (0, 10000000] req/s"
        );
    }
    anyhow::ensure!(
        spec.duration > Duration::ZERO || spec.max_requests.is_some(),
        "duration must be positive"
    );
    Ok(())
}

struct Shared {
    hist: RefCell<Histogram<u64>>,
    responses: Cell<u64>,
    errors: Cell<ErrorCounts>,
    bytes: Cell<u64>,
    issued: Cell<u64>,
    opened: Cell<u64>,
    max_requests: Option<u64>,
    in_flight_measured: Cell<u64>,
    last_done: Cell<Option<Instant>>,
    total: Cell<u64>,
}

impl Shared {
    fn add_error(&self, f: impl FnOnce(&mut ErrorCounts)) {
        let mut e = self.errors.get();
        f(&mut e);
        self.errors.set(e);
    }
    /// Claims one measured request slot; false when `max_requests` is reached.
    fn claim(&self) -> bool {
        let n = self.issued.get();
        if let Some(max) = self.max_requests {
            if n >= max {
                return false;
            }
        }
        self.issued.set(n + 1);
        true
    }
}

struct Ctx {
    target: Target,
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls_pki_types::ServerName<'static>,
    )>,
    h1_requests: Vec<(Bytes, bool)>,
    h2_requests: Vec<RequestTemplate>,
    new_connection_per_request: bool,
}

async fn run_local(spec: LoadSpec) -> anyhow::Result<LoadResult> {
    let tls = if spec.target.tls {
        let alpn: &[&[u8]] = match spec.protocol {
            Protocol::Http1 => &[b"http/1.1"],
            Protocol::H2 => &[b"h2"],
        };
        let cfg = crate::tls::client_config(
            alpn,
            !spec.new_connection_per_request,
            spec.client_identity.as_deref(),
        )?;
        let host = spec
            .target
            .host
            .rsplit_once(':')
            .map_or(spec.target.host.as_str(), |(h, _)| h)
            .trim_matches(['[', ']']);
        let name = rustls_pki_types::ServerName::try_from(host.to_string())
            .map_err(|e| anyhow::anyhow!("invalid TLS server name `{host}`: {e}"))?;
        Some((tokio_rustls::TlsConnector::from(Arc::new(cfg)), name))
    } else {
        None
    };
    let ctx = Rc::new(Ctx {
        h1_requests: spec
            .requests
            .iter()
            .map(|r| {
                (
                    r.to_http1(&spec.target, spec.new_connection_per_request),
                    r.method == "HEAD",
                )
            })
            .collect(),
        h2_requests: spec.requests.clone(),
        target: spec.target.clone(),
        tls,
        new_connection_per_request: spec.new_connection_per_request,
    });
    let shared = Rc::new(Shared {
        hist: RefCell::new(stats::new_histogram()),
        responses: Cell::new(0),
        errors: Cell::new(ErrorCounts::default()),
        bytes: Cell::new(0),
        issued: Cell::new(0),
        opened: Cell::new(0),
        max_requests: spec.max_requests,
        in_flight_measured: Cell::new(0),
        last_done: Cell::new(None),
        total: Cell::new(0),
    });

    // Connect everything first so connection set-up is not in the measurement.
    let mut conns: Vec<Conn> = Vec::with_capacity(spec.connections * spec.streams);
    for _ in 0..spec.connections {
        match spec.protocol {
            Protocol::Http1 => {
                let mut c = H1Conn {
                    ctx: ctx.clone(),
                    stream: None,
                    reader: ResponseReader::new(),
                };
                if !spec.new_connection_per_request {
                    // A failure here is retried (and counted) by the first send.
                    let _ = c.ensure(&shared).await;
                }
                conns.push(Conn::H1(c));
            }
            Protocol::H2 => {
                let slot = Rc::new(RefCell::new(None));
                let mut first = H2Conn {
                    ctx: ctx.clone(),
                    slot: slot.clone(),
                };
                let _ = first.ensure(&shared).await;
                conns.push(Conn::H2(first));
                for _ in 1..spec.streams {
                    conns.push(Conn::H2(H2Conn {
                        ctx: ctx.clone(),
                        slot: slot.clone(),
                    }));
                }
            }
        }
    }

    let workers = conns.len();
    let start = Instant::now() + Duration::from_millis(5);
    let measure_start = start + spec.warmup;
    let end = measure_start + spec.duration;
    let hard_end = end + spec.grace;
    let n_templates = ctx.h1_requests.len().max(ctx.h2_requests.len());
    let mut handles = Vec::with_capacity(workers + 1);
    if let Some(hook) = spec.on_measure_start.clone() {
        handles.push(tokio::task::spawn_local(async move {
            tokio::time::sleep_until(measure_start.into()).await;
            (hook.0)();
        }));
    }
    for (w, conn) in conns.into_iter().enumerate() {
        let shared = shared.clone();
        let plan = Plan {
            mode: spec.mode,
            worker: w,
            workers,
            start,
            measure_start,
            end,
            n_templates,
        };
        handles.push(tokio::task::spawn_local(async move {
            let fut = worker(conn, plan, shared.clone());
            if tokio::time::timeout_at(hard_end.into(), fut).await.is_err() {
                // The request in flight at the hard end never completed.
                let stuck = shared.in_flight_measured.get();
                if stuck > 0 {
                    shared.in_flight_measured.set(stuck - 1);
                    shared.add_error(|e| e.timeouts += 1);
                }
            }
        }));
    }
    for h in handles {
        h.await?;
    }
    let elapsed_s = if spec.max_requests.is_some() {
        // Stopped by count: the window is from measure start to the last completion.
        let last = shared.last_done.get().unwrap_or(end);
        last.saturating_duration_since(measure_start).as_secs_f64()
    } else {
        spec.duration.as_secs_f64()
    };
    let shared = Rc::try_unwrap(shared).map_err(|_| anyhow::anyhow!("worker still running"))?;
    Ok(LoadResult {
        histogram: shared.hist.into_inner(),
        responses: shared.responses.get(),
        errors: shared.errors.get(),
        elapsed_s,
        bytes: shared.bytes.get(),
        connections_opened: shared.opened.get(),
        total_responses: shared.total.get(),
        generator_cpu_s: 0.0,
    })
}

#[derive(Clone, Copy)]
struct Plan {
    mode: Mode,
    worker: usize,
    workers: usize,
    start: Instant,
    measure_start: Instant,
    end: Instant,
    n_templates: usize,
}

/// The closed loop of one connection: the next request as soon as the previous answered.
async fn closed_loop(conn: &mut Conn, plan: Plan, shared: &Rc<Shared>, mut template: usize) {
    loop {
        let sent = Instant::now();
        if sent >= plan.end {
            break;
        }
        let measured = sent >= plan.measure_start;
        if measured && !shared.claim() {
            break;
        }
        one(conn, template, sent, measured, shared).await;
        template = (template + 1) % plan.n_templates;
    }
}

async fn worker(mut conn: Conn, plan: Plan, shared: Rc<Shared>) {
    let mut template = plan.worker % plan.n_templates;
    match plan.mode {
        // Start together at `start`: sending before it would add unrecorded
        // requests even with no warm-up (and `-n N` would send more than N).
        Mode::Closed => {
            tokio::time::sleep_until(plan.start.into()).await;
            closed_loop(&mut conn, plan, &shared, template).await;
        }
        Mode::Open { rate } => {
            let interval = Duration::from_secs_f64(plan.workers as f64 / rate);
            let offset = Duration::from_secs_f64(plan.worker as f64 / rate);
            let mut prev_done = plan.start;
            // How late this generator itself sent the connection's previous request
            // (its timer), carried into a request that then had to queue behind it.
            let mut own_lateness = Duration::ZERO;
            let mut i: u32 = 0;
            while let Some(intended) = interval
                .checked_mul(i)
                .and_then(|d| plan.start.checked_add(offset + d))
            {
                i = i.saturating_add(1);
                if intended >= plan.end {
                    break;
                }
                let measured = intended >= plan.measure_start;
                if measured && !shared.claim() {
                    break;
                }
                if Instant::now() < intended {
                    tokio::time::sleep_until(intended.into()).await;
                }
                let sent = Instant::now();
                let reference = open_loop_reference(intended, sent, prev_done, own_lateness);
                own_lateness = reference.saturating_duration_since(intended);
                prev_done = one(&mut conn, template, reference, measured, &shared).await;
                template = (template + 1) % plan.n_templates;
            }
        }
    }
}

/// The instant an open-loop request's latency is counted from (coordinated-omission
/// correction). Idle at the intended time (`prev_done` before it): only this
/// generator's timer can have made it late, so from the send. Busy: the previous
/// answer held the request back, so from the intended time, shifted by the lateness of
/// the generator's own that the previous request carried (`own_lateness`): with a 1 ms
/// interval and tokio's 1 ms timer, that lateness would otherwise cascade from request
/// to request and be charged to the server.
fn open_loop_reference(
    intended: Instant,
    sent: Instant,
    prev_done: Instant,
    own_lateness: Duration,
) -> Instant {
    if prev_done > intended {
        sent.min(intended + own_lateness)
    } else {
        sent
    }
}

/// Sends one request and records it; returns the completion instant.
async fn one(
    conn: &mut Conn,
    template: usize,
    reference: Instant,
    measured: bool,
    shared: &Shared,
) -> Instant {
    if measured {
        shared
            .in_flight_measured
            .set(shared.in_flight_measured.get() + 1);
    }
    let res = match conn {
        Conn::H1(c) => c.send(template, shared).await,
        Conn::H2(c) => c.send(template, shared).await,
    };
    let done = Instant::now();
    if res.is_ok() {
        shared.total.set(shared.total.get() + 1);
    }
    if !measured {
        return done;
    }
    shared
        .in_flight_measured
        .set(shared.in_flight_measured.get().saturating_sub(1));
    shared.last_done.set(Some(done));
    match res {
        Ok(Answer {
            status,
            bytes,
            grpc_failed,
        }) => {
            let ns = done.saturating_duration_since(reference).as_nanos();
            stats::record_ns(
                &mut shared.hist.borrow_mut(),
                u64::try_from(ns).unwrap_or(u64::MAX),
            );
            shared.responses.set(shared.responses.get() + 1);
            shared.bytes.set(shared.bytes.get() + bytes);
            match status {
                400..=499 => shared.add_error(|e| e.status_4xx += 1),
                500..=599 => shared.add_error(|e| e.status_5xx += 1),
                _ => {}
            }
            if grpc_failed {
                shared.add_error(|e| e.grpc += 1);
            }
        }
        Err(_) => {
            shared.add_error(|e| e.io += 1);
            // Do not spin on a refused connection.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    done
}

/// What a request got back.
struct Answer {
    status: u16,
    /// Response body bytes.
    bytes: u64,
    /// A gRPC call that did not end with `grpc-status: 0`.
    grpc_failed: bool,
}

enum Conn {
    H1(H1Conn),
    H2(H2Conn),
}

/// A load-generator connection: plain TCP or client-side TLS.
type Stream = MaybeTls<tokio_rustls::client::TlsStream<TcpStream>>;

async fn connect(ctx: &Ctx, shared: &Shared) -> io::Result<Stream> {
    let tcp = TcpStream::connect(ctx.target.addr).await?;
    tcp.set_nodelay(true)?;
    shared.opened.set(shared.opened.get() + 1);
    match &ctx.tls {
        None => Ok(MaybeTls::Plain(tcp)),
        Some((connector, name)) => {
            let s = connector.connect(name.clone(), tcp).await?;
            Ok(MaybeTls::Tls(Box::new(s)))
        }
    }
}

struct H1Conn {
    ctx: Rc<Ctx>,
    stream: Option<Stream>,
    reader: ResponseReader,
}

impl H1Conn {
    async fn ensure(&mut self, shared: &Shared) -> io::Result<()> {
        if self.stream.is_none() {
            self.reader.reset();
            self.stream = Some(connect(&self.ctx, shared).await?);
        }
        Ok(())
    }

    async fn send(&mut self, template: usize, shared: &Shared) -> io::Result<Answer> {
        self.ensure(shared).await?;
        let (req, head) = &self.ctx.h1_requests[template];
        let Some(stream) = self.stream.as_mut() else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        let result = async {
            stream.write_all(req).await?;
            self.reader.read_response(stream, *head).await
        }
        .await;
        match result {
            Ok(r) => {
                if r.close || self.ctx.new_connection_per_request {
                    self.stream = None;
                }
                Ok(Answer {
                    status: r.status,
                    bytes: r.bytes,
                    grpc_failed: false,
                })
            }
            Err(e) => {
                self.stream = None;
                Err(e)
            }
        }
    }
}

type H2Sender = hyper::client::conn::http2::SendRequest<Full<Bytes>>;

struct H2Conn {
    ctx: Rc<Ctx>,
    slot: Rc<RefCell<Option<H2Sender>>>,
}

impl H2Conn {
    async fn ensure(&mut self, shared: &Shared) -> io::Result<H2Sender> {
        if let Some(s) = self.slot.borrow().as_ref() {
            if !s.is_closed() {
                return Ok(s.clone());
            }
        }
        let stream = connect(&self.ctx, shared).await?;
        let (sender, conn) =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(io::Error::other)?;
        tokio::task::spawn_local(async move {
            // The connection ends when every sender is dropped or the peer closes.
            let _ = conn.await;
        });
        *self.slot.borrow_mut() = Some(sender.clone());
        Ok(sender)
    }

    async fn send(&mut self, template: usize, shared: &Shared) -> io::Result<Answer> {
        let mut sender = self.ensure(shared).await?;
        let req = self.ctx.h2_requests[template]
            .to_http2(&self.ctx.target)
            .map_err(io::Error::other)?;
        let result = async {
            sender.ready().await?;
            let resp = sender.send_request(req).await?;
            let (head, body) = resp.into_parts();
            let body = body.collect().await?;
            // A gRPC status comes in the trailers, or in the head of a
            // trailers-only answer (an error before any message).
            let grpc = head
                .headers
                .get("grpc-status")
                .or_else(|| body.trailers().and_then(|t| t.get("grpc-status")));
            Ok::<_, hyper::Error>(Answer {
                status: head.status.as_u16(),
                grpc_failed: grpc.is_some_and(|s| s != "0"),
                bytes: body.to_bytes().len() as u64,
            })
        }
        .await;
        result.map_err(|e| {
            *self.slot.borrow_mut() = None;
            io::Error::other(e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_loop_counts_the_servers_delays_and_not_the_generators() {
        let t0 = Instant::now();
        let us = Duration::from_micros;
        // Idle connection, timer 300 µs late: counted from the send.
        assert_eq!(
            open_loop_reference(t0, t0 + us(300), t0 - us(500), Duration::ZERO),
            t0 + us(300)
        );
        // Queued behind a request the timer sent 900 µs late (1 ms interval: 100 µs
        // before this one's time), whose answer took 1,200 µs. Sent on time, it would
        // have held this request 200 µs: counted from 900 µs, those 200 are the server's.
        assert_eq!(
            open_loop_reference(t0, t0 + us(1_100), t0 + us(1_100), us(900)),
            t0 + us(900)
        );
        // Queued behind a stalled server (previous request sent on time): counted from
        // the intended time, so the whole stall is the server's.
        assert_eq!(
            open_loop_reference(t0, t0 + us(200_000), t0 + us(200_000), Duration::ZERO),
            t0
        );
        // The carried lateness never moves the reference past the send.
        assert_eq!(
            open_loop_reference(t0, t0 + us(50), t0 + us(50), us(900)),
            t0 + us(50)
        );
    }

    /// An h2 server whose every call fails with gRPC status 12 (UNIMPLEMENTED), in
    /// the head of a trailers-only answer (`head`) or in the trailers.
    fn failing_grpc_server(head: bool) -> SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                while let Ok((s, _)) = listener.accept().await {
                    let svc = hyper::service::service_fn(move |_req| async move {
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", http::HeaderValue::from_static("12"));
                        let mut resp = http::Response::new(
                            Full::new(Bytes::new())
                                .with_trailers(std::future::ready(Some(Ok(trailers.clone())))),
                        );
                        let h = resp.headers_mut();
                        h.insert(
                            "content-type",
                            http::HeaderValue::from_static("application/grpc"),
                        );
                        if head {
                            h.extend(trailers);
                        }
                        Ok::<_, std::convert::Infallible>(resp)
                    });
                    tokio::spawn(
                        hyper::server::conn::http2::Builder::new(
                            hyper_util::rt::TokioExecutor::new(),
                        )
                        .serve_connection(hyper_util::rt::TokioIo::new(s), svc),
                    );
                }
            });
        });
        addr
    }

    #[test]
    fn failed_grpc_calls_are_errors() {
        for head in [true, false] {
            let addr = failing_grpc_server(head);
            let target = Target::parse(&format!("http://{addr}")).unwrap();
            let mut call = RequestTemplate::get("/pkg.Service/Method");
            call.method = "POST".into();
            call.headers = vec![("content-type".into(), "application/grpc".into())];
            let mut spec = LoadSpec::closed(target, vec![call], 1);
            spec.protocol = Protocol::H2;
            spec.warmup = Duration::ZERO;
            spec.max_requests = Some(10);
            let res = run(&spec, None).unwrap();
            assert_eq!(res.responses, 10, "status in the head: {head}");
            assert_eq!(res.errors.grpc, 10, "status in the head: {head}");
            assert_eq!(res.errors.total(), 10);
        }
    }

    #[test]
    fn parses_targets() {
        let t = Target::parse("http://127.0.0.1:8080/base/").unwrap();
        assert_eq!(t.addr, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(t.base_path, "/base");
        assert!(!t.tls);
        let t = Target::parse("https://localhost:8443").unwrap();
        assert!(t.tls);
        assert_eq!(t.host, "localhost:8443");
        assert!(Target::parse("ftp://x").is_err());
        assert!(Target::parse("http://example.com:80").is_err());
    }

    #[test]
    fn serializes_http1_requests() {
        let t = Target::parse("http://127.0.0.1:9/p").unwrap();
        let mut r = RequestTemplate::get("/a?b=1");
        r.headers.push(("X-A".into(), "1".into()));
        assert_eq!(
            &r.to_http1(&t, false)[..],
            b"GET /p/a?b=1 HTTP/1.1\r\nHost: 127.0.0.1:9\r\nX-A: 1\r\n\r\n"
        );
        r.method = "POST".into();
        r.body = Bytes::from_static(b"{}");
        assert_eq!(
            &r.to_http1(&t, true)[..],
            b"POST /p/a?b=1 HTTP/1.1\r\nHost: 127.0.0.1:9\r\nX-A: 1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
        );
    }

    #[test]
    fn rejects_bad_specs() {
        let t = Target::parse("http://127.0.0.1:9").unwrap();
        let mut s = LoadSpec::closed(t, vec![RequestTemplate::get("/")], 0);
        assert!(run(&s, None).is_err());
        s.connections = 1;
        s.mode = Mode::Open { rate: 0.0 };
        assert!(run(&s, None).is_err());
        s.mode = Mode::Closed;
        s.streams = 2;
        assert!(run(&s, None).is_err());
    }
}
