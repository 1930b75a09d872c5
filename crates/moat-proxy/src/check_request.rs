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
//! of the same bytes, and the CUSTOM client's tests decode what it writes with
//! `envoy-types`.
//!
//! A `string` field read as bytes (same wire type) is not checked for UTF-8 on the way
//! in: header values need not be UTF-8, and the method and path go through the `http`
//! crate's parsers. On the way out the writer must put UTF-8 in them (protobuf requires
//! it of a string, and providers decode them as strings).

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
