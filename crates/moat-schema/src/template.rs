//! Path templating: `/users/123/orders/9f1c2a7e` -> `/users/{id}/orders/{id2}`.
//!
//! A segment becomes a parameter when it is:
//! - all digits (`123`);
//! - a UUID (`8-4-4-4-12` hex digits);
//! - a hex id of 8 or more hex digits containing at least one digit (`9f1c2a7e`, a SHA);
//! - a long random token: 16 or more of `[A-Za-z0-9_-]` with both letters and digits
//!   (base64url ids, ULIDs, API keys);
//! - an email address or contains `@` (values must not leak into the inventory).
//!
//! Parameters are named `{id}`, `{id2}`, `{id3}`... in order. Empty segments
//! (`//`) are kept, a trailing `/` is kept, and the query string is not part of the path.

use std::hash::Hasher;

/// Maximum number of segments templated; the rest of a longer path is replaced by `{rest}`.
pub const MAX_SEGMENTS: usize = 64;

/// Whether a path segment looks like an identifier rather than a fixed name.
pub fn is_param(seg: &str) -> bool {
    is_param_bytes(seg.as_bytes())
}

/// Byte classes of [`is_param_bytes`].
const DIGIT: u8 = 1;
const HEX: u8 = 2;
const ALPHA: u8 = 4;
/// `[A-Za-z0-9_-]`: a token's bytes.
const TOKEN: u8 = 8;
const AT: u8 = 16;

/// [`is_param`] on bytes. Every request's path goes through it (the sampler's
/// key), so one walk with a class table gathers what the rules test.
fn is_param_bytes(b: &[u8]) -> bool {
    static CLASS: [u8; 256] = {
        let mut t = [0u8; 256];
        let mut i = 0;
        while i < 256 {
            let c = i as u8;
            if c.is_ascii_digit() {
                t[i] |= DIGIT;
            }
            if c.is_ascii_hexdigit() {
                t[i] |= HEX;
            }
            if c.is_ascii_alphabetic() {
                t[i] |= ALPHA;
            }
            if c.is_ascii_alphanumeric() || c == b'-' || c == b'_' {
                t[i] |= TOKEN;
            }
            if c == b'@' {
                t[i] |= AT;
            }
            i += 1;
        }
        t
    };
    if b.is_empty() {
        return false;
    }
    // `any`: a class some byte has; `all`: a class every byte has.
    let (mut any, mut all) = (0u8, u8::MAX);
    for &c in b {
        let k = CLASS[usize::from(c)];
        any |= k;
        all &= k;
    }
    let has_digit = any & DIGIT != 0;
    all & DIGIT != 0
        || is_uuid(b)
        || (b.len() >= 8 && has_digit && all & HEX != 0)
        || (b.len() >= 16 && has_digit && any & ALPHA != 0 && all & TOKEN != 0)
        || any & AT != 0
}

fn is_uuid(b: &[u8]) -> bool {
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// The template of `path` (the query string, if any, is ignored).
pub fn template(path: &str) -> String {
    let path = without_query(path);
    let mut out = String::with_capacity(path.len());
    let mut n = 0usize;
    for (i, seg) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        if i > MAX_SEGMENTS {
            out.push_str("{rest}");
            break;
        }
        if is_param(seg) {
            n += 1;
            if n == 1 {
                out.push_str("{id}");
            } else {
                out.push_str(&format!("{{id{n}}}"));
            }
        } else {
            out.push_str(seg);
        }
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// `path` up to its query string or fragment.
fn without_query(path: &str) -> &str {
    // A byte loop rather than `split(['?', '#'])`: paths are short, and the
    // char-set searcher cost more than the rest of the sampler's key.
    let end = path
        .bytes()
        .position(|b| b == b'?' || b == b'#')
        .unwrap_or(path.len());
    path.get(..end).unwrap_or(path)
}

/// Feeds `method` and `template(path)` to `h` without allocating (the request-time
/// sampler keys on it). Callers use a randomly keyed hasher, so a client cannot
/// choose paths whose keys collide with another endpoint's. The pieces are
/// gathered in a buffer on the stack and fed in one write when they fit: each
/// write to a streaming hasher (SipHash) pays for its partial words.
pub fn hash_template(h: &mut impl Hasher, method: &str, path: &str) {
    let mut buf = [0u8; 128];
    let mut len = 0;
    let mut feed = |piece: &[u8]| {
        if len + piece.len() > buf.len() {
            h.write(&buf[..len]);
            len = 0;
            if piece.len() > buf.len() {
                h.write(piece);
                return;
            }
        }
        buf[len..len + piece.len()].copy_from_slice(piece);
        len += piece.len();
    };
    feed(method.as_bytes());
    feed(b" ");
    template_bytes(path, &mut feed);
    h.write(&buf[..len]);
}

/// Walks `template(path)` as byte pieces without allocating: two paths with the same
/// template give the same pieces. A parameter is the single byte `0xff` (never part of
/// a literal segment, which is valid UTF-8) rather than its `{id}` name, which
/// [`template`] numbers.
pub fn template_bytes(path: &str, mut out: impl FnMut(&[u8])) {
    let path = without_query(path).as_bytes();
    for (i, seg) in path.split(|&b| b == b'/').enumerate() {
        if i > MAX_SEGMENTS {
            out(b"/{rest}");
            break;
        }
        out(b"/");
        out(if is_param_bytes(seg) { &[0xff] } else { seg });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rules of the module documentation, one test after another.
    fn is_param_by_the_rules(b: &[u8]) -> bool {
        let has_digit = b.iter().any(u8::is_ascii_digit);
        !b.is_empty()
            && (b.iter().all(u8::is_ascii_digit)
                || is_uuid(b)
                || (b.len() >= 8 && has_digit && b.iter().all(u8::is_ascii_hexdigit))
                || (b.len() >= 16
                    && has_digit
                    && b.iter().any(u8::is_ascii_alphabetic)
                    && b.iter()
                        .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_'))
                || b.contains(&b'@'))
    }

    #[test]
    fn one_walk_classifies_segments_as_the_rules_do() {
        let pieces: &[&[u8]] = &[
            b"",
            b"0",
            b"42",
            b"a",
            b"f",
            b"G",
            b"x",
            b"-",
            b"_",
            b"@",
            b".",
            b"~",
            b"%2F",
            b"9f1c2a7e",
            b"deadbeef",
            b"01ARZ3ND",
            b"EKTSV4RR",
            b"users",
            b"\xc3\xa9",
            b"123e4567-e89b-12d3-a456-426614174000",
        ];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for round in 0..20_000 {
            let mut seg = Vec::new();
            for _ in 0..(round % 7) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                seg.extend_from_slice(pieces[(x % pieces.len() as u64) as usize]);
            }
            assert_eq!(is_param_bytes(&seg), is_param_by_the_rules(&seg), "{seg:?}");
        }
        for p in pieces {
            assert_eq!(is_param_bytes(p), is_param_by_the_rules(p), "{p:?}");
        }
    }

    #[test]
    fn template_bytes_are_the_same_for_one_template() {
        let bytes = |p: &str| {
            let mut v = Vec::new();
            template_bytes(p, |b| v.extend_from_slice(b));
            v
        };
        assert_eq!(bytes("/users/1"), bytes("/users/2?x=1"));
        assert_eq!(
            bytes("/users/1/orders/9f1c2a7e"),
            bytes("/users/7/orders/0a0b0c0d0e")
        );
        assert_ne!(bytes("/users/1"), bytes("/users/me"));
        assert_ne!(bytes("/users/1"), bytes("/users/1/"));
        assert_ne!(bytes("/users/1"), bytes("/users/1/orders"));
    }

    #[test]
    fn templates() {
        assert_eq!(template("/users/123"), "/users/{id}");
        assert_eq!(template("/orders/9f1c2a7e4b3d"), "/orders/{id}", "hex id");
        assert_eq!(
            template("/users/42/orders/123e4567-e89b-12d3-a456-426614174000"),
            "/users/{id}/orders/{id2}"
        );
        assert_eq!(
            template("/files/01ARZ3NDEKTSV4RRFFQ69G5FAV/raw"),
            "/files/{id}/raw",
            "ULID"
        );
        assert_eq!(template("/keys/aB3dE5fG7hJ9kL1m"), "/keys/{id}");
        assert_eq!(template("/users/jane@example.com"), "/users/{id}");
        assert_eq!(template("/api/v1/users"), "/api/v1/users");
        assert_eq!(template("/api/v2/health-check"), "/api/v2/health-check");
        assert_eq!(
            template("/blog/introducing-moat-gateway"),
            "/blog/introducing-moat-gateway"
        );
        assert_eq!(
            template("/cafe/deadbeef"),
            "/cafe/deadbeef",
            "hex words without digits stay"
        );
        assert_eq!(template("/items/7?x=1"), "/items/{id}");
        assert_eq!(template("/"), "/");
        assert_eq!(template(""), "/");
        assert_eq!(template("/a/"), "/a/");
    }

    #[test]
    fn long_paths_are_capped() {
        let p = "/a".repeat(200);
        let t = template(&p);
        assert!(t.ends_with("/{rest}"));
        assert!(t.len() < 2 * MAX_SEGMENTS + 10);
    }

    fn template_hash(method: &str, path: &str) -> u64 {
        let mut h = std::hash::DefaultHasher::new();
        hash_template(&mut h, method, path);
        h.finish()
    }

    #[test]
    fn hash_follows_template() {
        assert_eq!(
            template_hash("GET", "/users/1"),
            template_hash("GET", "/users/2")
        );
        assert_ne!(
            template_hash("GET", "/users/1"),
            template_hash("POST", "/users/1")
        );
        assert_ne!(
            template_hash("GET", "/users/1"),
            template_hash("GET", "/users/me")
        );
        assert_ne!(template_hash("GET", "/a/bc"), template_hash("GET", "/ab/c"));
        assert_eq!(
            template_hash("GET", "/a/1?x=1"),
            template_hash("GET", "/a/22")
        );
    }
}
