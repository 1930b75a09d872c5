//! Envoy's `CheckRequest` as moat reads it (the decision service) and writes it (the
//! CUSTOM client): the fields moat uses, with Envoy's field numbers.
//!
//! Why not `envoy-types`' own `CheckRequest`: its `request.http.headers` is a protobuf
//! `map<string, string>` held in a `HashMap` of two allocated, UTF-8-checked `String`s
//! per header, hashed with SipHash. Decoding it was a fifth of a Check's instructions,
//! and the decision then copied every header again into an `http::HeaderMap`; building
//! one for a CUSTOM call hashed every header of the request on its way out. On the wire a
//! map is a repeated message of key (field 1) and value (field 2), so here it is a `Vec`
//! of entries, and the HTTP fields are `Bytes`: decoded, they are slices of the received
//! message. Fields moat does not read are skipped by the decoder. The fuzz entry
//! `fuzzing::check_request_conversion` holds the decode against `envoy-types`' decode
//! of the same bytes; the writer's tests hold its bytes against prost's encoding of
//! the view for the same fields (generated ones too) and decode them with `envoy-types`.
//!
//! A `string` field read as bytes (same wire type) is not checked for UTF-8 on the way
//! in: header values need not be UTF-8, and the method and path go through the `http`
//! crate's parsers. On the way out ([`CheckOut`], the CUSTOM client's writer) they are
//! `str`: protobuf requires UTF-8 of a string, and providers decode them as strings.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::Address;

/// The path of Envoy's `Check` method, which carries this message.
pub(crate) const CHECK_PATH: &str = "/envoy.service.auth.v3.Authorization/Check";

/// `envoy.service.auth.v3.CheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct CheckRequest {
    #[prost(message, optional, tag = "1")]
    pub(crate) attributes: Option<Attributes>,
}

/// `envoy.service.auth.v3.AttributeContext`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Attributes {
    #[prost(message, optional, tag = "1")]
    pub(crate) source: Option<Peer>,
    #[prost(message, optional, tag = "2")]
    pub(crate) destination: Option<Peer>,
    #[prost(message, optional, tag = "4")]
    pub(crate) request: Option<Request>,
    #[prost(message, optional, tag = "12")]
    pub(crate) tls_session: Option<TlsSession>,
}

/// `AttributeContext.Peer`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Peer {
    #[prost(message, optional, tag = "1")]
    pub(crate) address: Option<Address>,
    #[prost(string, tag = "4")]
    pub(crate) principal: String,
    #[prost(string, tag = "5")]
    pub(crate) certificate: String,
}

/// `AttributeContext.Request`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Request {
    #[prost(message, optional, tag = "2")]
    pub(crate) http: Option<HttpRequest>,
}

/// `AttributeContext.HttpRequest`, its `string` fields as bytes (see the module's doc).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HttpRequest {
    /// The request id (`x-request-id`).
    #[prost(bytes = "bytes", tag = "1")]
    pub(crate) id: Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    pub(crate) method: Bytes,
    /// `map<string, string> headers`, as its wire form: one entry per key.
    #[prost(message, repeated, tag = "3")]
    pub(crate) headers: Vec<HeaderEntry>,
    #[prost(bytes = "bytes", tag = "4")]
    pub(crate) path: Bytes,
    #[prost(bytes = "bytes", tag = "5")]
    pub(crate) host: Bytes,
    #[prost(bytes = "bytes", tag = "6")]
    pub(crate) scheme: Bytes,
    /// `content-length`, -1 when unknown.
    #[prost(int64, tag = "9")]
    pub(crate) size: i64,
    /// `HTTP/1.1`, `HTTP/2`...
    #[prost(bytes = "bytes", tag = "10")]
    pub(crate) protocol: Bytes,
    #[prost(bytes = "bytes", tag = "11")]
    pub(crate) body: Bytes,
    #[prost(bytes = "bytes", tag = "12")]
    pub(crate) raw_body: Bytes,
    /// `envoy.config.core.v3.HeaderMap`, sent instead of `headers` when Envoy's
    /// `encode_raw_headers` is set.
    #[prost(message, optional, tag = "13")]
    pub(crate) header_map: Option<HeaderMap>,
}

/// An entry of the `headers` map.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HeaderEntry {
    #[prost(bytes = "bytes", tag = "1")]
    pub(crate) key: Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    pub(crate) value: Bytes,
}

/// `envoy.config.core.v3.HeaderMap`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HeaderMap {
    #[prost(message, repeated, tag = "1")]
    pub(crate) headers: Vec<HeaderValue>,
}

/// `envoy.config.core.v3.HeaderValue`: `raw_value` when set, else `value`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HeaderValue {
    #[prost(bytes = "bytes", tag = "1")]
    pub(crate) key: Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    pub(crate) value: Bytes,
    #[prost(bytes = "bytes", tag = "3")]
    pub(crate) raw_value: Bytes,
}

/// `AttributeContext.TlsSession`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct TlsSession {
    #[prost(string, tag = "1")]
    pub(crate) sni: String,
}

/// A `CheckRequest` as the CUSTOM client writes it: borrowed from the request and its
/// connection, encoded in one pass with the nested lengths counted once, bottom up.
///
/// Why not fill the view above and let prost encode it: every header name and value
/// would be copied into its own `Bytes`, the addresses formatted into `String`s, and
/// prost counts a nested message's length again at every level it is nested in; that
/// was about a third of moat's instructions for a CUSTOM call. The bytes written are
/// those prost writes for the same fields (fields in tag order, empty ones left out):
/// the tests encode both and compare.
pub(crate) struct CheckOut<'a> {
    /// The client's address.
    pub(crate) source: SocketAddr,
    /// The SPIFFE identity of a verified client certificate (`source.principal`).
    pub(crate) principal: &'a str,
    /// The address the connection was accepted on.
    pub(crate) destination: SocketAddr,
    /// The TLS server name the client asked for.
    pub(crate) sni: Option<&'a str>,
    /// The request, absent for a TCP connection's check.
    pub(crate) http: Option<HttpOut<'a>>,
}

/// `AttributeContext.HttpRequest` borrowed from the request. The `string` fields are
/// `str`: protobuf requires UTF-8 of them, and providers decode them as strings.
pub(crate) struct HttpOut<'a> {
    pub(crate) id: &'a str,
    pub(crate) method: &'a str,
    /// The `headers` map's entries, one per name.
    pub(crate) headers: Vec<(&'a str, Cow<'a, str>)>,
    pub(crate) path: &'a str,
    pub(crate) host: &'a str,
    pub(crate) scheme: &'static str,
    pub(crate) size: i64,
    pub(crate) protocol: &'static str,
    pub(crate) body: Cow<'a, str>,
    pub(crate) raw_body: &'a [u8],
}

/// Protobuf's wire type of a length-delimited field.
const LEN: u8 = 2;

impl CheckOut<'_> {
    /// The message as one gRPC frame: not compressed, its length in 4 bytes big-endian,
    /// the protobuf. `Err` when it is longer than a frame can say (a body over 4 GiB).
    pub(crate) fn grpc_frame(&self) -> Result<Bytes, String> {
        let source = IpText::new(self.source.ip());
        let destination = IpText::new(self.destination.ip());
        let source_len = peer_len(&source, self.source.port(), self.principal);
        let destination_len = peer_len(&destination, self.destination.port(), "");
        let http_len = self.http.as_ref().map(HttpOut::len);
        let tls_len = self.sni.map(str_len);
        let attributes_len = field_len(source_len)
            + field_len(destination_len)
            + http_len.map_or(0, |l| field_len(field_len(l)))
            + tls_len.map_or(0, field_len);
        let len = field_len(attributes_len);
        let prefix = u32::try_from(len).map_err(|_| format!("a CheckRequest of {len} bytes"))?;
        let mut out = Vec::with_capacity(5 + len);
        out.push(0);
        out.extend_from_slice(&prefix.to_be_bytes());
        put_head(&mut out, 1, attributes_len);
        put_head(&mut out, 1, source_len);
        put_peer(&mut out, &source, self.source.port(), self.principal);
        put_head(&mut out, 2, destination_len);
        put_peer(&mut out, &destination, self.destination.port(), "");
        if let (Some(http), Some(l)) = (&self.http, http_len) {
            put_head(&mut out, 4, field_len(l));
            put_head(&mut out, 2, l);
            http.put(&mut out);
        }
        if let (Some(sni), Some(l)) = (self.sni, tls_len) {
            put_head(&mut out, 12, l);
            put_bytes(&mut out, 1, sni.as_bytes());
        }
        debug_assert_eq!(out.len(), 5 + len);
        Ok(Bytes::from(out))
    }
}

impl HttpOut<'_> {
    fn len(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(k, v)| field_len(str_len(k) + str_len(v)))
            .sum();
        str_len(self.id)
            + str_len(self.method)
            + headers
            + str_len(self.path)
            + str_len(self.host)
            + str_len(self.scheme)
            + if self.size == 0 {
                0
            } else {
                1 + varint_len(self.size as u64)
            }
            + str_len(self.protocol)
            + str_len(&self.body)
            + bytes_len(self.raw_body)
    }

    fn put(&self, out: &mut Vec<u8>) {
        put_bytes(out, 1, self.id.as_bytes());
        put_bytes(out, 2, self.method.as_bytes());
        for (k, v) in &self.headers {
            put_head(out, 3, str_len(k) + str_len(v));
            put_bytes(out, 1, k.as_bytes());
            put_bytes(out, 2, v.as_bytes());
        }
        put_bytes(out, 4, self.path.as_bytes());
        put_bytes(out, 5, self.host.as_bytes());
        put_bytes(out, 6, self.scheme.as_bytes());
        if self.size != 0 {
            // int64: a negative size is the 10-byte varint of its two's complement.
            out.push(9 << 3);
            put_varint(out, self.size as u64);
        }
        put_bytes(out, 10, self.protocol.as_bytes());
        put_bytes(out, 11, self.body.as_bytes());
        put_bytes(out, 12, self.raw_body);
    }
}

/// An IP address as text, without an allocation: IPv4 formatted by hand (the common
/// case, and `Display` is a tenth of the call's work), IPv6 through `Display`.
struct IpText {
    buf: [u8; 45],
    len: usize,
}

impl IpText {
    fn new(ip: IpAddr) -> Self {
        let mut t = IpText {
            buf: [0; 45],
            len: 0,
        };
        match ip {
            IpAddr::V4(v4) => {
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        t.push(b'.');
                    }
                    if octet >= 100 {
                        t.push(b'0' + octet / 100);
                    }
                    if octet >= 10 {
                        t.push(b'0' + octet / 10 % 10);
                    }
                    t.push(b'0' + octet % 10);
                }
            }
            // At most 39 bytes (eight groups of four digits); the buffer holds the
            // longest text form of IPv6, 45.
            IpAddr::V6(v6) => {
                use std::fmt::Write as _;
                let _ = write!(t, "{v6}");
            }
        }
        t
    }

    fn push(&mut self, b: u8) {
        self.buf[self.len] = b;
        self.len += 1;
    }

    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::fmt::Write for IpText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        self.buf
            .get_mut(self.len..end)
            .ok_or(std::fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// `AttributeContext.Peer` with its `Address.socket_address` (address 2, port_value 3:
/// written even when 0, a member of a oneof) and `principal` (4).
fn peer_len(ip: &IpText, port: u16, principal: &str) -> usize {
    field_len(field_len(socket_len(ip, port))) + str_len(principal)
}

/// `SocketAddress`: the address (2) and the port (3, a one-byte key and a varint).
fn socket_len(ip: &IpText, port: u16) -> usize {
    bytes_len(ip.as_bytes()) + 1 + varint_len(u64::from(port))
}

fn put_peer(out: &mut Vec<u8>, ip: &IpText, port: u16, principal: &str) {
    let socket = socket_len(ip, port);
    put_head(out, 1, field_len(socket));
    put_head(out, 1, socket);
    put_bytes(out, 2, ip.as_bytes());
    out.push(3 << 3);
    put_varint(out, u64::from(port));
    put_bytes(out, 4, principal.as_bytes());
}

/// The length of a length-delimited field of `len` bytes. Every tag written is below
/// 16, so every key is one byte.
fn field_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

/// The length of a `string` or `bytes` field, which proto3 leaves out when empty.
fn bytes_len(b: &[u8]) -> usize {
    if b.is_empty() {
        0
    } else {
        field_len(b.len())
    }
}

fn str_len(s: &str) -> usize {
    bytes_len(s.as_bytes())
}

fn put_head(out: &mut Vec<u8>, tag: u8, len: usize) {
    out.push(tag << 3 | LEN);
    put_varint(out, len as u64);
}

fn put_bytes(out: &mut Vec<u8>, tag: u8, b: &[u8]) {
    if !b.is_empty() {
        put_head(out, tag, b.len());
        out.extend_from_slice(b);
    }
}

fn varint_len(v: u64) -> usize {
    // 7 bits a byte; 0 takes one.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3 as core;
    use envoy_types::pb::envoy::service::auth::v3 as auth;
    use prost::Message as _;

    /// What Envoy encodes (with `envoy-types`' own message types) reads back through
    /// the view field for field.
    #[test]
    fn the_view_reads_what_envoy_types_encode() {
        let address = |ip: &str, port| core::Address {
            address: Some(core::address::Address::SocketAddress(core::SocketAddress {
                address: ip.into(),
                port_specifier: Some(core::socket_address::PortSpecifier::PortValue(port)),
                ..Default::default()
            })),
        };
        let mut http = auth::attribute_context::HttpRequest {
            id: "r1".into(),
            method: "POST".into(),
            path: "/a?b=c".into(),
            host: "shop.example".into(),
            scheme: "https".into(),
            body: "text".into(),
            raw_body: b"\xff raw".to_vec(),
            ..Default::default()
        };
        http.headers.insert("user-agent".into(), "curl".into());
        http.headers.insert("x-a".into(), "1".into());
        let msg = auth::CheckRequest {
            attributes: Some(auth::AttributeContext {
                source: Some(auth::attribute_context::Peer {
                    address: Some(address("10.0.0.1", 4000)),
                    principal: "spiffe://cluster.local/ns/a/sa/b".into(),
                    certificate: "pem".into(),
                    service: "ignored".into(),
                    ..Default::default()
                }),
                destination: Some(auth::attribute_context::Peer {
                    address: Some(address("10.0.0.2", 443)),
                    ..Default::default()
                }),
                request: Some(auth::attribute_context::Request {
                    http: Some(http),
                    ..Default::default()
                }),
                tls_session: Some(auth::attribute_context::TlsSession {
                    sni: "shop.example".into(),
                }),
                ..Default::default()
            }),
        };
        let view = CheckRequest::decode(Bytes::from(msg.encode_to_vec())).unwrap();
        let a = view.attributes.unwrap();
        let source = a.source.unwrap();
        assert_eq!(source.address, Some(address("10.0.0.1", 4000)));
        assert_eq!(source.principal, "spiffe://cluster.local/ns/a/sa/b");
        assert_eq!(source.certificate, "pem");
        assert_eq!(
            a.destination.unwrap().address,
            Some(address("10.0.0.2", 443))
        );
        assert_eq!(a.tls_session.unwrap().sni, "shop.example");
        let http = a.request.unwrap().http.unwrap();
        assert_eq!(&http.method[..], b"POST");
        assert_eq!(&http.path[..], b"/a?b=c");
        assert_eq!(&http.host[..], b"shop.example");
        assert_eq!(&http.body[..], b"text");
        assert_eq!(&http.raw_body[..], b"\xff raw");
        let mut headers: Vec<(&[u8], &[u8])> = http
            .headers
            .iter()
            .map(|h| (&h.key[..], &h.value[..]))
            .collect();
        headers.sort();
        assert_eq!(
            headers,
            [(&b"user-agent"[..], &b"curl"[..]), (b"x-a", b"1")]
        );
        assert!(http.header_map.is_none());

        // `encode_raw_headers`: the header map in order, raw values as sent.
        let raw = auth::attribute_context::HttpRequest {
            header_map: Some(core::HeaderMap {
                headers: vec![
                    core::HeaderValue {
                        key: "x-b".into(),
                        raw_value: b"\x80bin".to_vec(),
                        ..Default::default()
                    },
                    core::HeaderValue {
                        key: "x-b".into(),
                        value: "two".into(),
                        ..Default::default()
                    },
                ],
            }),
            ..Default::default()
        };
        let msg = auth::CheckRequest {
            attributes: Some(auth::AttributeContext {
                request: Some(auth::attribute_context::Request {
                    http: Some(raw),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        };
        let view = CheckRequest::decode(Bytes::from(msg.encode_to_vec())).unwrap();
        let map = view
            .attributes
            .unwrap()
            .request
            .unwrap()
            .http
            .unwrap()
            .header_map
            .unwrap();
        let got: Vec<_> = map
            .headers
            .iter()
            .map(|h| (&h.key[..], &h.value[..], &h.raw_value[..]))
            .collect();
        assert_eq!(
            got,
            [
                (&b"x-b"[..], &b""[..], &b"\x80bin"[..]),
                (b"x-b", b"two", b"")
            ]
        );
    }

    /// The view's fields for what `out` writes, for prost to encode.
    fn as_view(out: &CheckOut<'_>) -> CheckRequest {
        let socket = |a: SocketAddr| core::Address {
            address: Some(core::address::Address::SocketAddress(core::SocketAddress {
                address: a.ip().to_string(),
                port_specifier: Some(core::socket_address::PortSpecifier::PortValue(
                    a.port().into(),
                )),
                ..Default::default()
            })),
        };
        let b = |s: &str| Bytes::copy_from_slice(s.as_bytes());
        CheckRequest {
            attributes: Some(Attributes {
                source: Some(Peer {
                    address: Some(socket(out.source)),
                    principal: out.principal.into(),
                    certificate: String::new(),
                }),
                destination: Some(Peer {
                    address: Some(socket(out.destination)),
                    ..Default::default()
                }),
                request: out.http.as_ref().map(|h| Request {
                    http: Some(HttpRequest {
                        id: b(h.id),
                        method: b(h.method),
                        headers: h
                            .headers
                            .iter()
                            .map(|(k, v)| HeaderEntry {
                                key: b(k),
                                value: b(v),
                            })
                            .collect(),
                        path: b(h.path),
                        host: b(h.host),
                        scheme: b(h.scheme),
                        size: h.size,
                        protocol: b(h.protocol),
                        body: b(&h.body),
                        raw_body: Bytes::copy_from_slice(h.raw_body),
                        header_map: None,
                    }),
                }),
                tls_session: out.sni.map(|sni| TlsSession { sni: sni.into() }),
            }),
        }
    }

    /// The frame `out` writes: prost's encoding of the same fields, and what
    /// `envoy-types` decodes.
    fn check_written(out: &CheckOut<'_>) {
        let frame = out.grpc_frame().unwrap();
        assert_eq!(frame[0], 0, "compressed flag");
        let len = u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]) as usize;
        assert_eq!(len, frame.len() - 5);
        assert_eq!(&frame[5..], &as_view(out).encode_to_vec()[..]);
        let envoy = auth::CheckRequest::decode(&frame[5..]).unwrap();
        let http = envoy.attributes.unwrap().request.and_then(|r| r.http);
        if let (Some(want), Some(got)) = (&out.http, &http) {
            assert_eq!(got.path, want.path);
            // A map: a name given twice keeps its last value.
            let want_headers: std::collections::HashMap<String, String> = want
                .headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            assert_eq!(got.headers, want_headers);
            assert_eq!(got.size, want.size);
            assert_eq!(got.raw_body, want.raw_body);
        }
    }

    #[test]
    fn the_writer_writes_what_prost_writes() {
        let v4 = |s: &str| s.parse::<SocketAddr>().unwrap();
        let big = "x".repeat(300);
        let raw = vec![0xffu8; 70_000];
        let mut cases = vec![
            // A TCP connection's check: the attributes only.
            CheckOut {
                source: v4("10.0.0.1:4000"),
                principal: "",
                destination: v4("0.0.0.0:0"),
                sni: None,
                http: None,
            },
            CheckOut {
                source: v4("[2001:db8::1]:65535"),
                principal: "spiffe://cluster.local/ns/a/sa/b",
                destination: v4("[::ffff:192.168.100.200]:443"),
                sni: Some("shop.example"),
                http: Some(HttpOut {
                    id: "r1",
                    method: "POST",
                    headers: vec![
                        ("accept", Cow::Borrowed("text/html,x/y")),
                        ("x-empty", Cow::Borrowed("")),
                        ("x-long", Cow::Owned(big.clone())),
                    ],
                    path: "/a?b=c",
                    host: "shop.example",
                    scheme: "https",
                    size: -1,
                    protocol: "HTTP/2",
                    body: Cow::Owned(big.clone()),
                    raw_body: &raw,
                }),
            },
        ];
        // Every octet width and port width, sizes around the varint boundaries.
        for (ip, size) in [
            ("1.2.3.4:1", 1),
            ("100.20.3.0:127", 127),
            ("255.255.255.255:128", 128),
            ("9.99.199.0:16384", 16_384),
            ("127.0.0.1:8080", i64::MAX),
        ] {
            cases.push(CheckOut {
                source: v4(ip),
                principal: "",
                destination: v4(ip),
                sni: Some(""),
                http: Some(HttpOut {
                    id: "",
                    method: "GET",
                    headers: Vec::new(),
                    path: "/",
                    host: "",
                    scheme: "http",
                    size,
                    protocol: "HTTP/1.1",
                    body: Cow::Borrowed(""),
                    raw_body: &[],
                }),
            });
        }
        for out in &cases {
            check_written(out);
        }
    }

    proptest::proptest! {
        /// Any fields the client writes: the same bytes as prost's encoding.
        #[test]
        fn the_writer_agrees_with_prost_on_any_fields(
            source in proptest::arbitrary::any::<SocketAddr>(),
            destination in proptest::arbitrary::any::<SocketAddr>(),
            principal in ".{0,40}",
            sni in proptest::option::of(".{0,20}"),
            headers in proptest::collection::vec(("[a-z-]{0,12}", ".{0,200}"), 0..12),
            path in ".{0,300}",
            size in proptest::arbitrary::any::<i64>(),
            body in ".{0,200}",
            raw_body in proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..200),
        ) {
            let out = CheckOut {
                source,
                principal: &principal,
                destination,
                sni: sni.as_deref(),
                http: Some(HttpOut {
                    id: "id",
                    method: "PUT",
                    headers: headers
                        .iter()
                        .map(|(k, v)| (k.as_str(), Cow::Borrowed(v.as_str())))
                        .collect(),
                    path: &path,
                    host: "h",
                    scheme: "http",
                    size,
                    protocol: "HTTP/1.1",
                    body: Cow::Borrowed(&body),
                    raw_body: &raw_body,
                }),
            };
            check_written(&out);
        }
    }

    /// The view borrows from the message it was decoded from: no copy of the body.
    #[test]
    fn the_body_is_a_slice_of_the_message() {
        let msg = auth::CheckRequest {
            attributes: Some(auth::AttributeContext {
                request: Some(auth::attribute_context::Request {
                    http: Some(auth::attribute_context::HttpRequest {
                        raw_body: vec![b'a'; 4096],
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        };
        let wire = Bytes::from(msg.encode_to_vec());
        let view = CheckRequest::decode(wire.clone()).unwrap();
        let body = view
            .attributes
            .unwrap()
            .request
            .unwrap()
            .http
            .unwrap()
            .raw_body;
        let inside = wire.as_ptr_range();
        assert!(inside.contains(&body.as_ptr()), "the body was copied");
    }
}
