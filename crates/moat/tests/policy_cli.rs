//! `moat policy check` through the real binary: outputs, exit codes, defaults, errors.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

/// RS256 token (iss https://issuer.example.com, sub alice, aud shop, exp 2100-01-01)
/// signed offline with the test key whose public JWK is in `JWKS`.
const TOKEN: &str = "eyJhbGciOiJSUzI1NiIsImtpZCI6ImNsaSIsInR5cCI6IkpXVCJ9.eyJpc3MiOiJodHRwczovL2lzc3Vlci5leGFtcGxlLmNvbSIsInN1YiI6ImFsaWNlIiwiYXVkIjoic2hvcCIsImdyb3VwcyI6WyJhZG1pbnMiXSwiZXhwIjo0MTAyNDQ0ODAwfQ.nOSkbTlruaTAXAPoMGGrZqE90-0E7EszgEXGktEUA8fwmq3IVbgU8cKJB4RnjIFwSQbBiLCnnXP7xpfNDSdBEto7R-k_miRn2qcHSLW2nAjs_Q3NvNyb-B8syYyNTSOrJYOIj90MykmRyrNUjCDGjgHe-y1vT_j5Zpd8qID0I_hc88aCt36EwYm1s4z5mGVuwgRQGxiM2GTH93AJkMmkcglk9dC0HybJ5vsya30HUB1EvEmLmfUwNimPK_XJfHPffc5j85RR6PfI4WNekI8FFmROB9cYZoVj-F1ib8TThrqW-dQ-HDsO2j0kcEJRBLj57adIeahFWev1SlWWbuUatg";
/// Same key, `exp` in 1970.
const EXPIRED: &str = "eyJhbGciOiJSUzI1NiIsImtpZCI6ImNsaSIsInR5cCI6IkpXVCJ9.eyJpc3MiOiJodHRwczovL2lzc3Vlci5leGFtcGxlLmNvbSIsInN1YiI6ImFsaWNlIiwiZXhwIjoxMDAwfQ.zkmav4l22-Avd-C55JUTblgUPiEek3GajnQ99e28UMRlcUX_JdJpbfAlBFDCaEOB18ZJLG1q2KEC-PtlOO-_g12geC714fyIotDgL12EQR8LGSq91BphsZHRCV1yWADiFMjoZX4IE9BtsPJIhiYNINXvEDZOOhfi1WcbGKFMK1K9Jb_83ovqCberk5F1zIYZsyJ3qdMNolGUkkB6uXygaTIz5KMaSiy8wAas7ZL6AnaFy9xKsflfcU0wjjFD3rBNipTuAAA6aIlLshYjIoaLY9eqGlfwoQfLi9qdZvzAqeyPBFajdPt5taMHdbW_QsG9PMUAVyWHbcVBWukZQy1j9w";
const JWKS: &str = r#"{"keys":[{"kty":"RSA","kid":"cli","use":"sig","alg":"RS256","n":"z8ycRGhM3Qofz25rqrz2QteN4MjhJFYtxYHss0i0ZBXvA2PunRp5Lf4GlghI2CWzeWcUIp52G7EIsULwdn4XQOrRY8mzvhbS5uM5F6zmBl6Rs_6yYhQV8Y9JdQKQo29obOQPFzk3KJ3a-_wS1GE4IeLzJnhOV2g6T3JEzMs_ZoZb1acSX0PeKOvnOtyH4Y_Tk3NaJ2gDUw68dWhsliPCp74zLDcu1ROhXHdZWPJ8uja3AK7OrrNAWB55_-QsaiBkexuVHv6U7w9ltbLN9b5E4hEutmL1vabfmG_uVXzDct659F1VwhR2iKu6uvML6JJI9PveKo7z7WY-vMl4wYt-bw","e":"AQAB"}]}"#;

const POLICIES: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-admin, namespace: istio-system}
spec:
  action: DENY
  rules:
  - to: [{operation: {paths: ["/admin*"]}}]
    when: [{key: "request.headers[x-break-glass]", notValues: ["yes"]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: web, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  action: ALLOW
  rules:
  - to: [{operation: {methods: ["GET"], paths: ["/public/*"]}}]
  - from: [{source: {principals: ["cluster.local/ns/shop/sa/frontend"]}}]
  - from: [{source: {requestPrincipals: ["https://issuer.example.com/alice"]}}]
    when: [{key: "request.auth.claims[groups]", values: ["admins"]}]
  - from: [{source: {remoteIpBlocks: ["203.0.113.0/24"]}}]
    to: [{operation: {ports: ["8443"]}}]
  - when: [{key: connection.sni, values: ["internal.shop"]}]
  - when: [{key: destination.ip, values: ["10.9.0.0/16"]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: audit-all, namespace: shop}
spec:
  action: AUDIT
  rules: [{to: [{operation: {methods: ["DELETE"]}}]}]
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: jwt, namespace: shop}
spec:
  jwtRules:
  - issuer: https://issuer.example.com
    jwksUri: file:jwks.json
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: db-strict, namespace: shop}
spec:
  selector: {matchLabels: {app: db}}
  mtls: {mode: STRICT}
"#;

fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policies.yaml"), POLICIES).unwrap();
    std::fs::write(dir.path().join("jwks.json"), JWKS).unwrap();
    dir
}

fn run(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_moat"))
        .current_dir(dir)
        .arg("policy")
        .arg("check")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(dir: &Path, args: &[&str]) -> (i32, serde_json::Value) {
    let mut a = vec!["--policies", "policies.yaml", "--json"];
    a.extend_from_slice(args);
    let (code, out, err) = run(dir, &a);
    assert!(code == 0 || code == 1, "exit {code}: {err}");
    (
        code,
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}")),
    )
}

const WEB: &[&str] = &["--namespace", "shop", "--label", "app=web"];

fn with(extra: &[&'static str]) -> Vec<&'static str> {
    let mut v = WEB.to_vec();
    v.extend_from_slice(extra);
    v
}

#[test]
fn allow_and_deny_with_policy_and_rule() {
    let d = setup();
    let (code, v) = json(
        d.path(),
        &with(&["--url", "http://web.shop/public/index.html"]),
    );
    assert_eq!(code, 0);
    assert_eq!(v["status"], 200);
    assert_eq!(v["decision"], "ALLOW");
    assert_eq!(v["policy"], "shop/web");
    assert_eq!(v["rule"], 0);
    assert_eq!(v["audit"], false);

    let (code, v) = json(
        d.path(),
        &with(&["--url", "http://web.shop/private", "--method", "POST"]),
    );
    assert_eq!(code, 1);
    assert_eq!(
        (v["status"].as_i64(), v["decision"].as_str()),
        (Some(403), Some("DENY"))
    );
    assert!(v["policy"].is_null() && v["rule"].is_null());

    let (code, v) = json(
        d.path(),
        &with(&[
            "--url",
            "http://web.shop/admin/x",
            "--peer-uri",
            "spiffe://cluster.local/ns/shop/sa/frontend",
        ]),
    );
    assert_eq!(code, 1);
    assert_eq!(v["policy"], "istio-system/deny-admin");
    assert_eq!(v["rule"], 0);
    let (_, v) = json(
        d.path(),
        &with(&[
            "--url",
            "http://web.shop/admin/x",
            "--peer-uri",
            "spiffe://cluster.local/ns/shop/sa/frontend",
            "--header",
            "X-Break-Glass: yes",
        ]),
    );
    assert_eq!(
        (v["status"].as_i64(), v["rule"].as_i64()),
        (Some(200), Some(1))
    );

    let (_, v) = json(
        d.path(),
        &with(&["--url", "http://web.shop/x", "--method", "DELETE"]),
    );
    assert_eq!(v["audit"], true);
    assert_eq!(v["status"], 403);
}

/// `/public/..;/admin` is `/admin` to Tomcat: refused by default, allowed as Istio reads it.
#[test]
fn path_parameters_flag() {
    let d = setup();
    let url = "http://web.shop/public/..;/admin";
    let (code, v) = json(d.path(), &with(&["--url", url]));
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["policy"], "istio-system/deny-admin");
    let (code, v) = json(
        d.path(),
        &with(&["--url", url, "--path-parameters", "as_received"]),
    );
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["policy"], "shop/web");
    let (code, v) = json(
        d.path(),
        &with(&[
            "--url",
            "http://web.shop/public/x",
            "--host-port",
            "as_received",
        ]),
    );
    assert_eq!(code, 0, "{v}");
}

/// A POST naming DELETE in `X-HTTP-Method-Override` is a DELETE to Symfony or Express:
/// refused by default (no ALLOW rule has DELETE), allowed as Istio reads it.
#[test]
fn method_overrides_flag() {
    let d = setup();
    let base = [
        "--url",
        "http://web.shop/public/x",
        "--method",
        "GET",
        "--header",
        "X-HTTP-Method-Override: DELETE",
    ];
    let (code, v) = json(d.path(), &with(&base));
    assert_eq!(code, 1, "{v}");
    assert!(v["reason"].as_str().unwrap_or("").contains("DELETE"), "{v}");
    let mut flag = base.to_vec();
    flag.extend(["--method-overrides", "as_received"]);
    let (code, v) = json(d.path(), &with(&flag));
    assert_eq!(code, 0, "{v}");
}

/// A POST form naming `_method=DELETE` is a DELETE to Rails or Laravel: `--body` is read
/// as the gateway reads it, and a DENY on DELETE refuses it.
#[test]
fn body_flag_reads_a_method_field() {
    let d = setup();
    let no_delete = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n\
        metadata: {name: no-delete, namespace: istio-system}\n\
        spec: {action: DENY, rules: [{to: [{operation: {methods: [DELETE]}}]}]}\n";
    std::fs::write(d.path().join("no-delete.yaml"), no_delete).unwrap();
    let base = [
        "--policies",
        "no-delete.yaml",
        "--url",
        "http://web.shop/items/1",
        "--method",
        "POST",
        "--principal",
        "cluster.local/ns/shop/sa/frontend",
        "--header",
        "Content-Type: application/x-www-form-urlencoded",
    ];
    let (code, v) = json(d.path(), &with(&base));
    assert_eq!(code, 0, "{v}");
    let mut body = base.to_vec();
    body.extend(["--body", "a=1&_method=delete"]);
    let (code, v) = json(d.path(), &with(&body));
    assert_eq!(code, 1, "{v}");
    assert!(
        v["reason"].as_str().unwrap_or("").contains("as DELETE"),
        "{v}"
    );
    body.extend(["--method-overrides", "as_received"]);
    let (code, v) = json(d.path(), &with(&body));
    assert_eq!(code, 0, "{v}");
}

#[test]
fn text_output_and_exit_codes() {
    let d = setup();
    let (code, out, _) = run(
        d.path(),
        &[
            "--policies",
            "policies.yaml",
            "--namespace",
            "shop",
            "--label",
            "app=web",
            "--url",
            "http://web.shop/public/a",
        ],
    );
    assert_eq!(code, 0);
    assert!(
        out.starts_with("200 ALLOW\n") && out.contains("policy: shop/web rule 0"),
        "{out}"
    );
    let (code, out, _) = run(
        d.path(),
        &[
            "--policies",
            "policies.yaml",
            "--namespace",
            "shop",
            "--label",
            "app=web",
            "--url",
            "http://web.shop/nope",
        ],
    );
    assert_eq!(code, 1);
    assert!(
        out.starts_with("403 DENY\n") && out.contains("no ALLOW policy matched"),
        "{out}"
    );
}

#[test]
fn workload_selection_defaults_to_namespace_default() {
    let d = setup();
    // No --namespace: `default`, where only the root-namespace DENY applies.
    let (code, v) = json(d.path(), &["--url", "http://x/private"]);
    assert_eq!((code, v["status"].as_i64()), (0, Some(200)));
    let (_, v) = json(d.path(), &["--url", "http://x/admin"]);
    assert_eq!(v["status"], 403);
    // Another root namespace: the istio-system policy is now an ordinary namespace policy.
    let (_, v) = json(
        d.path(),
        &["--url", "http://x/admin", "--root-namespace", "mesh-root"],
    );
    assert_eq!(v["status"], 200);
    // Label that does not match the selector.
    let (_, v) = json(
        d.path(),
        &[
            "--url",
            "http://x/private",
            "--namespace",
            "shop",
            "--label",
            "app=other",
        ],
    );
    assert_eq!(v["status"], 200);
}

#[test]
fn jwt_flag() {
    let d = setup();
    let (code, v) = json(
        d.path(),
        &with(&["--url", "http://web.shop/private", "--jwt", TOKEN]),
    );
    assert_eq!(code, 0, "{v}");
    assert_eq!(
        (v["policy"].as_str(), v["rule"].as_i64()),
        (Some("shop/web"), Some(2))
    );
    assert_eq!(v["request_principal"], "https://issuer.example.com/alice");
    let (code, v) = json(
        d.path(),
        &with(&["--url", "http://web.shop/private", "--jwt", EXPIRED]),
    );
    assert_eq!(
        (code, v["status"].as_i64(), v["decision"].as_str()),
        (1, Some(401), Some("DENY"))
    );
    let (_, v) = json(
        d.path(),
        &with(&["--url", "http://web.shop/private", "--jwt", "garbage"]),
    );
    assert_eq!(v["status"], 401);
}

#[test]
fn peer_port_remote_ip_sni() {
    let d = setup();
    // STRICT without a client certificate.
    let (code, v) = json(
        d.path(),
        &[
            "--url",
            "http://db.shop/",
            "--namespace",
            "shop",
            "--label",
            "app=db",
        ],
    );
    assert_eq!((code, v["status"].as_i64()), (1, Some(403)));
    assert_eq!(v["policy"], "shop/db-strict");
    let (code, _) = json(
        d.path(),
        &[
            "--url",
            "http://db.shop/",
            "--namespace",
            "shop",
            "--label",
            "app=db",
            "--peer-uri",
            "spiffe://cluster.local/ns/x/sa/y",
        ],
    );
    assert_eq!(code, 0);
    // Port from the URL, overridable by --port.
    let (_, v) = json(
        d.path(),
        &with(&[
            "--url",
            "https://web.shop:8443/x",
            "--remote-ip",
            "203.0.113.9",
        ]),
    );
    assert_eq!(v["status"], 200);
    let (_, v) = json(
        d.path(),
        &with(&["--url", "https://web.shop/x", "--remote-ip", "203.0.113.9"]),
    );
    assert_eq!(v["status"], 403, "https default port 443");
    let (_, v) = json(
        d.path(),
        &with(&[
            "--url",
            "https://web.shop/x",
            "--port",
            "8443",
            "--remote-ip",
            "203.0.113.9",
        ]),
    );
    assert_eq!(v["status"], 200);
    // remote.ip from X-Forwarded-For with trusted proxies.
    let (_, v) = json(
        d.path(),
        &with(&[
            "--url",
            "http://web.shop:8443/x",
            "--source-ip",
            "10.0.0.1",
            "--header",
            "X-Forwarded-For: 203.0.113.7",
            "--trusted-proxies",
            "1",
        ]),
    );
    assert_eq!(v["status"], 200);
    let (_, v) = json(
        d.path(),
        &with(&[
            "--url",
            "http://web.shop:8443/x",
            "--source-ip",
            "10.0.0.1",
            "--header",
            "X-Forwarded-For: 203.0.113.7",
        ]),
    );
    assert_eq!(v["status"], 403, "no trusted proxy: remote = source");
    let (_, v) = json(
        d.path(),
        &with(&["--url", "http://web.shop/x", "--sni", "internal.shop"]),
    );
    assert_eq!(v["status"], 200);
}

#[test]
fn directory_of_policies() {
    let d = setup();
    let sub = d.path().join("dir");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("a.yaml"), "apiVersion: security.istio.io/v1beta1\nkind: AuthorizationPolicy\nmetadata: {name: deny-all, namespace: foo}\nspec: {action: DENY, rules: [{}]}\n").unwrap();
    let (code, out, _) = run(
        d.path(),
        &[
            "--policies",
            "dir",
            "--url",
            "http://x/",
            "--namespace",
            "foo",
            "--json",
        ],
    );
    assert_eq!(code, 1);
    assert!(out.contains("\"policy\":\"foo/deny-all\""), "{out}");
}

#[test]
fn input_errors_exit_2() {
    let d = setup();
    std::fs::write(d.path().join("bad.yaml"), "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: p}\nspec:\n  action: CUSTOM\n").unwrap();
    let (code, _, err) = run(d.path(), &["--policies", "bad.yaml", "--url", "http://x/"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("bad.yaml:4:") && err.contains("CUSTOM"),
        "{err}"
    );
    std::fs::write(d.path().join("bad2.yaml"), "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: p}\nspec:\n  rules:\n  - to:\n    - operation: {methodz: [GET]}\n").unwrap();
    let (code, _, err) = run(d.path(), &["--policies", "bad2.yaml", "--url", "http://x/"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("bad2.yaml:7:") && err.contains("methodz"),
        "{err}"
    );
    for args in [
        vec!["--policies", "missing.yaml", "--url", "http://x/"],
        vec!["--policies", "policies.yaml", "--url", "not a url"],
        vec!["--policies", "policies.yaml", "--url", "ftp://x/"],
        vec![
            "--policies",
            "policies.yaml",
            "--url",
            "http://x/",
            "--source-ip",
            "999.1.1.1",
        ],
        vec![
            "--policies",
            "policies.yaml",
            "--url",
            "http://x/",
            "--header",
            "no-colon",
        ],
        vec![
            "--policies",
            "policies.yaml",
            "--url",
            "http://x/",
            "--label",
            "nolabel",
        ],
        vec![
            "--policies",
            "policies.yaml",
            "--url",
            "http://x/",
            "--peer-uri",
            "not-a-uri",
        ],
        vec![
            "--policies",
            "policies.yaml",
            "--url",
            "http://x/",
            "--path-normalization",
            "weird",
        ],
        vec![
            "--policies",
            "policies.yaml",
            "--url",
            "http://x/",
            "--path-parameters",
            "strip",
        ],
        vec![
            "--policies",
            "policies.yaml",
            "--url",
            "http://x/",
            "--method-overrides",
            "ignore",
        ],
        vec![
            "--policies",
            "policies.yaml",
            "--url",
            "http://x/",
            "--host-port",
            "strip",
        ],
        vec!["--url", "http://x/"],
    ] {
        let (code, _, err) = run(d.path(), &args);
        assert_eq!(code, 2, "{args:?}: {err}");
    }
}

#[test]
fn validate_subcommand() {
    let d = setup();
    let out = Command::new(env!("CARGO_BIN_EXE_moat"))
        .current_dir(d.path())
        .args(["policy", "validate", "policies.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("3 AuthorizationPolicy, 1 RequestAuthentication, 1 PeerAuthentication"),
        "{s}"
    );
    std::fs::write(d.path().join("bad.yaml"), "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: p}\nspec: {mtls: {mode: SOMETIMES}}\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_moat"))
        .current_dir(d.path())
        .args(["policy", "validate", "bad.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("bad.yaml:4:") && e.contains("unknown mode"),
        "{e}"
    );
}

fn moat(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_moat"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn tcp_connection_check() {
    let d = setup();
    // deny-admin only has HTTP conditions (a path and a header): on a TCP filter chain
    // Istio drops them, so it closes every connection (what Istio's validation warns).
    let (code, v) = json(
        d.path(),
        &with(&[
            "--tcp",
            "--port",
            "5432",
            "--principal",
            "cluster.local/ns/shop/sa/frontend",
        ]),
    );
    assert_eq!(code, 1);
    assert_eq!(v["protocol"], "tcp");
    assert_eq!(v["decision"], "DENY");
    assert_eq!(v["connection"], "closed");
    assert_eq!(v["policy"], "istio-system/deny-admin");
    assert_eq!(v["rule"], 0);

    // Without it: the principal rule allows, the HTTP-only rules never match.
    let tcp_only = POLICIES
        .split("---\n")
        .skip(1)
        .collect::<Vec<_>>()
        .join("---\n");
    std::fs::write(d.path().join("tcp.yaml"), tcp_only).unwrap();
    let tcp = |extra: &[&str]| {
        let mut a = vec![
            "policy",
            "check",
            "--tcp",
            "--policies",
            "tcp.yaml",
            "--namespace",
            "shop",
            "--label",
            "app=web",
        ];
        a.extend_from_slice(extra);
        moat(d.path(), &a)
    };
    let (code, out, err) = tcp(&[
        "--port",
        "5432",
        "--peer-uri",
        "spiffe://cluster.local/ns/shop/sa/frontend",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "ALLOW (connection accepted)\npolicy: shop/web rule 1\nreason: matched an ALLOW policy\naudit: shop/audit-all[rule 0]\n"
    );
    let (code, out, _) = tcp(&["--port", "5432", "--source-ip", "198.51.100.7"]);
    assert_eq!(code, 1);
    assert_eq!(
        out,
        "DENY (connection closed)\nreason: no ALLOW policy matched (2 ALLOW rule(s) use HTTP-only fields and never match a TCP connection)\naudit: shop/audit-all[rule 0]\n"
    );
    // audit-all's only condition is a method: on TCP it audits every connection.
    // remoteIpBlocks + ports (rule 3), connection.sni (rule 4).
    let (code, out, err) = tcp(&["--port", "8443", "--remote-ip", "203.0.113.9"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("policy: shop/web rule 3"), "{out}");
    let (code, out, _) = tcp(&["--port", "5432", "--sni", "internal.shop"]);
    assert_eq!(code, 0);
    assert!(out.contains("policy: shop/web rule 4"), "{out}");

    // Usage errors: HTTP flags with --tcp, --tcp without --port.
    let (code, _, err) = run(
        d.path(),
        &with(&[
            "--policies",
            "policies.yaml",
            "--tcp",
            "--port",
            "1",
            "--url",
            "http://a/",
        ]),
    );
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = run(d.path(), &with(&["--policies", "policies.yaml", "--tcp"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--port"), "{err}");
}

#[test]
fn explain_subcommand() {
    let d = setup();
    let (code, out, err) = moat(
        d.path(),
        &[
            "policy",
            "explain",
            "--policies",
            "policies.yaml",
            "--namespace",
            "shop",
            "--label",
            "app=web",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "workload: namespace shop, labels {app=web} (root namespace istio-system)"
    );
    assert_eq!(
        lines[1],
        "1. PeerAuthentication: PERMISSIVE (default: no policy applies)"
    );
    assert_eq!(
        lines[2],
        "2. RequestAuthentication: shop/jwt (issuers https://issuer.example.com)"
    );
    assert!(lines[4].starts_with("ACTION  POLICY"), "{out}");
    let actions: Vec<&str> = lines[5..]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap_or(""))
        .collect();
    assert_eq!(
        actions,
        ["CUSTOM", "AUDIT", "DENY", "ALLOW", "ALLOW", "ALLOW", "ALLOW", "ALLOW", "ALLOW"],
        "{out}"
    );
    assert!(
        lines[6].contains("shop/audit-all")
            && lines[6].contains("to: {methods=DELETE}")
            && lines[6].ends_with("drops methods: matches every connection"),
        "{out}"
    );
    assert!(lines[7].contains("istio-system/deny-admin"), "{out}");
    assert!(
        lines[7].ends_with("drops paths,request.headers[x-break-glass]: matches every connection"),
        "{out}"
    );

    let (code, out, _) = moat(
        d.path(),
        &[
            "policy",
            "explain",
            "--policies",
            "policies.yaml",
            "--namespace",
            "shop",
            "--label",
            "app=db",
            "--json",
        ],
    );
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["peer_authentication"]["mode"], "STRICT");
    assert_eq!(v["peer_authentication"]["policy"], "shop/db-strict");
    assert_eq!(v["authorization"][3]["action"], "ALLOW");
    assert_eq!(v["authorization"][3]["policies"], serde_json::json!([]));
    assert_eq!(
        v["authorization"][2]["policies"][0]["policy"],
        "istio-system/deny-admin"
    );

    let (code, _, err) = moat(
        d.path(),
        &["policy", "explain", "--policies", "missing.yaml"],
    );
    assert_eq!(code, 2);
    assert!(err.contains("missing.yaml"), "{err}");
}
