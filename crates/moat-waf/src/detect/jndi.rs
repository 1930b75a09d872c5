//! JNDI lookups (Log4Shell), nested-lookup obfuscation included.

use super::{Attack, Hit};
use crate::util::find_ci;

/// JNDI lookups, including nested-lookup obfuscation (`${${lower:j}ndi:...}`).
pub fn jndi(s: &str) -> Option<Hit> {
    let b = s.as_bytes();
    let first = memchr::memmem::find(b, b"${")?;
    if s.len() > 16 << 10 {
        return find_ci(b, b"${jndi:").map(|p| Hit::new(Attack::Jndi, 95, s, p, p + 40));
    }
    let mut cur: String = s[first..].to_string();
    for _ in 0..64 {
        // innermost ${...}
        let cb = cur.as_bytes();
        let Some(close) = cb.iter().position(|&c| c == b'}') else {
            break;
        };
        let Some(open) = cb[..close].windows(2).rposition(|w| w == b"${") else {
            // a '}' without an opener before it: drop it
            cur.replace_range(close..close + 1, "");
            continue;
        };
        let inner = &cur[open + 2..close];
        let li = inner.to_ascii_lowercase();
        if li.starts_with("jndi:") || li.starts_with("jndi :") {
            return Some(Hit::new(Attack::Jndi, 95, s, first, first + 60));
        }
        let repl: String = if let Some(p) = inner.rfind(":-") {
            inner[p + 2..].to_string()
        } else if let Some(rest) = li
            .strip_prefix("lower:")
            .or_else(|| li.strip_prefix("upper:"))
        {
            rest.to_string()
        } else {
            // unresolvable lookup (${env:X}, ${sys:y}): an opaque token
            "x".to_string()
        };
        cur.replace_range(open..close + 1, &repl);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jndi_cases() {
        assert!(jndi("${jndi:ldap://x/a}").is_some());
        assert!(jndi("${${lower:j}${::-n}di:rmi://x/a}").is_some());
        assert!(jndi("${env:HOME}").is_none());
    }
}
