//! `moat completions`, `moat man`, `moat certs` and serve's address flags as real processes.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn moat(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(args)
        .output()
        .expect("run moat")
}

#[test]
fn completions_for_each_shell_name_the_subcommands() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = moat(&["completions", shell]);
        assert!(out.status.success(), "{shell}");
        let text = String::from_utf8(out.stdout).unwrap();
        for sub in ["serve", "check-config", "scan", "events", "certs"] {
            assert!(text.contains(sub), "{shell} completion lacks {sub}");
        }
    }
    assert_eq!(moat(&["completions", "tcsh"]).status.code(), Some(2));
}

#[test]
fn man_pages_on_stdout_and_one_per_subcommand() {
    let out = moat(&["man"]);
    assert!(out.status.success());
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(page.contains(".TH moat 1"), "{page}");
    let dir = tempfile::tempdir().unwrap();
    let out = moat(&["man", "--dir", dir.path().to_str().unwrap()]);
    assert!(out.status.success());
    for name in [
        "moat.1",
        "moat-serve.1",
        "moat-scan.1",
        "moat-scan-git.1",
        "moat-apis-export.1",
    ] {
        let p = dir.path().join(name);
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{name}");
    }
    let serve = std::fs::read_to_string(dir.path().join("moat-serve.1")).unwrap();
    assert!(
        serve.contains("listen") && serve.contains("data\\-dir"),
        "{serve}"
    );
}

#[test]
fn certs_writes_a_ca_server_client_and_jwt_and_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("c");
    let o = out_dir.to_str().unwrap();
    let out = moat(&[
        "certs",
        "--out",
        o,
        "--host",
        "api.test",
        "--host",
        "10.0.0.1",
        "--jwt-issuer",
        "https://i.test",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in [
        "ca.crt",
        "ca.key",
        "server.crt",
        "server.key",
        "client.crt",
        "client.key",
        "jwks.json",
        "token.jwt",
    ] {
        assert!(out_dir.join(f).is_file(), "{f}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(out_dir.join("server.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "private key readable by others: {mode:o}");
    }
    let jwks: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("jwks.json")).unwrap()).unwrap();
    assert_eq!(jwks["keys"][0]["kty"], "EC");
    let again = moat(&["certs", "--out", o]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));
    assert!(moat(&["certs", "--out", o, "--force"]).status.success());
}

#[test]
fn serve_rejects_bad_listen_and_admin_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("moat.yaml");
    std::fs::write(
        &cfg,
        "listeners: [{ name: main, address: 127.0.0.1:0 }]\nclusters: [{ name: a, endpoints: [\"127.0.0.1:9\"] }]\nroutes: [{ name: r, cluster: a }]\n",
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    for (args, needle) in [
        (vec!["--listen", "nope"], "--listen"),
        (
            vec!["--listen", "other=127.0.0.1:0"],
            "no listener named `other`",
        ),
        (vec!["--admin", "localhost"], "--admin"),
    ] {
        let mut a = vec!["serve", "--config", c];
        a.extend(args);
        let out = moat(&a);
        assert_eq!(out.status.code(), Some(2), "{a:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(needle),
            "{a:?}"
        );
    }
}
