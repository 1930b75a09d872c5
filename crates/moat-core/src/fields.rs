//! Header field names as backends read them.

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

#[cfg(test)]
mod tests {
    use super::same_cgi_name;

    #[test]
    fn dashes_and_underscores_are_one_variable() {
        assert!(same_cgi_name("x-jwt-sub", "x_jwt_sub"));
        assert!(same_cgi_name("x_jwt-sub", "x-jwt_sub"));
        assert!(same_cgi_name("x-a", "x-a"));
        assert!(!same_cgi_name("x-jwt-sub", "x-jwt-su"));
        assert!(!same_cgi_name("x-jwt-sub", "x.jwt.sub"));
        assert!(!same_cgi_name("x_jwt_sub", "x_jwt_sua"));
    }
}
