//! The API inventory: one entry per endpoint (method + path template), kept in
//! memory. Persisting it is not this crate's job: [`crate::InventorySink`]
//! receives the changed endpoints (moat-inventory writes them to SQLite and
//! hands them back at start).

use serde::{Deserialize, Deserializer, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::schema::{merge, Node};

/// Distinct response statuses kept per endpoint.
pub const MAX_STATUSES: usize = 64;
/// Distinct content types kept per message.
pub const MAX_CONTENT_TYPES: usize = 8;
/// Largest weight ([`Node::weight`]) of one merged schema; a merge past it is refused.
pub const MAX_SCHEMA_WEIGHT: usize = 10_000;

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Node::from_value(&v).ok_or_else(|| serde::de::Error::custom("not a schema node"))
    }
}

/// What was learned about requests to an endpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestInfo {
    /// Media types of request bodies seen (`application/json`, ...).
    #[serde(default)]
    pub content_types: BTreeSet<String>,
    /// Schema of the query string (`{key: [values]}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<Node>,
    /// Schema of the request headers (no `cookie`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Node>,
    /// Schema of JSON or form request bodies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Node>,
}

/// What was learned about the responses with one status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResponseInfo {
    /// Responses seen with this status.
    pub count: u64,
    /// Media types of response bodies seen.
    #[serde(default)]
    pub content_types: BTreeSet<String>,
    /// Schema of the response headers (no `set-cookie`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Node>,
    /// Schema of JSON response bodies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Node>,
}

/// One endpoint of the inventory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Endpoint {
    /// HTTP method.
    pub method: String,
    /// Path template, e.g. `/users/{id}`.
    pub path: String,
    /// Route that served it last.
    pub route: String,
    /// First request, unix ms.
    pub first_seen: u64,
    /// Last request, unix ms.
    pub last_seen: u64,
    /// Requests seen by discovery (those dropped on a full queue are not counted).
    pub count: u64,
    /// Requests whose schemas were extracted.
    pub samples: u64,
    /// Authentication seen: `jwt`, `mtls`, `none` -> number of requests.
    pub auth: BTreeMap<String, u64>,
    /// Request schemas, merged over samples.
    pub request: RequestInfo,
    /// Per status: response schemas, merged over samples.
    pub responses: BTreeMap<u16, ResponseInfo>,
}

/// One sensitive field found in an endpoint's schemas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SensitiveField {
    /// `request.query`, `request.headers`, `request.body`, `response.<status>.headers`, `response.<status>.body`.
    pub location: String,
    /// Path inside it, e.g. `/user/email`, arrays as `[]`.
    pub path: String,
    /// The scanner's tags.
    pub tags: BTreeMap<String, String>,
}

impl Endpoint {
    /// Every tagged field of the endpoint's schemas.
    pub fn sensitive(&self) -> Vec<SensitiveField> {
        let mut out = Vec::new();
        let mut add = |loc: &str, node: &Option<Node>| {
            if let Some(n) = node {
                let mut path = String::new();
                n.visit_tagged(&mut path, &mut |p, t| {
                    out.push(SensitiveField {
                        location: loc.to_string(),
                        path: if p.is_empty() {
                            "/".into()
                        } else {
                            p.to_string()
                        },
                        tags: t.clone(),
                    })
                });
            }
        };
        add("request.query", &self.request.query);
        add("request.headers", &self.request.headers);
        add("request.body", &self.request.body);
        for (status, r) in &self.responses {
            add(&format!("response.{status}.headers"), &r.headers);
            add(&format!("response.{status}.body"), &r.body);
        }
        out
    }

    /// JSON for the admin API: the endpoint plus its `sensitive` fields.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        if let Some(o) = v.as_object_mut() {
            o.insert(
                "sensitive".into(),
                serde_json::to_value(self.sensitive()).unwrap_or_default(),
            );
        }
        v
    }
}

/// Schemas extracted from one sampled exchange.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// Query schema.
    pub query: Option<Node>,
    /// Request header schema.
    pub request_headers: Option<Node>,
    /// Request body media type.
    pub request_content_type: Option<String>,
    /// Request body schema.
    pub request_body: Option<Node>,
    /// Response header schema.
    pub response_headers: Option<Node>,
    /// Response body media type.
    pub response_content_type: Option<String>,
    /// Response body schema.
    pub response_body: Option<Node>,
}

/// Total schema weight allowed in the inventory, and what was refused.
#[derive(Debug)]
struct Budget {
    used: usize,
    max: usize,
}

/// Merges `new` into `into` unless the result would pass the per-schema cap or
/// the inventory budget; returns false when refused (the old schema stays).
fn merge_opt(into: &mut Option<Node>, new: Option<Node>, budget: &mut Budget) -> bool {
    let Some(n) = new else {
        return true;
    };
    let old_w = into.as_ref().map_or(0, Node::weight);
    let merged = match into.as_ref() {
        Some(cur) => merge(cur, &n),
        None => n,
    };
    let new_w = merged.weight();
    let used = budget.used - old_w.min(budget.used) + new_w;
    if new_w > MAX_SCHEMA_WEIGHT || (new_w > old_w && used > budget.max) {
        return false;
    }
    budget.used = used;
    *into = Some(merged);
    true
}

fn endpoint_weight(ep: &Endpoint) -> usize {
    let w = |n: &Option<Node>| n.as_ref().map_or(0, Node::weight);
    w(&ep.request.query)
        + w(&ep.request.headers)
        + w(&ep.request.body)
        + ep.responses
            .values()
            .map(|r| w(&r.headers) + w(&r.body))
            .sum::<usize>()
}

fn add_type(set: &mut BTreeSet<String>, t: Option<String>) {
    if let Some(t) = t {
        if set.len() < MAX_CONTENT_TYPES || set.contains(&t) {
            set.insert(t);
        }
    }
}

/// The in-memory inventory, bounded to `max_endpoints`.
#[derive(Debug)]
pub struct Inventory {
    endpoints: HashMap<(String, String), Endpoint>,
    dirty: HashSet<(String, String)>,
    max_endpoints: usize,
    budget: Budget,
}

/// Requests to one (endpoint, status) observed since the last fold, or one sample.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    /// HTTP method.
    pub method: &'a str,
    /// Path template.
    pub path: &'a str,
    /// Route name.
    pub route: &'a str,
    /// Response status.
    pub status: u16,
    /// Requests observed (0 for a sample alone: samples are counted with the rest).
    pub count: u64,
    /// Requests per authentication kind (`none`, `jwt`, `mtls`).
    pub auth: &'a [(&'static str, u64)],
    /// First and last of these requests, unix ms.
    pub first_ms: u64,
    /// See `first_ms`.
    pub last_ms: u64,
}

impl Inventory {
    /// An empty inventory holding at most `max_endpoints` endpoints and schemas
    /// of total weight `max_weight` ([`Node::weight`]).
    pub fn new(max_endpoints: usize, max_weight: usize) -> Inventory {
        Inventory {
            endpoints: HashMap::new(),
            dirty: HashSet::new(),
            max_endpoints,
            budget: Budget {
                used: 0,
                max: max_weight,
            },
        }
    }

    /// Total weight of the stored schemas.
    pub fn weight(&self) -> usize {
        self.budget.used
    }

    /// Counts `o.count` requests and merges the sample, if any. Returns `None` when the
    /// endpoint is new and the inventory is full (nothing recorded), otherwise
    /// the number of schemas of the sample refused by the weight limits.
    pub fn observe(&mut self, o: Observation<'_>, sample: Option<Sample>) -> Option<usize> {
        let key = (o.method.to_string(), o.path.to_string());
        if !self.endpoints.contains_key(&key) && self.endpoints.len() >= self.max_endpoints {
            return None;
        }
        let budget = &mut self.budget;
        let mut refused = 0usize;
        let ep = self
            .endpoints
            .entry(key.clone())
            .or_insert_with(|| Endpoint {
                method: o.method.to_string(),
                path: o.path.to_string(),
                route: o.route.to_string(),
                first_seen: o.first_ms,
                last_seen: o.last_ms,
                count: 0,
                samples: 0,
                auth: BTreeMap::new(),
                request: RequestInfo::default(),
                responses: BTreeMap::new(),
            });
        ep.count += o.count;
        ep.last_seen = ep.last_seen.max(o.last_ms);
        ep.first_seen = ep.first_seen.min(o.first_ms);
        if ep.route != o.route {
            ep.route = o.route.to_string();
        }
        for &(kind, n) in o.auth.iter().filter(|(_, n)| *n > 0) {
            *ep.auth.entry(kind.to_string()).or_default() += n;
        }
        let room = ep.responses.len() < MAX_STATUSES;
        let resp = if room || ep.responses.contains_key(&o.status) {
            let r = ep.responses.entry(o.status).or_default();
            r.count += o.count;
            Some(r)
        } else {
            None
        };
        if let Some(s) = sample {
            let mut m = |into: &mut Option<Node>, new: Option<Node>| {
                if !merge_opt(into, new, budget) {
                    refused += 1;
                }
            };
            if let Some(r) = resp {
                add_type(&mut r.content_types, s.response_content_type);
                m(&mut r.headers, s.response_headers);
                m(&mut r.body, s.response_body);
            }
            ep.samples += 1;
            add_type(&mut ep.request.content_types, s.request_content_type);
            m(&mut ep.request.query, s.query);
            m(&mut ep.request.headers, s.request_headers);
            m(&mut ep.request.body, s.request_body);
        }
        self.dirty.insert(key);
        Some(refused)
    }

    /// Number of endpoints.
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// One endpoint.
    pub fn get(&self, method: &str, path: &str) -> Option<&Endpoint> {
        self.endpoints.get(&(method.to_string(), path.to_string()))
    }

    /// All endpoints sorted by path then method.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        let mut v: Vec<Endpoint> = self.endpoints.values().cloned().collect();
        v.sort_by(|a, b| (&a.path, &a.method).cmp(&(&b.path, &b.method)));
        v
    }

    /// The endpoints changed since the last call (to be persisted).
    pub(crate) fn take_dirty(&mut self) -> Vec<Endpoint> {
        let keys: Vec<_> = self.dirty.drain().collect();
        keys.iter()
            .filter_map(|k| self.endpoints.get(k).cloned())
            .collect()
    }

    /// Marks endpoints as changed again (their write failed: written at the next flush).
    pub(crate) fn mark_dirty(&mut self, endpoints: &[Endpoint]) {
        for ep in endpoints {
            self.dirty.insert((ep.method.clone(), ep.path.clone()));
        }
    }

    /// Adds an endpoint loaded from storage, while there is room.
    pub(crate) fn insert_loaded(&mut self, ep: Endpoint) {
        if self.endpoints.len() < self.max_endpoints {
            self.budget.used += endpoint_weight(&ep);
            self.endpoints
                .insert((ep.method.clone(), ep.path.clone()), ep);
        }
    }
}
