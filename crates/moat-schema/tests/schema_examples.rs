//! Every worked example of shared/docs/api-schema-encoding.md, compared
//! order-insensitively (arrays as multisets), as libddwaf's tests do.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use moat_schema::scanner::{Scanner, Scanners};
use moat_schema::schema::{self, code, from_json, merge, Node};
use serde_json::{json, Value};

/// Sorts every array by its serialized form, recursively: equal results mean
/// equal up to the order of array elements.
fn canon(v: &Value) -> Value {
    match v {
        Value::Array(a) => {
            let mut items: Vec<Value> = a.iter().map(canon).collect();
            items.sort_by_key(|x| x.to_string());
            Value::Array(items)
        }
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), canon(v))).collect()),
        other => other.clone(),
    }
}

fn check(input: &str, expected: &str, scanners: &Scanners) {
    let node = from_json(input.as_bytes(), scanners).expect("valid JSON");
    let got: Value = serde_json::from_str(&node.to_json()).unwrap();
    let want: Value = serde_json::from_str(expected).unwrap();
    assert_eq!(
        canon(&got),
        canon(&want),
        "input {input}\n got  {got}\n want {want}"
    );
    // The encoding parses back to the same node.
    assert_eq!(Node::from_value(&got), Some(node.clone()));
    // The parsed-value path gives the same schema as the streaming one
    // (inputs without duplicate keys).
    if let Ok(v) = serde_json::from_str::<Value>(input) {
        if !input.contains("\"child\"") {
            assert_eq!(schema::from_value(&v, scanners), node);
        }
    }
}

#[test]
fn example_1_map() {
    let sc = Scanners::none();
    // `invalid` has no JSON form: build it in and check it encodes as [0].
    let mut node = from_json(
        br#"{"unsigned":22,"string":"string","null":null,"map":{"unsigned":5,"string":"str"},"array":[-5]}"#,
        &sc,
    )
    .unwrap();
    if let Node::Record { entries, .. } = &mut node {
        entries.insert("invalid".into(), Node::scalar(code::INVALID));
    }
    let got: Value = serde_json::from_str(&node.to_json()).unwrap();
    let want: Value = serde_json::from_str(
        r#"[{"array":[[[4]],{"len":1}],"invalid":[0],"map":[{"unsigned":[4],"string":[8]}],"null":[1],"string":[8],"unsigned":[4]}]"#,
    )
    .unwrap();
    assert_eq!(canon(&got), canon(&want));
    // Canonical output: keys sorted.
    assert_eq!(
        node.to_json(),
        r#"[{"array":[[[4]],{"len":1}],"invalid":[0],"map":[{"string":[8],"unsigned":[4]}],"null":[1],"string":[8],"unsigned":[4]}]"#
    );
}

#[test]
fn example_2_array_with_duplicate_maps() {
    check(
        r#"[{"unsigned":5,"string":"str"},{"signed":-5},{"unsigned":5},{"unsigned":109,"string":"wahtever"}]"#,
        r#"[[[{"unsigned":[4]}],[{"signed":[4]}],[{"string":[8],"unsigned":[4]}]],{"len":4}]"#,
        &Scanners::none(),
    );
}

#[test]
fn example_3_mixed_containers() {
    check(
        r#"[{"unsigned":5,"string":"str"},[-5],[5],{"string":"wahtever","unsigned":109}]"#,
        r#"[[[[[4]],{"len":1}],[{"string":[8],"unsigned":[4]}]],{"len":4}]"#,
        &Scanners::none(),
    );
}

#[test]
fn example_4_truncation() {
    let arrays = format!("[{}]", vec!["[]"; 20].join(","));
    check(
        &arrays,
        r#"[[[[],{"len":0}]],{"len":20,"truncated":true}]"#,
        &Scanners::none(),
    );
    let map = format!("{{{}}}", vec![r#""child":[]"#; 265].join(","));
    check(
        &map,
        r#"[{"child":[[],{"len":0}]},{"truncated":true}]"#,
        &Scanners::none(),
    );
}

#[test]
fn record_limit_examines_first_255_and_first_duplicate_wins() {
    let mut members: Vec<String> = (0..300).map(|i| format!(r#""k{i}":{i}"#)).collect();
    members.insert(0, r#""dup":"first""#.into());
    members.insert(1, r#""dup":1"#.into());
    let node = from_json(
        format!("{{{}}}", members.join(",")).as_bytes(),
        &Scanners::none(),
    )
    .unwrap();
    let Node::Record { entries, truncated } = node else {
        panic!("record expected")
    };
    assert!(truncated);
    // 255 entries examined: dup (twice) + k0..k252.
    assert_eq!(entries.len(), 254);
    assert_eq!(entries["dup"], Node::scalar(code::STRING));
    assert!(entries.contains_key("k252") && !entries.contains_key("k253"));
    // Empty keys are skipped.
    let node = from_json(br#"{"":1,"a":2}"#, &Scanners::none()).unwrap();
    assert_eq!(node.to_json(), r#"[{"a":[4]}]"#);
}

#[test]
fn depth_limit() {
    let doc = format!("{}{}", "[".repeat(20), "]".repeat(20));
    let node = from_json(doc.as_bytes(), &Scanners::none()).unwrap();
    // Levels 1..17 show their child; level 18 shows its len only.
    let mut want = json!([[], {"len": 1}]);
    for _ in 0..17 {
        want = json!([[want], {"len": 1}]);
    }
    let got: Value = serde_json::from_str(&node.to_json()).unwrap();
    assert_eq!(got, want);
    // The same with records.
    let doc = format!("{}1{}", r#"{"a":"#.repeat(20), "}".repeat(20));
    let node = from_json(doc.as_bytes(), &Scanners::none()).unwrap();
    let mut want = json!([{}]);
    for _ in 0..17 {
        want = json!([{ "a": want }]);
    }
    assert_eq!(
        serde_json::from_str::<Value>(&node.to_json()).unwrap(),
        want
    );
}

#[test]
fn example_5_pii_scanner() {
    check(
        r#"{"email":"data@datadoghq.com"}"#,
        r#"[{"email":[8,{"category":"pii","type":"email"}]}]"#,
        &Scanners::builtin(),
    );
    // Unit SchemaWithScannerArrayWithKey: array elements inherit the parent key.
    let custom = Scanners::from_list(vec![Scanner::new(
        "test",
        Some(r"^string$"),
        Some(r"^string$"),
        &[("category", "IP"), ("type", "PII")],
    )
    .unwrap()]);
    check(
        r#"{"string":["string"]}"#,
        r#"[{"string":[[[8,{"category":"IP","type":"PII"}]],{"len":1}]}]"#,
        &custom,
    );
    // SchemaWithScannerSingleValueNoKey: a root string has no key, the key matcher fails.
    check(r#""string""#, "[8]", &custom);
}

#[test]
fn example_6_scalars_and_word_boundaries() {
    check(
        r#"{"email":"jane.doe@example.com","user_email":"jane.doe@example.com","name":"Jane","age":34,"score":9.5,"admin":false,"manager":null,"tags":["a","b","a"]}"#,
        r#"[{"admin":[2],"age":[4],"email":[8,{"category":"pii","type":"email"}],"manager":[1],"name":[8],"score":[16],"tags":[[[8]],{"len":3}],"user_email":[8]}]"#,
        &Scanners::builtin(),
    );
}

#[test]
fn example_7_card_and_truncated_items() {
    let items: Vec<String> = (0..12)
        .map(|i| format!(r#"{{"sku":"x","qty":{i},"price":1.5}}"#))
        .collect();
    check(
        &format!(
            r#"{{"order_id":"A-1","card":"4111111111111111","card_number":"4111111111111111","items":[{}]}}"#,
            items.join(",")
        ),
        r#"[{"card":[8,{"card_type":"visa","category":"payment","type":"card"}],"card_number":[8],"items":[[[{"price":[16],"qty":[4],"sku":[8]}]],{"len":12,"truncated":true}],"order_id":[8]}]"#,
        &Scanners::builtin(),
    );
}

#[test]
fn example_8_headers() {
    check(
        r#"{"authorization":"Bearer eyJhbGciOi.abcdEFGH","content-type":"application/json","x-request-id":"123"}"#,
        r#"[{"authorization":[8,{"category":"credentials","type":"bearer_token"}],"content-type":[8],"x-request-id":[8]}]"#,
        &Scanners::builtin(),
    );
    // The header path (name -> string) gives the same schema.
    let node = schema::from_string_map(
        [
            ("authorization", "Bearer eyJhbGciOi.abcdEFGH"),
            ("content-type", "application/json"),
            ("x-request-id", "123"),
        ],
        &Scanners::builtin(),
    );
    assert_eq!(
        node.to_json(),
        r#"[{"authorization":[8,{"category":"credentials","type":"bearer_token"}],"content-type":[8],"x-request-id":[8]}]"#
    );
}

#[test]
fn example_9_heterogeneous_array() {
    check(
        r#"{"values":[1,"two",3.0,null,true,[1,2],{"k":"v"},{"k":"w"}]}"#,
        r#"[{"values":[[[4],[8],[16],[1],[2],[[[4]],{"len":2}],[{"k":[8]}]],{"len":8}]}]"#,
        &Scanners::builtin(),
    );
}

#[test]
fn example_10_root_array_with_vin() {
    check(
        r#"[{"id":1,"vin":"1HGCM82633A004352"},{"id":2,"vin":"1HGCM82633A004352","note":"x"}]"#,
        r#"[[[{"id":[4],"vin":[8,{"category":"pii","type":"vin"}]}],[{"id":[4],"note":[8],"vin":[8,{"category":"pii","type":"vin"}]}]],{"len":2}]"#,
        &Scanners::builtin(),
    );
}

#[test]
fn invalid_json_gives_none_and_hostile_input_is_bounded() {
    let sc = Scanners::builtin();
    assert!(from_json(b"{\"a\":", &sc).is_none());
    assert!(from_json(b"{} trailing", &sc).is_none());
    assert!(from_json(b"", &sc).is_none());
    // 100k levels: past depth 18 values are skipped, not recursed into; no stack overflow.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let node = from_json(deep.as_bytes(), &sc).unwrap();
    assert_eq!(node.to_json().matches("len").count(), 18);
    // A huge flat array is counted, not stored.
    let big = format!("[{}]", vec!["1"; 100_000].join(","));
    assert_eq!(
        from_json(big.as_bytes(), &sc).unwrap().to_json(),
        r#"[[[4]],{"len":100000,"truncated":true}]"#
    );
}

#[test]
fn query_strings_map_keys_to_value_arrays() {
    let node = schema::from_multimap(
        [("id", "1"), ("tag", "a"), ("tag", "b"), ("email", "a@b.io")],
        &Scanners::builtin(),
    );
    assert_eq!(
        node.to_json(),
        r#"[{"email":[[[8,{"category":"pii","type":"email"}]],{"len":1}],"id":[[[8]],{"len":1}],"tag":[[[8]],{"len":2}]}]"#
    );
}

#[test]
fn merging_samples() {
    let sc = Scanners::builtin();
    let a = from_json(br#"{"id":1,"name":"x","tags":["a"],"extra":null}"#, &sc).unwrap();
    let b = from_json(
        br#"{"id":2.5,"email":"a@b.io","tags":[1,2],"extra":{"k":true}}"#,
        &sc,
    )
    .unwrap();
    let m = merge(&a, &b);
    assert_eq!(
        m.to_json(),
        r#"[{"email":[8,{"category":"pii","type":"email"}],"extra":[{"k":[2]}],"id":[16],"name":[8],"tags":[[[4],[8]],{"len":2}]}]"#
    );
    assert_eq!(merge(&m, &m), m);
}
