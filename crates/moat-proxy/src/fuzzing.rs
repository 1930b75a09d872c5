//! Entry points for the fuzz targets in `fuzz/` (not a stable API): moat's HTTP/1.1
//! wire path without sockets, so that a fuzzer can hold it against a parser that is not
//! moat's own, and the properties of its parsers (the checks the property tests run,
//! one copy in `h1::oracle`). Each check returns `Err` naming what broke.

use bytes::{Bytes, BytesMut};
use http::HeaderValue;

use crate::body::ProxyBody;
use crate::h1::client::{encode_request_head, RequestFraming};
use crate::h1::oracle;
use crate::h1::server::{parse_request_head, request_head_end, MAX_HEADER_SLOTS};
use crate::h1::{encode_chunk, encode_chunked_end, Decoded};
use crate::upstream::{request_framing, UpstreamHead, UpstreamRequest};

/// A request as moat accepted it from the client and wrote it towards the upstream.
#[derive(Debug)]
pub struct Forwarded {
    /// Method.
    pub method: String,
    /// Origin-form target sent upstream.
    pub target: String,
    /// The body as moat decoded it from the client's framing (what its phases inspect).
    pub body: Bytes,
    /// The upstream request with the body in memory (moat frames it with its length).
    pub buffered: Vec<u8>,
    /// The same request with the body streamed (moat frames it in chunks, one per piece
    /// the client's framing delivered).
    pub streamed: Vec<u8>,
    /// Bytes after this request's end (a pipelined next request, or garbage).
    pub rest: usize,
}

/// The head moat sends upstream for `parts`, as the proxy builds it: the target's
/// authority replaces `Host`, an endpoint's own stands in when there is neither.
fn upstream_head<'a>(
    parts: &'a http::request::Parts,
    target: &'a str,
    peer: &'a HeaderValue,
) -> UpstreamHead<'a> {
    UpstreamHead {
        method: &parts.method,
        target,
        headers: &parts.headers,
        upgrade: false,
        replace_host: parts.uri.authority().is_some(),
        default_host: parts
            .uri
            .authority()
            .map_or("upstream.test", |a| a.as_str()),
        forwarded_for: peer,
        forwarded_proto: "http",
        request_id: "fuzz",
    }
}

/// Runs `input` (bytes from a client) through moat's request head parser and body
/// decoder, and writes the upstream request the proxy would send, both with the body in
/// memory and streamed. `None` when moat refuses the input or it ends mid-request.
pub fn forward_request(input: &[u8]) -> Option<Forwarded> {
    let end = request_head_end(input, &mut 0)?;
    let head = parse_request_head(&input[..end], MAX_HEADER_SLOTS).ok()?;
    let mut decoder = head.decoder;
    let mut buf = BytesMut::from(&input[end..]);
    let mut pieces: Vec<Bytes> = Vec::new();
    let mut trailers = None;
    loop {
        match decoder.decode(&mut buf).ok()? {
            Decoded::Data(d) => pieces.push(d),
            Decoded::Trailers(t) => {
                trailers = Some(t);
                break;
            }
            Decoded::End => break,
            // The input ended mid-body: moat would wait, then time out or see the close.
            Decoded::NeedMore => {
                decoder.on_eof().ok()?;
                break;
            }
        }
    }
    let body: Bytes = pieces.concat().into();
    let parts = &head.parts;
    let peer = HeaderValue::from_static("192.0.2.1");
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let upstream = |body: ProxyBody| UpstreamRequest {
        head: upstream_head(parts, target, &peer),
        body,
    };

    // The body in memory: the framing `Cluster::send` decides, the bytes as written.
    let req = upstream(ProxyBody::full(body.clone()));
    let framing = request_framing(&req);
    let mut buffered = Vec::new();
    encode_request_head(&mut buffered, &req.head, framing);
    match framing {
        RequestFraming::Chunked => {
            encode_chunk(&mut buffered, &body);
            encode_chunked_end(&mut buffered, None);
        }
        _ => buffered.extend_from_slice(&body),
    }

    // Streamed: chunks as `Conn::write_request` writes them.
    let mut streamed = Vec::new();
    encode_request_head(&mut streamed, &req.head, RequestFraming::Chunked);
    for piece in &pieces {
        encode_chunk(&mut streamed, piece);
    }
    encode_chunked_end(&mut streamed, trailers.as_ref());

    Some(Forwarded {
        method: parts.method.to_string(),
        target: target.to_string(),
        body,
        buffered,
        streamed,
        rest: buf.len(),
    })
}

/// The request head parser on client bytes: the head up to the first empty line (as
/// the server reads it) and the bytes whole, with at most `max_fields` fields, checked
/// against `httparse` and the framing rules of RFC 9112 section 6.
pub fn check_request_head(input: &[u8], max_fields: usize) -> Result<(), String> {
    if let Some(end) = request_head_end(input, &mut 0) {
        oracle::check_request_head(&input[..end], max_fields)?;
    }
    oracle::check_request_head(input, max_fields)
}

/// The response head parser on upstream bytes (to a `GET`, or a `HEAD` when `head`):
/// the head up to its empty line and the bytes whole, checked against `httparse`, the
/// framing of RFC 9112 section 6.3 and the size and field-count limits.
pub fn check_response_head(input: &[u8], head: bool) -> Result<(), String> {
    let method = if head {
        http::Method::HEAD
    } else {
        http::Method::GET
    };
    if let Some(end) = crate::h1::head_end(input, &mut 0) {
        oracle::check_response_head(&input[..end], &method)?;
    }
    oracle::check_response_head(input, &method)
}

/// The chunked decoder on arbitrary bytes, whole and in reads of `pieces` bytes
/// (cycled): same result either way, bounded steps and output, and the body a
/// reference chunk reader finds.
pub fn check_chunked(wire: &[u8], pieces: &[usize]) -> Result<(), String> {
    oracle::check_chunked(wire, pieces)
}

/// Chunked encode then decode of `data` cut at `sizes`, with `trailers` and `after`
/// (bytes of the next message): the same data and trailers come back, in any reads.
pub fn check_chunked_round_trip(
    data: &[u8],
    sizes: &[usize],
    trailers: &http::HeaderMap,
    after: &[u8],
    pieces: &[usize],
) -> Result<(), String> {
    oracle::check_chunked_round_trip(data, sizes, trailers, after, pieces)
}

/// A gRPC provider's answer body (what a CUSTOM call reads from the network) on
/// arbitrary bytes: taken only as exactly one uncompressed message whose declared
/// length is what follows, and what it decodes to encodes back to a message that
/// decodes the same.
pub fn check_response_parse(input: &[u8]) -> Result<(), String> {
    use prost::Message;
    let Ok(resp) = crate::ext_authz::check_response(input) else {
        return Ok(());
    };
    let declared = input
        .get(1..5)
        .and_then(|l| <[u8; 4]>::try_from(l).ok())
        .map(u32::from_be_bytes);
    if input.first() != Some(&0) || declared != u32::try_from(input.len() - 5).ok() {
        return Err(format!(
            "took a badly framed answer: {:?}",
            &input[..input.len().min(5)]
        ));
    }
    let again = resp.encode_to_vec();
    let back = envoy_types::pb::envoy::service::auth::v3::CheckResponse::decode(again.as_slice())
        .map_err(|e| format!("re-encoded answer does not decode: {e}"))?;
    if back != resp {
        return Err("the answer changed through a round trip".into());
    }
    Ok(())
}

/// The decision service's `CheckRequest` conversion on arbitrary protobuf bytes: they
/// are decoded as the service decodes them (moat's view of the message, bytes borrowed
/// from the input) and turned into moat's request model, and decoded again by
/// `envoy-types`' generated `CheckRequest` as the reference. Bytes the reference takes,
/// the view must take. A message the conversion refuses is fine (Envoy gets
/// `INVALID_ARGUMENT`); one it takes must keep the path and query, every header (names
/// and value bytes, pseudo headers dropped, a map key given in two cases once, `host`
/// from `http.host` only when no header gave one), the body bytes, and the source and
/// destination, and must not add anything else. (A message the reference refuses, such
/// as one with a header value that is not UTF-8, is only converted.)
pub fn check_request_conversion(input: &[u8]) -> Result<(), String> {
    use envoy_types::pb::envoy::service::auth::v3::CheckRequest;
    use prost::Message;
    let view = crate::decision::parsers::CheckRequest::decode(bytes::Bytes::copy_from_slice(input));
    let caller = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
    let reference = CheckRequest::decode(input);
    let (view, reference) = match (view, reference) {
        (Ok(v), Ok(r)) => (v, r),
        (Err(e), Ok(_)) => return Err(format!("the view refused what Envoy's type takes: {e}")),
        (Ok(v), Err(_)) => {
            let _ = crate::decision::parsers::to_check(v.attributes.unwrap_or_default(), caller);
            return Ok(());
        }
        (Err(_), Err(_)) => return Ok(()),
    };
    let attrs = reference.attributes.unwrap_or_default();
    let http = attrs
        .request
        .as_ref()
        .and_then(|r| r.http.clone())
        .unwrap_or_default();
    let Ok(check) = crate::decision::parsers::to_check(view.attributes.unwrap_or_default(), caller)
    else {
        return Ok(());
    };
    let parts = &check.parts;
    let path = parts.uri.path_and_query().map_or("", |p| p.as_str());
    let want_path = if http.path.is_empty() {
        "/"
    } else {
        &http.path
    };
    if path != want_path || parts.uri.authority().is_some() {
        return Err(format!("path {want_path:?} became {:?}", parts.uri));
    }
    let want_method = if http.method.is_empty() {
        "GET"
    } else {
        &http.method
    };
    if parts.method.as_str() != want_method {
        return Err(format!("method {want_method:?} became {}", parts.method));
    }
    // The headers given, in order, without pseudo-headers.
    let given: Vec<(&str, &[u8])> = match &http.header_map {
        Some(map) => map
            .headers
            .iter()
            .map(|h| {
                let v: &[u8] = if h.raw_value.is_empty() {
                    h.value.as_bytes()
                } else {
                    &h.raw_value
                };
                (h.key.as_str(), v)
            })
            .collect(),
        None => http
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_bytes()))
            .collect(),
    };
    let given: Vec<_> = given
        .into_iter()
        .filter(|(k, _)| !k.starts_with(':'))
        .collect();
    let host_added = usize::from(
        !http.host.is_empty() && !given.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")),
    );
    // From the `headers` map, a name given in two cases is one header (its last value).
    let mut want = given.len();
    if http.header_map.is_none() {
        let mut names: Vec<String> = given.iter().map(|(k, _)| k.to_ascii_lowercase()).collect();
        names.sort_unstable();
        names.dedup();
        want = names.len();
    }
    if parts.headers.len() != want + host_added {
        return Err(format!(
            "{want} headers given, {} converted",
            parts.headers.len()
        ));
    }
    for (k, v) in &given {
        if !parts.headers.get_all(*k).iter().any(|x| {
            x.as_bytes() == *v
                || (http.header_map.is_none()
                    && given
                        .iter()
                        .any(|(k2, v2)| k2.eq_ignore_ascii_case(k) && x.as_bytes() == *v2))
        }) {
            return Err(format!("header {k:?} lost its value {v:?}"));
        }
    }
    if host_added == 1
        && parts.headers.get(http::header::HOST).map(|h| h.as_bytes()) != Some(http.host.as_bytes())
    {
        return Err("host not taken from http.host".into());
    }
    let want_body: &[u8] = if http.raw_body.is_empty() {
        http.body.as_bytes()
    } else {
        &http.raw_body
    };
    if check.body.as_deref().unwrap_or_default() != want_body {
        return Err("the body changed".into());
    }
    if check.client_ip != check.conn.remote_addr.ip() {
        return Err("remote.ip is not the source".into());
    }
    Ok(())
}

/// Forward-auth header parsing on arbitrary header lines (`name: value`, one a line):
/// a subrequest that names an original request becomes it, in origin form, with the
/// method and host it names when they are valid, and none of the forward-auth headers
/// (nor the subrequest's `content-length`) left for the engines to see.
pub fn forward_auth_headers(input: &[u8]) -> Result<(), String> {
    use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, HOST};
    let mut headers = http::HeaderMap::new();
    for line in input.split(|b| *b == b'\n') {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
        ) else {
            continue;
        };
        headers.append(k, v);
    }
    let named = |a: &str, b: &str| {
        headers
            .get(a)
            .filter(|v| !v.is_empty())
            .or_else(|| headers.get(b).filter(|v| !v.is_empty()))
            .cloned()
    };
    let method = named("x-original-method", "x-forwarded-method");
    let host = named("x-original-host", "x-forwarded-host");
    let (mut parts, ()) = http::Request::new(()).into_parts();
    parts.headers = headers.clone();
    // The client address: any bytes, never a panic.
    let _ = crate::decision::parsers::forwarded_client(&parts.headers);
    if !crate::decision::parsers::original_request(&mut parts) {
        return Ok(());
    }
    if parts.uri.authority().is_some() || !parts.uri.path().starts_with('/') {
        return Err(format!("not in origin form: {:?}", parts.uri));
    }
    for h in [
        "x-original-method",
        "x-original-uri",
        "x-original-host",
        "x-forwarded-method",
        "x-forwarded-uri",
        "x-forwarded-host",
        "x-forwarded-proto",
    ] {
        if parts.headers.contains_key(h) {
            return Err(format!("{h} left for the engines"));
        }
    }
    if parts.headers.contains_key(CONTENT_LENGTH) {
        return Err("the subrequest's content-length was kept".into());
    }
    if let Some(m) = method.and_then(|m| http::Method::from_bytes(m.as_bytes()).ok()) {
        if parts.method != m {
            return Err(format!("method {m} became {}", parts.method));
        }
    }
    if let Some(h) = host {
        if parts.headers.get(HOST) != Some(&h) {
            return Err("host not taken from the forward-auth header".into());
        }
    }
    Ok(())
}

/// An HTTP/2 request head (an optional `:authority`, then fields as the h2 crate hands
/// them over) through moat's HTTP/2 head checks and written as the HTTP/1.1 head moat
/// sends upstream, read back by `httparse`: what the engines read is what the upstream
/// reads. Every field moat forwards as it is arrives with the values the engines saw,
/// in order; `Cookie` as one line of them; the host moat routed on (`request_host`) is
/// the one in the upstream's `Host`. Input: lines; the first is the `:authority` (empty
/// for none), the others `name:value`, the value untrimmed.
pub fn check_h2_head(input: &[u8]) -> Result<(), String> {
    use http::header::{HeaderName, COOKIE, HOST};
    let mut lines = input.split(|b| *b == b'\n');
    let authority = lines.next().unwrap_or_default();
    let mut builder = http::Request::builder().version(http::Version::HTTP_2);
    builder = if authority.is_empty() {
        builder.uri("/p")
    } else {
        let Ok(a) = http::uri::Authority::try_from(authority) else {
            return Ok(());
        };
        builder.uri(format!("http://{a}/p"))
    };
    for line in lines {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        // HTTP/2 refuses upper case in a name (RFC 9113 8.2.1); `http` would lower it.
        if name.iter().any(u8::is_ascii_uppercase) {
            continue;
        }
        let (Ok(k), Ok(v)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) else {
            continue;
        };
        builder = builder.header(k, v);
    }
    let Ok(req) = builder.body(()) else {
        return Ok(());
    };
    let mut parts = req.into_parts().0;
    if crate::proxy::authority_error(&parts.uri).is_some()
        || crate::proxy::h2_request_error(&mut parts).is_some()
    {
        return Ok(());
    }
    let peer = HeaderValue::from_static("192.0.2.1");
    let head = upstream_head(&parts, "/p", &peer);
    let mut wire = Vec::new();
    encode_request_head(&mut wire, &head, RequestFraming::None);
    let mut slots = vec![httparse::EMPTY_HEADER; parts.headers.len() + 8];
    let mut read = httparse::Request::new(&mut slots);
    match read.parse(&wire) {
        Ok(httparse::Status::Complete(n)) if n == wire.len() => {}
        other => {
            return Err(format!(
                "httparse read {other:?} in {:?}",
                String::from_utf8_lossy(&wire)
            ))
        }
    }
    // The fields `encode_request_head` writes as they are: not hop-by-hop, not the
    // ones it joins (`Cookie`), replaces (`Host`) or rewrites.
    let written = |name: &HeaderName| {
        use crate::h1::client::{is_hop_by_hop, X_FORWARDED_FOR, X_FORWARDED_PROTO, X_REQUEST_ID};
        !(is_hop_by_hop(name)
            || [HOST, COOKIE].contains(name)
            || [&X_FORWARDED_FOR, &X_FORWARDED_PROTO, &X_REQUEST_ID].contains(&name))
    };
    let seen: Vec<(&str, &[u8])> = parts
        .headers
        .iter()
        .filter(|(k, _)| written(k))
        .map(|(k, v)| (k.as_str(), v.as_bytes()))
        .collect();
    let upstream: Vec<(String, &[u8])> = read
        .headers
        .iter()
        .map(|h| (h.name.to_ascii_lowercase(), h.value))
        .filter(|(k, _)| HeaderName::from_bytes(k.as_bytes()).is_ok_and(|k| written(&k)))
        .collect();
    let upstream: Vec<(&str, &[u8])> = upstream.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    if seen != upstream {
        return Err(format!(
            "the engines read {seen:?}, the upstream {upstream:?}"
        ));
    }
    let values = |name: &str| -> Vec<&[u8]> {
        read.headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
            .collect()
    };
    let cookies: Vec<&[u8]> = parts
        .headers
        .get_all(COOKIE)
        .iter()
        .map(|v| v.as_bytes())
        .filter(|v| !v.is_empty())
        .collect();
    let want_cookie = if cookies.is_empty() {
        vec![]
    } else {
        vec![cookies.join(&b"; "[..])]
    };
    if values("cookie") != want_cookie {
        return Err(format!(
            "cookies {cookies:?} reached the upstream as {:?}",
            values("cookie")
        ));
    }
    let hosts = values("host");
    let [host] = hosts[..] else {
        return Err(format!("the upstream read the hosts {hosts:?}"));
    };
    let routed = crate::proxy::request_host(&parts);
    let host = std::str::from_utf8(host).unwrap_or_default();
    // Neither `:authority` nor `host`: moat routes on no host and sends the
    // endpoint's own.
    let addressed = parts.uri.authority().is_some() || parts.headers.contains_key(HOST);
    if !addressed && host == head.default_host {
        return Ok(());
    }
    if moat_core::strip_port(host) != routed {
        return Err(format!(
            "moat routed on {routed:?}, the upstream reads the host {host:?} (fields {:?})",
            parts.headers.get_all(HOST)
        ));
    }
    Ok(())
}
