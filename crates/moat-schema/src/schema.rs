//! The libddwaf `extract_schema` encoding.
//!
//! | node | encoding |
//! |---|---|
//! | scalar | `[t]` or `[t,{tag:value,..}]` (t: 0 invalid, 1 null, 2 bool, 4 integer, 8 string, 16 real) |
//! | array | `[[child, ..], {"len": N}]` plus `"truncated": true` when N > 10 |
//! | record | `[{"key": child, ..}]` plus a second `{"truncated": true}` when it has > 255 entries |
//!
//! Array children are a set (identical schemas once). Limits: 18 nested
//! containers, the first 10 array elements, the first 255 record entries; empty
//! keys are skipped and the first of duplicate keys wins. Strings are passed to
//! the [scanners](crate::scanner) with the key they sit under (array elements
//! inherit their parent's key). Output order is canonical: record keys sorted,
//! array children in the derived [`Ord`] of [`Node`].
//!
//! JSON is turned into a schema while it is parsed ([`from_json`]): no value
//! tree is built and values are never stored, only their types and tags.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

use crate::scanner::{Scanners, Tags};

/// Nesting depth the root is generated with (`max_container_depth`).
pub const MAX_CONTAINER_DEPTH: usize = 18;
/// Array elements examined (`max_array_nodes`).
pub const MAX_ARRAY_NODES: usize = 10;
/// Record entries examined (`max_record_nodes`).
pub const MAX_RECORD_NODES: usize = 255;

/// Scalar type codes.
pub mod code {
    /// An invalid or unknown object.
    pub const INVALID: u8 = 0;
    /// `null`.
    pub const NULL: u8 = 1;
    /// `true` / `false`.
    pub const BOOLEAN: u8 = 2;
    /// Signed or unsigned integer.
    pub const INTEGER: u8 = 4;
    /// Any string.
    pub const STRING: u8 = 8;
    /// Floating point number.
    pub const REAL: u8 = 16;
}

/// One schema node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Node {
    /// A scalar with its type code and, for strings, the tags of the scanner that matched.
    Scalar {
        /// Type code (see [`code`]).
        ty: u8,
        /// Scanner tags, when one matched.
        tags: Option<Tags>,
    },
    /// An array: the set of distinct child schemas, the original length, and whether
    /// elements were left unexamined (len > 10).
    Array {
        /// Distinct schemas of the examined elements.
        children: BTreeSet<Node>,
        /// Original number of elements.
        len: u64,
        /// `len > 10`.
        truncated: bool,
    },
    /// A record (map): schema per key, and whether entries were left unexamined (> 255).
    Record {
        /// Schema per key.
        entries: BTreeMap<String, Node>,
        /// More than 255 entries.
        truncated: bool,
    },
}

impl Node {
    /// A scalar without tags.
    pub fn scalar(ty: u8) -> Node {
        Node::Scalar { ty, tags: None }
    }

    /// The compact JSON encoding.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "[0]".into())
    }

    /// Parses the JSON encoding back (used to reload a persisted inventory).
    pub fn from_value(v: &serde_json::Value) -> Option<Node> {
        let arr = v.as_array()?;
        match arr.first()? {
            serde_json::Value::Number(n) => {
                let ty = u8::try_from(n.as_u64()?).ok()?;
                let tags = match arr.get(1) {
                    Some(serde_json::Value::Object(m)) => Some(
                        m.iter()
                            .map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                            .collect::<Option<Tags>>()?,
                    ),
                    None => None,
                    Some(_) => return None,
                };
                Some(Node::Scalar { ty, tags })
            }
            serde_json::Value::Array(children) => {
                let meta = arr.get(1)?.as_object()?;
                Some(Node::Array {
                    children: children
                        .iter()
                        .map(Node::from_value)
                        .collect::<Option<_>>()?,
                    len: meta.get("len")?.as_u64()?,
                    truncated: meta.get("truncated").and_then(|t| t.as_bool()) == Some(true),
                })
            }
            serde_json::Value::Object(m) => Some(Node::Record {
                entries: m
                    .iter()
                    .map(|(k, v)| Some((k.clone(), Node::from_value(v)?)))
                    .collect::<Option<_>>()?,
                truncated: arr
                    .get(1)
                    .and_then(|t| t.get("truncated"))
                    .and_then(|t| t.as_bool())
                    == Some(true),
            }),
            _ => None,
        }
    }

    /// Memory weight of the schema: one per node plus one per 64 bytes of record keys.
    /// The inventory budgets schemas by it.
    pub fn weight(&self) -> usize {
        match self {
            Node::Scalar { .. } => 1,
            Node::Array { children, .. } => 1 + children.iter().map(Node::weight).sum::<usize>(),
            Node::Record { entries, .. } => {
                1 + entries
                    .iter()
                    .map(|(k, v)| k.len() / 64 + v.weight())
                    .sum::<usize>()
            }
        }
    }

    /// Calls `f(path, tags)` for every tagged scalar; `path` is a JSON-pointer-like
    /// path where array elements appear as `[]`.
    pub fn visit_tagged(&self, path: &mut String, f: &mut dyn FnMut(&str, &Tags)) {
        match self {
            Node::Scalar { tags: Some(t), .. } => f(path, t),
            Node::Scalar { .. } => {}
            Node::Array { children, .. } => {
                let n = path.len();
                path.push_str("/[]");
                for c in children {
                    c.visit_tagged(path, f);
                }
                path.truncate(n);
            }
            Node::Record { entries, .. } => {
                for (k, c) in entries {
                    let n = path.len();
                    path.push('/');
                    path.push_str(k);
                    c.visit_tagged(path, f);
                    path.truncate(n);
                }
            }
        }
    }
}

impl Serialize for Node {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Node::Scalar { ty, tags } => {
                let mut seq = s.serialize_seq(Some(if tags.is_some() { 2 } else { 1 }))?;
                seq.serialize_element(ty)?;
                if let Some(t) = tags {
                    seq.serialize_element(t)?;
                }
                seq.end()
            }
            Node::Array {
                children,
                len,
                truncated,
            } => {
                let mut seq = s.serialize_seq(Some(2))?;
                seq.serialize_element(&Children(children))?;
                seq.serialize_element(&ArrayMeta {
                    len: *len,
                    truncated: *truncated,
                })?;
                seq.end()
            }
            Node::Record { entries, truncated } => {
                let mut seq = s.serialize_seq(Some(if *truncated { 2 } else { 1 }))?;
                seq.serialize_element(entries)?;
                if *truncated {
                    seq.serialize_element(&Truncated)?;
                }
                seq.end()
            }
        }
    }
}

struct Children<'a>(&'a BTreeSet<Node>);
impl Serialize for Children<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter())
    }
}

struct ArrayMeta {
    len: u64,
    truncated: bool,
}
impl Serialize for ArrayMeta {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(if self.truncated { 2 } else { 1 }))?;
        m.serialize_entry("len", &self.len)?;
        if self.truncated {
            m.serialize_entry("truncated", &true)?;
        }
        m.end()
    }
}

struct Truncated;
impl Serialize for Truncated {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry("truncated", &true)?;
        m.end()
    }
}

/// Builds a schema from a JSON document while parsing it. Returns `None` when
/// the bytes are not valid JSON (or nest deeper than the parser's 128 levels).
pub fn from_json(bytes: &[u8], scanners: &Scanners) -> Option<Node> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let node = Gen {
        key: None,
        depth: MAX_CONTAINER_DEPTH,
        scanners,
    }
    .deserialize(&mut de)
    .ok()?;
    de.end().ok()?;
    Some(node)
}

/// Builds the schema of an already parsed JSON value.
pub fn from_value(v: &serde_json::Value, scanners: &Scanners) -> Node {
    gen_value(v, None, MAX_CONTAINER_DEPTH, scanners)
}

fn gen_value(v: &serde_json::Value, key: Option<&str>, depth: usize, sc: &Scanners) -> Node {
    use serde_json::Value as V;
    match v {
        V::Null => Node::scalar(code::NULL),
        V::Bool(_) => Node::scalar(code::BOOLEAN),
        V::Number(n) if n.is_f64() => Node::scalar(code::REAL),
        V::Number(_) => Node::scalar(code::INTEGER),
        V::String(s) => string_node(key, s, sc),
        V::Array(a) => {
            let mut children = BTreeSet::new();
            if depth > 1 {
                for c in a.iter().take(MAX_ARRAY_NODES) {
                    children.insert(gen_value(c, key, depth - 1, sc));
                }
            }
            Node::Array {
                children,
                len: a.len() as u64,
                truncated: a.len() > MAX_ARRAY_NODES,
            }
        }
        V::Object(m) => {
            let mut entries = BTreeMap::new();
            if depth > 1 {
                for (k, c) in m.iter().take(MAX_RECORD_NODES) {
                    if !k.is_empty() && !entries.contains_key(k) {
                        entries.insert(k.clone(), gen_value(c, Some(k), depth - 1, sc));
                    }
                }
            }
            Node::Record {
                entries,
                truncated: m.len() > MAX_RECORD_NODES,
            }
        }
    }
}

/// The schema of a string under `key` (scanned).
pub fn string_node(key: Option<&str>, value: &str, scanners: &Scanners) -> Node {
    Node::Scalar {
        ty: code::STRING,
        tags: scanners.scan(key, value).cloned(),
    }
}

/// Builds a record of `key -> [values]` (query strings, forms), as tracers pass
/// `server.request.query`: each key maps to the array of its values.
pub fn from_multimap<'a, I>(pairs: I, scanners: &Scanners) -> Node
where
    I: IntoIterator<Item = (&'a str, &'a str)>,
{
    let mut grouped: Vec<(&str, Vec<&str>)> = Vec::new();
    let mut total = 0usize;
    for (k, v) in pairs {
        match grouped.iter_mut().find(|(gk, _)| *gk == k) {
            Some((_, vals)) => vals.push(v),
            None => {
                total += 1;
                grouped.push((k, vec![v]));
            }
        }
        if total > 4 * MAX_RECORD_NODES {
            break;
        }
    }
    let mut entries = BTreeMap::new();
    for (k, vals) in grouped.iter().take(MAX_RECORD_NODES) {
        if k.is_empty() {
            continue;
        }
        let children = vals
            .iter()
            .take(MAX_ARRAY_NODES)
            .map(|v| string_node(Some(k), v, scanners))
            .collect();
        entries.insert(
            (*k).to_string(),
            Node::Array {
                children,
                len: vals.len() as u64,
                truncated: vals.len() > MAX_ARRAY_NODES,
            },
        );
    }
    Node::Record {
        entries,
        truncated: grouped.len() > MAX_RECORD_NODES,
    }
}

/// Builds a record of `name -> string` (headers: the last value of a repeated header wins
/// only in type, which is always string; tags come from the first value).
pub fn from_string_map<'a, I>(pairs: I, scanners: &Scanners) -> Node
where
    I: IntoIterator<Item = (&'a str, &'a str)>,
{
    let mut entries = BTreeMap::new();
    let mut n = 0usize;
    for (k, v) in pairs {
        n += 1;
        if n > MAX_RECORD_NODES || k.is_empty() || entries.contains_key(k) {
            continue;
        }
        entries.insert(k.to_string(), string_node(Some(k), v, scanners));
    }
    Node::Record {
        entries,
        truncated: n > MAX_RECORD_NODES,
    }
}

/// Streaming generator: a `DeserializeSeed` that turns JSON into a [`Node`].
struct Gen<'s> {
    key: Option<&'s str>,
    depth: usize,
    scanners: &'s Scanners,
}

impl<'de> DeserializeSeed<'de> for Gen<'_> {
    type Value = Node;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Gen<'_> {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::scalar(code::NULL))
    }
    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::scalar(code::NULL))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Node, E> {
        Ok(Node::scalar(code::BOOLEAN))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Node, E> {
        Ok(Node::scalar(code::INTEGER))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Node, E> {
        Ok(Node::scalar(code::INTEGER))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Node, E> {
        Ok(Node::scalar(code::REAL))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        Ok(string_node(self.key, v, self.scanners))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut children = BTreeSet::new();
        let mut len = 0u64;
        loop {
            if self.depth > 1 && (len as usize) < MAX_ARRAY_NODES {
                let seed = Gen {
                    key: self.key,
                    depth: self.depth - 1,
                    scanners: self.scanners,
                };
                match seq.next_element_seed(seed)? {
                    Some(n) => {
                        children.insert(n);
                    }
                    None => break,
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
            len += 1;
        }
        Ok(Node::Array {
            children,
            len,
            truncated: len as usize > MAX_ARRAY_NODES,
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries: BTreeMap<String, Node> = BTreeMap::new();
        let mut n = 0usize;
        while let Some(key) = map.next_key::<KeyBuf>()? {
            let examine = self.depth > 1
                && n < MAX_RECORD_NODES
                && !key.0.is_empty()
                && !entries.contains_key(key.0.as_str());
            n += 1;
            if examine {
                let node = map.next_value_seed(Gen {
                    key: Some(&key.0),
                    depth: self.depth - 1,
                    scanners: self.scanners,
                })?;
                entries.insert(key.0, node);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Node::Record {
            entries,
            truncated: n > MAX_RECORD_NODES,
        })
    }
}

/// A map key (JSON keys are strings).
struct KeyBuf(String);

impl<'de> de::Deserialize<'de> for KeyBuf {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = KeyBuf;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyBuf, E> {
                Ok(KeyBuf(v.to_string()))
            }
        }
        d.deserialize_str(V)
    }
}

/// Merges two schemas of the same place seen in different samples.
///
/// Records take the union of their keys (merging common keys, at most 255 keys);
/// arrays the union of their children, collapsed to one child per kind, with the
/// larger `len`; a string keeps the tags seen first, or gains them; `null` gives way
/// to any other type; integer and real merge to real; other conflicts keep the
/// schema seen first.
pub fn merge(a: &Node, b: &Node) -> Node {
    match (a, b) {
        _ if a == b => a.clone(),
        (
            Node::Record {
                entries: ea,
                truncated: ta,
            },
            Node::Record {
                entries: eb,
                truncated: tb,
            },
        ) => {
            let mut entries = ea.clone();
            let mut truncated = *ta || *tb;
            for (k, v) in eb {
                let full = entries.len() >= MAX_RECORD_NODES;
                match entries.get_mut(k) {
                    Some(cur) => *cur = merge(cur, v),
                    None if !full => {
                        entries.insert(k.clone(), v.clone());
                    }
                    None => truncated = true,
                }
            }
            Node::Record { entries, truncated }
        }
        (
            Node::Array {
                children: ca,
                len: la,
                truncated: ta,
            },
            Node::Array {
                children: cb,
                len: lb,
                truncated: tb,
            },
        ) => {
            let len = (*la).max(*lb);
            Node::Array {
                children: collapse(ca.iter().chain(cb.iter())),
                len,
                truncated: *ta || *tb || len as usize > MAX_ARRAY_NODES,
            }
        }
        (Node::Scalar { ty: ta, tags: ga }, Node::Scalar { ty: tb, tags: gb }) => {
            if ta == tb {
                Node::Scalar {
                    ty: *ta,
                    tags: ga.clone().or_else(|| gb.clone()),
                }
            } else if *ta == code::NULL {
                b.clone()
            } else if *tb == code::NULL {
                a.clone()
            } else if (*ta == code::INTEGER && *tb == code::REAL)
                || (*ta == code::REAL && *tb == code::INTEGER)
            {
                Node::scalar(code::REAL)
            } else {
                a.clone()
            }
        }
        (Node::Scalar { ty, .. }, other) if *ty == code::NULL => other.clone(),
        _ => a.clone(),
    }
}

/// One child per kind: all records merged into one, all arrays into one, scalars by type.
fn collapse<'a>(nodes: impl Iterator<Item = &'a Node>) -> BTreeSet<Node> {
    let mut record: Option<Node> = None;
    let mut array: Option<Node> = None;
    let mut scalars: BTreeMap<u8, Node> = BTreeMap::new();
    for n in nodes {
        match n {
            Node::Record { .. } => record = Some(record.map_or(n.clone(), |r| merge(&r, n))),
            Node::Array { .. } => array = Some(array.map_or(n.clone(), |r| merge(&r, n))),
            Node::Scalar { ty, .. } => {
                let merged = scalars.get(ty).map_or(n.clone(), |s| merge(s, n));
                scalars.insert(*ty, merged);
            }
        }
    }
    scalars.into_values().chain(record).chain(array).collect()
}
