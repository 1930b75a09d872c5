//! XML external entities and XInclude.

use super::{Attack, Hit};
use crate::util::{contains_ci, find_ci};

/// XML external entities and XInclude.
pub fn xxe(s: &str) -> Option<Hit> {
    let b = s.as_bytes();
    if let Some(p) = find_ci(b, b"<!entity") {
        let tail = &b[p..b.len().min(p + 400)];
        let conf = if contains_ci(tail, b"system") || contains_ci(tail, b"public") {
            95
        } else {
            80
        };
        return Some(Hit::new(Attack::Xxe, conf, s, p, p + 80));
    }
    if let Some(p) = find_ci(b, b"<!doctype") {
        let tail = &b[p..b.len().min(p + 400)];
        if contains_ci(tail, b" system ")
            || contains_ci(tail, b" system\"")
            || contains_ci(tail, b" public ")
        {
            return Some(Hit::new(Attack::Xxe, 85, s, p, p + 80));
        }
    }
    if let Some(p) = find_ci(b, b"xi:include") {
        if contains_ci(b, b"href") {
            return Some(Hit::new(Attack::Xxe, 85, s, p, p + 60));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xxe_cases() {
        assert!(xxe("<!DOCTYPE r [<!ENTITY x SYSTEM \"file:///etc/passwd\">]>").is_some());
        assert!(xxe("<a>b</a>").is_none());
    }
}
