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
    let b = seg.as_bytes();
    if b.is_empty() {
        return false;
    }
    if b.iter().all(u8::is_ascii_digit) {
        return true;
    }
    if is_uuid(b) {
        return true;
    }
    let has_digit = b.iter().any(u8::is_ascii_digit);
    if b.len() >= 8 && has_digit && b.iter().all(u8::is_ascii_hexdigit) {
        return true;
    }
    if b.len() >= 16
        && has_digit
        && b.iter().any(u8::is_ascii_alphabetic)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_')
    {
        return true;
    }
    b.contains(&b'@')
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
    let path = path.split(['?', '#']).next().unwrap_or("");
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

/// Feeds `method` and `template(path)` to `h` without allocating (the request-time
/// sampler keys on it). Callers use a randomly keyed hasher, so a client cannot
/// choose paths whose keys collide with another endpoint's.
pub fn hash_template(h: &mut impl Hasher, method: &str, path: &str) {
    h.write(method.as_bytes());
    h.write_u8(b' ');
    template_bytes(path, |b| h.write(b));
}

/// Walks `template(path)` as byte pieces without allocating: two paths with the same
/// template give the same pieces. A parameter is the single byte `0xff` (never part of
/// a literal segment, which is valid UTF-8) rather than its `{id}` name, which
/// [`template`] numbers.
pub fn template_bytes(path: &str, mut out: impl FnMut(&[u8])) {
    let path = path.split(['?', '#']).next().unwrap_or("");
    for (i, seg) in path.split('/').enumerate() {
        if i > MAX_SEGMENTS {
            out(b"/{rest}");
            break;
        }
        out(b"/");
        out(if is_param(seg) {
            &[0xff]
        } else {
            seg.as_bytes()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
