//! Hostile bodies: input crafted to make a scan expensive stays bounded by the
//! scan's deadline, and the bounded form of `gitleaks:allow` handling still
//! follows gitleaks (the marker counts on the finding's own line only).
// Test code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use moat_secrets::Scanner;

/// One line of about 1 MiB dense in keywords and candidate secrets: every
/// generic-rule match on it used to re-search the whole line for
/// `gitleaks:allow`, which made this body cost seconds of CPU.
fn dense_line() -> Vec<u8> {
    let unit = "secret=\"aGVsbG8gd29ybGQ=\" token: deadbeefcafebabe0123456789abcdef AKIA ghp_ xoxb- sk_live_ ";
    unit.repeat(1_048_000 / unit.len()).into_bytes()
}

#[test]
fn a_match_dense_body_is_cut_at_the_deadline() {
    let scanner = Scanner::builtin().unwrap();
    let body = dense_line();
    let budget = Duration::from_millis(20);
    let started = Instant::now();
    let deadline = moat_core::clock::CoarseInstant::now() + budget;
    let outcome = scanner.scan_with_deadline(&body, None, Some(deadline));
    let took = started.elapsed();
    // The clock is read every few dozen matches, so the overshoot is a
    // fraction of the budget; a second leaves room for a loaded machine while
    // still failing on the old behaviour (one rule's matches ran to the end).
    assert!(
        outcome.timed_out || took < budget,
        "neither finished in budget nor reported the deadline: {took:?}"
    );
    assert!(took < Duration::from_secs(1), "deadline overshot: {took:?}");
}

#[test]
fn allow_marker_counts_on_the_findings_line_only() {
    let scanner = Scanner::builtin().unwrap();
    let key = "AKIAZ7Q4T2MXW6VBN3RK";
    let same_line = format!("aws.access_key_id = {key} # gitleaks:allow\n");
    assert!(scanner.scan(same_line.as_bytes(), None).is_empty());
    let marker_before = format!("x = 1 # gitleaks:allow\naws.access_key_id = {key}\n");
    assert_eq!(scanner.scan(marker_before.as_bytes(), None).len(), 1);
    let marker_after = format!("aws.access_key_id = {key}\n# gitleaks:allow\n");
    assert_eq!(scanner.scan(marker_after.as_bytes(), None).len(), 1);
    // the marker cut by the line's end does not count
    let split = format!("aws.access_key_id = {key} # gitleaks:al\nlow\n");
    assert_eq!(scanner.scan(split.as_bytes(), None).len(), 1);
}
