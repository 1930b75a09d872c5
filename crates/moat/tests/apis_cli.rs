//! `moat apis` against an inventory database written by moat-inventory's store.
// Test helpers: a failed setup step is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::Command;

use moat_inventory::InventoryStore;
use moat_schema::inventory::{RequestInfo, ResponseInfo};
use moat_schema::{from_json, Endpoint, Scanners};

fn moat(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(args)
        .output()
        .expect("run moat");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn endpoint(method: &str, path: &str, request_body: Option<&[u8]>) -> Endpoint {
    let sc = Scanners::builtin();
    let mut responses = BTreeMap::new();
    responses.insert(
        200,
        ResponseInfo {
            count: 3,
            content_types: ["application/json".to_string()].into(),
            headers: None,
            body: from_json(br#"{"id":1,"email":"x@y.io"}"#, &sc),
        },
    );
    Endpoint {
        method: method.into(),
        path: path.into(),
        route: "api".into(),
        first_seen: 1_700_000_000_000,
        last_seen: 1_700_000_100_000,
        count: 3,
        samples: 1,
        auth: [("none".to_string(), 3)].into(),
        request: RequestInfo {
            content_types: request_body
                .map(|_| ["application/json".to_string()].into())
                .unwrap_or_default(),
            query: None,
            headers: None,
            body: request_body.and_then(|b| from_json(b, &sc)),
        },
        responses,
    }
}

#[test]
fn export_openapi_and_list() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("moat-apis.db");
    InventoryStore::open(&db)
        .unwrap()
        .save(&[
            endpoint("POST", "/users", Some(br#"{"name":"a"}"#)),
            endpoint("GET", "/users/{id}", None),
        ])
        .unwrap();
    let db = db.to_str().unwrap();
    let out = dir.path().join("openapi.json");

    let (code, _, err) = moat(&[
        "apis",
        "export",
        "--openapi",
        out.to_str().unwrap(),
        "--db",
        db,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("2 endpoint(s)"), "{err}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["paths"]["/users"]["post"]["requestBody"].is_object());
    let get = &doc["paths"]["/users/{id}"]["get"];
    assert_eq!(get["parameters"][0]["in"], "path");
    assert_eq!(
        get["responses"]["200"]["content"]["application/json"]["schema"]["properties"]["email"]
            ["x-moat-sensitive"]["type"],
        "email"
    );

    let (code, text, _) = moat(&["apis", "list", "--db", db]);
    assert_eq!(code, 0);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].starts_with("METHOD"));
    assert!(
        text.contains("/users/{id}") && text.contains("email"),
        "{text}"
    );

    let (code, json, _) = moat(&["apis", "list", "--db", db, "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["count"], 2);

    let (code, _, err) = moat(&[
        "apis",
        "list",
        "--db",
        dir.path().join("nope.db").to_str().unwrap(),
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("nope.db"), "{err}");
}
