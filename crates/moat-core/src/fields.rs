//! Header field names as backends read them.

use http::{HeaderMap, HeaderName};

/// Whether two lower-case field names reach a CGI-style backend as one variable: CGI,
/// WSGI, PHP and Rack map both `-` and `_` to `_` (`x-jwt-sub` and `x_jwt_sub` are
/// both `HTTP_X_JWT_SUB`). A field moat writes or vouches for must not have a client's
/// spelling of it beside it.
pub fn same_cgi_name(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .all(|(x, y)| x == y || matches!((x, y), (b'-', b'_') | (b'_', b'-')))
}

/// The header fields the gateway writes or some phase decides on (a policy's
/// `request.headers[x-user]`, a token's field, a rate limit's key), compiled once per
/// configuration, and the rule that keeps a client's other spellings of them away from
/// the backend.
///
/// A CGI, WSGI, PHP or Rack backend reads `x_user` as `x-user` ([`same_cgi_name`]).
/// A client's `x_user: admin` would pass a DENY on `request.headers[x-user]` that never
/// saw it and reach the backend as that field. Such twins are removed before any phase
/// reads the head, so what the phases decide on is what the backend reads. Other fields
/// with underscores are the client's own and go on.
#[derive(Debug, Clone, Default)]
pub struct CgiTwins {
    /// Sorted, without duplicates; only names with a `-` or `_` (others have no twin).
    names: Box<[HeaderName]>,
    /// Some name has a `_`: its twins may be spelled with `-` only.
    underscored: bool,
}

impl CgiTwins {
    /// The set for these field names.
    pub fn new(names: impl IntoIterator<Item = HeaderName>) -> CgiTwins {
        let mut names: Vec<HeaderName> = names
            .into_iter()
            .filter(|n| n.as_str().bytes().any(|b| b == b'-' || b == b'_'))
            .collect();
        names.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        let underscored = names.iter().any(|n| n.as_str().contains('_'));
        CgiTwins {
            names: names.into_boxed_slice(),
            underscored,
        }
    }

    /// Whether `name` is another spelling of one of the names (not the name itself).
    pub fn is_twin(&self, name: &HeaderName) -> bool {
        self.names
            .iter()
            .any(|n| n != name && same_cgi_name(n.as_str(), name.as_str()))
    }

    /// Removes the twins of the names from `headers`; returns how many field names were
    /// removed (each with all its values).
    #[inline]
    pub fn remove_from(&self, headers: &mut HeaderMap) -> usize {
        // Every twin of a name without `_` has one: most requests have no such field
        // name, and cost one pass over their names' bytes (short names: a plain loop
        // beats a call to a `memchr`).
        if self.names.is_empty()
            || (!self.underscored
                && !headers
                    .keys()
                    .any(|k| k.as_str().bytes().any(|b| b == b'_')))
        {
            return 0;
        }
        self.remove_twins(headers)
    }

    #[cold]
    fn remove_twins(&self, headers: &mut HeaderMap) -> usize {
        let twins: Vec<HeaderName> = headers
            .keys()
            .filter(|k| self.is_twin(k))
            .cloned()
            .collect();
        for k in &twins {
            headers.remove(k);
        }
        twins.len()
    }
}

#[cfg(test)]
mod tests {
    use super::{same_cgi_name, CgiTwins};
    use http::{HeaderMap, HeaderName, HeaderValue};

    #[test]
    fn dashes_and_underscores_are_one_variable() {
        assert!(same_cgi_name("x-jwt-sub", "x_jwt_sub"));
        assert!(same_cgi_name("x_jwt-sub", "x-jwt_sub"));
        assert!(same_cgi_name("x-a", "x-a"));
        assert!(!same_cgi_name("x-jwt-sub", "x-jwt-su"));
        assert!(!same_cgi_name("x-jwt-sub", "x.jwt.sub"));
        assert!(!same_cgi_name("x_jwt_sub", "x_jwt_sua"));
    }

    fn map(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in fields {
            h.append(*n, HeaderValue::from_static(v));
        }
        h
    }

    fn names(h: &HeaderMap) -> Vec<&str> {
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        names
    }

    #[test]
    fn twins_go_the_names_and_other_underscores_stay() {
        let twins =
            CgiTwins::new(["x-user", "x-user", "host", "x_tenant"].map(HeaderName::from_static));
        // `host` has no twin; the duplicate is kept once.
        assert_eq!(twins.names.len(), 2);
        let mut h = map(&[
            ("x-user", "alice"),
            ("x_user", "admin"),
            ("x_user", "root"),
            ("x-u-ser", "admin"),
            ("x_api_key", "k"),
            ("x-tenant", "b"),
            ("x_tenant", "a"),
            ("host", "h"),
        ]);
        // `x_user` with both its values, and `x-tenant`, a twin of `x_tenant`.
        assert_eq!(twins.remove_from(&mut h), 2, "{h:?}");
        assert_eq!(
            names(&h),
            ["host", "x-u-ser", "x-user", "x_api_key", "x_tenant"]
        );
        assert_eq!(h["x-user"], "alice");
    }

    #[test]
    fn requests_without_underscores_are_left_as_they_are() {
        let twins = CgiTwins::new([HeaderName::from_static("x-user")]);
        let mut h = map(&[("x-user", "a"), ("x-other", "b")]);
        assert_eq!(twins.remove_from(&mut h), 0);
        assert_eq!(h.len(), 2);
        // No names: nothing to do whatever the request has.
        let mut h = map(&[("x_user", "a")]);
        assert_eq!(CgiTwins::default().remove_from(&mut h), 0);
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn many_fields_with_underscores_are_bounded_by_the_map() {
        // A hostile head of 2,000 fields: each is compared with the configured names
        // only, and every twin goes with all its values.
        let twins =
            CgiTwins::new((0..64).map(|i| HeaderName::try_from(format!("x-f-{i}")).unwrap()));
        let mut h = HeaderMap::new();
        for i in 0..2000 {
            let n = HeaderName::try_from(format!("x_f_{}", i % 128)).unwrap();
            h.append(n, HeaderValue::from_static("v"));
        }
        assert_eq!(twins.remove_from(&mut h), 64);
        assert_eq!(h.keys_len(), 64);
        assert!(h.keys().all(|k| !twins.is_twin(k)));
    }
}
