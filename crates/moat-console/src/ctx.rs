//! What a page handler gets: the request (query and form decoded, the session's CSRF
//! token) and the console's state (sessions, the event store).

use std::path::PathBuf;

use moat_events::EventStore;
use moat_proxy::AdminRequest;
use parking_lot::Mutex;

use crate::session::Sessions;

/// The console's state, shared by its handlers.
pub struct Console {
    /// Logins.
    pub sessions: Sessions,
    events_path: Option<PathBuf>,
    events: Mutex<Option<EventStore>>,
}

/// A request that passed the console's checks.
pub struct Req {
    /// The admin request.
    pub admin: AdminRequest,
    /// Decoded query string.
    pub query: Vec<(String, String)>,
    /// Decoded form body (POST).
    pub form: Vec<(String, String)>,
    /// The session's CSRF token (empty on the login page).
    pub csrf: String,
}

impl Req {
    /// A query parameter, `None` when absent or empty.
    pub fn q(&self, key: &str) -> Option<&str> {
        crate::web::field(&self.query, key).filter(|v| !v.is_empty())
    }

    /// A form field, `None` when absent or empty.
    pub fn f(&self, key: &str) -> Option<&str> {
        crate::web::field(&self.form, key).filter(|v| !v.is_empty())
    }
}

impl Console {
    /// A console reading events from `events_path` (the store the event writer fills).
    pub fn new(events_path: Option<PathBuf>) -> Console {
        Console {
            sessions: Sessions::default(),
            events_path,
            events: Mutex::new(None),
        }
    }

    /// Runs `f` on the event store (opened read-only on first use). `Err` says why
    /// there is none.
    pub fn with_events<T>(
        &self,
        f: impl FnOnce(&EventStore) -> Result<T, moat_events::EventsError>,
    ) -> Result<T, String> {
        let Some(path) = &self.events_path else {
            return Err("the event store is off (set events.store in the config)".into());
        };
        let mut guard = self.events.lock();
        if guard.is_none() {
            *guard = Some(EventStore::open_read_only(path).map_err(|e| e.to_string())?);
        }
        match guard.as_ref() {
            Some(s) => f(s).map_err(|e| e.to_string()),
            None => Err("the event store is unavailable".into()),
        }
    }
}
