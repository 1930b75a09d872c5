//! Console logins: random session ids held in an HttpOnly, SameSite=Strict cookie, each
//! with its own CSRF token, in a bounded in-memory table.
//!
//! A session remembers a hash of the admin token it logged in with: changing
//! `admin.token` (a reload) ends every session opened with the old one.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use moat_proxy::admin::token_matches;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

/// Most sessions held at once; a login past it ends the session closest to expiry.
pub const MAX_SESSIONS: usize = 256;

/// Name of the session cookie.
pub const COOKIE: &str = "moat_console";

/// The token of a login or a form, 32 random bytes in hex.
fn random_token() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

/// Hash of the admin token a session was opened with, hex (`None`: no token configured).
pub fn token_hash(token: Option<&str>) -> String {
    match token {
        Some(t) => hex::encode(Sha256::digest(t.as_bytes())),
        None => String::new(),
    }
}

struct Session {
    csrf: String,
    expires: Instant,
    token_hash: String,
}

/// The sessions of the console.
#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    /// Opens a session lasting `ttl`; returns its id (the cookie value) and CSRF token.
    pub fn create(&self, ttl: Duration, token_hash: String) -> (String, String) {
        let now = Instant::now();
        let mut map = self.map.lock();
        map.retain(|_, s| s.expires > now);
        if map.len() >= MAX_SESSIONS {
            if let Some(k) = map
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone())
            {
                map.remove(&k);
            }
        }
        let (id, csrf) = (random_token(), random_token());
        map.insert(
            id.clone(),
            Session {
                csrf: csrf.clone(),
                expires: now + ttl,
                token_hash,
            },
        );
        (id, csrf)
    }

    /// The CSRF token of a live session opened with the current admin token.
    pub fn check(&self, id: &str, token_hash: &str) -> Option<String> {
        let mut map = self.map.lock();
        let s = map.get(id)?;
        if s.expires <= Instant::now() || !token_matches(&s.token_hash, token_hash) {
            map.remove(id);
            return None;
        }
        Some(s.csrf.clone())
    }

    /// Ends a session.
    pub fn remove(&self, id: &str) {
        self.map.lock().remove(id);
    }

    /// Live and expired sessions held.
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    /// True when no session is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The session id in a `Cookie` header, if any.
pub fn session_cookie(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sessions_expire_and_follow_the_token() {
        let s = Sessions::default();
        let h = token_hash(Some("t1"));
        let (id, csrf) = s.create(Duration::from_secs(60), h.clone());
        assert_eq!(s.check(&id, &h).as_deref(), Some(csrf.as_str()));
        assert_eq!(s.check("nope", &h), None);
        // A new admin token ends the session.
        assert_eq!(s.check(&id, &token_hash(Some("t2"))), None);
        assert_eq!(s.check(&id, &h), None);
        let (id, _) = s.create(Duration::from_millis(1), h.clone());
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(s.check(&id, &h), None);
    }

    #[test]
    fn table_is_bounded() {
        let s = Sessions::default();
        let h = token_hash(None);
        for _ in 0..MAX_SESSIONS * 3 {
            s.create(Duration::from_secs(60), h.clone());
        }
        assert!(s.len() <= MAX_SESSIONS);
    }

    #[test]
    fn cookie_parsing() {
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::COOKIE,
            "a=b; moat_console=abc; c=d".parse().unwrap(),
        );
        assert_eq!(session_cookie(&h), Some("abc"));
        h.insert(http::header::COOKIE, "moat_consolex=1".parse().unwrap());
        assert_eq!(session_cookie(&h), None);
    }
}
