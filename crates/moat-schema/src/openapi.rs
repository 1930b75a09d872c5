//! OpenAPI 3.1 export of the inventory.

use serde_json::{json, Map, Value};

use crate::inventory::Endpoint;
use crate::schema::{code, Node};

/// Request headers left out of operation parameters (OpenAPI ignores the first three;
/// the others are transport details).
const SKIP_REQUEST_HEADERS: &[&str] = &[
    "accept",
    "content-type",
    "authorization",
    "host",
    "content-length",
    "connection",
    "transfer-encoding",
    "cookie",
    "te",
    "upgrade",
];
const SKIP_RESPONSE_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "date",
    "connection",
    "transfer-encoding",
    "set-cookie",
];

/// JSON Schema (2020-12, as OpenAPI 3.1 uses) of a schema node. Scanner tags
/// become `x-moat-sensitive`.
pub fn json_schema(node: &Node) -> Value {
    match node {
        Node::Scalar { ty, tags } => {
            let mut m = Map::new();
            let t = match *ty {
                code::NULL => Some("null"),
                code::BOOLEAN => Some("boolean"),
                code::INTEGER => Some("integer"),
                code::STRING => Some("string"),
                code::REAL => Some("number"),
                _ => None,
            };
            if let Some(t) = t {
                m.insert("type".into(), t.into());
            }
            if let Some(tags) = tags {
                if tags.get("type").map(String::as_str) == Some("email") {
                    m.insert("format".into(), "email".into());
                }
                m.insert("x-moat-sensitive".into(), json!(tags));
            }
            Value::Object(m)
        }
        Node::Array { children, .. } => {
            let items: Vec<Value> = children.iter().map(json_schema).collect();
            let items = match items.len() {
                0 => json!({}),
                1 => items.into_iter().next().unwrap_or_default(),
                _ => json!({ "oneOf": items }),
            };
            json!({ "type": "array", "items": items })
        }
        Node::Record { entries, .. } => {
            let props: Map<String, Value> = entries
                .iter()
                .map(|(k, v)| (k.clone(), json_schema(v)))
                .collect();
            json!({ "type": "object", "properties": props })
        }
    }
}

/// Schema of one query parameter: its values' schema, or an array when it repeats.
fn param_schema(node: &Node) -> Value {
    match node {
        Node::Array { children, len, .. } if *len <= 1 && children.len() == 1 => {
            children.iter().next().map(json_schema).unwrap_or_default()
        }
        other => json_schema(other),
    }
}

fn record_entries(node: &Option<Node>) -> Vec<(&String, &Node)> {
    match node {
        Some(Node::Record { entries, .. }) => entries.iter().collect(),
        _ => Vec::new(),
    }
}

fn operation(ep: &Endpoint) -> Value {
    let mut params = Vec::new();
    for seg in ep.path.split('/') {
        if let Some(name) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            params.push(
                json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}),
            );
        }
    }
    for (name, node) in record_entries(&ep.request.query) {
        params.push(json!({"name": name, "in": "query", "schema": param_schema(node)}));
    }
    for (name, node) in record_entries(&ep.request.headers) {
        if !SKIP_REQUEST_HEADERS.contains(&name.as_str()) {
            params.push(json!({"name": name, "in": "header", "schema": json_schema(node)}));
        }
    }
    let mut op = Map::new();
    op.insert(
        "summary".into(),
        format!("{} {}", ep.method.to_uppercase(), ep.path).into(),
    );
    op.insert("x-moat-route".into(), ep.route.clone().into());
    op.insert("x-moat-count".into(), ep.count.into());
    op.insert("x-moat-first-seen".into(), ep.first_seen.into());
    op.insert("x-moat-last-seen".into(), ep.last_seen.into());
    if !params.is_empty() {
        op.insert("parameters".into(), Value::Array(params));
    }
    if !ep.request.content_types.is_empty() || ep.request.body.is_some() {
        let mut content = Map::new();
        let types: Vec<String> = if ep.request.content_types.is_empty() {
            vec!["application/json".into()]
        } else {
            ep.request.content_types.iter().cloned().collect()
        };
        for t in types {
            let schema = match &ep.request.body {
                Some(b) if t.contains("json") || t == "application/x-www-form-urlencoded" => {
                    if t == "application/x-www-form-urlencoded" {
                        form_schema(b)
                    } else {
                        json_schema(b)
                    }
                }
                _ => json!({}),
            };
            content.insert(t, json!({ "schema": schema }));
        }
        op.insert("requestBody".into(), json!({ "content": content }));
    }
    let mut responses = Map::new();
    for (status, r) in &ep.responses {
        let mut resp = Map::new();
        resp.insert(
            "description".into(),
            format!("Seen {} time(s)", r.count).into(),
        );
        let headers: Map<String, Value> = record_entries(&r.headers)
            .into_iter()
            .filter(|(n, _)| !SKIP_RESPONSE_HEADERS.contains(&n.as_str()))
            .map(|(n, s)| (n.clone(), json!({ "schema": json_schema(s) })))
            .collect();
        if !headers.is_empty() {
            resp.insert("headers".into(), Value::Object(headers));
        }
        if !r.content_types.is_empty() {
            let content: Map<String, Value> = r
                .content_types
                .iter()
                .map(|t| {
                    let schema = match &r.body {
                        Some(b) if t.contains("json") => json_schema(b),
                        _ => json!({}),
                    };
                    (t.clone(), json!({ "schema": schema }))
                })
                .collect();
            resp.insert("content".into(), Value::Object(content));
        }
        responses.insert(status.to_string(), Value::Object(resp));
    }
    if responses.is_empty() {
        responses.insert("default".into(), json!({"description": "No response seen"}));
    }
    op.insert("responses".into(), Value::Object(responses));
    let mut security = Vec::new();
    if ep.auth.contains_key("jwt") {
        security.push(json!({ "bearerAuth": [] }));
    }
    if ep.auth.contains_key("mtls") {
        security.push(json!({ "mutualTLS": [] }));
    }
    if !security.is_empty() {
        if ep.auth.contains_key("none") {
            security.push(json!({}));
        }
        op.insert("security".into(), Value::Array(security));
    }
    Value::Object(op)
}

/// A form body is `{key: [values]}`; OpenAPI describes each field by its values' schema.
fn form_schema(node: &Node) -> Value {
    match node {
        Node::Record { entries, .. } => {
            let props: Map<String, Value> = entries
                .iter()
                .map(|(k, v)| (k.clone(), param_schema(v)))
                .collect();
            json!({ "type": "object", "properties": props })
        }
        other => json_schema(other),
    }
}

/// The OpenAPI 3.1 document of the inventory.
pub fn openapi(endpoints: &[Endpoint], title: &str) -> Value {
    let mut paths: Map<String, Value> = Map::new();
    let mut uses_jwt = false;
    let mut uses_mtls = false;
    for ep in endpoints {
        uses_jwt |= ep.auth.contains_key("jwt");
        uses_mtls |= ep.auth.contains_key("mtls");
        let item = paths
            .entry(ep.path.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(obj) = item.as_object_mut() {
            obj.insert(ep.method.to_ascii_lowercase(), operation(ep));
        }
    }
    let mut schemes = Map::new();
    if uses_jwt {
        schemes.insert(
            "bearerAuth".into(),
            json!({"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}),
        );
    }
    if uses_mtls {
        schemes.insert("mutualTLS".into(), json!({"type": "mutualTLS"}));
    }
    let mut doc = json!({
        "openapi": "3.1.0",
        "info": {
            "title": title,
            "version": "discovered",
            "description": "API inventory discovered by moat from observed traffic. Schemas hold types and sensitive-data tags only, never values.",
        },
        "paths": paths,
    });
    if !schemes.is_empty() {
        doc["components"] = json!({ "securitySchemes": schemes });
    }
    doc
}
