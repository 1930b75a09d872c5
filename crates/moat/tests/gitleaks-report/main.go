// Command gitleaks-report reads a JSON report with gitleaks' own report structs
// (github.com/zricethezav/gitleaks/v8/report.Finding), rejecting any field gitleaks
// does not know, checks what gitleaks' tools rely on, and writes the findings back
// with gitleaks' JSON reporter. The test crates/moat/tests/scan_report_structs.rs
// feeds it moat's reports and compares the output with moat's.
//
// Usage: gitleaks-report REPORT.json
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/zricethezav/gitleaks/v8/report"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gitleaks-report REPORT.json")
		os.Exit(2)
	}
	data, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var findings []report.Finding
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&findings); err != nil {
		fmt.Fprintf(os.Stderr, "not a gitleaks report: %v\n", err)
		os.Exit(1)
	}
	if findings == nil {
		fmt.Fprintln(os.Stderr, "not a gitleaks report: null instead of an array")
		os.Exit(1)
	}
	for i, f := range findings {
		if msg := check(f); msg != "" {
			fmt.Fprintf(os.Stderr, "finding %d (%s in %s): %s\n", i, f.RuleID, f.File, msg)
			os.Exit(1)
		}
	}
	if err := (&report.JsonReporter{}).Write(os.Stdout, findings); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
}

// check returns what is wrong with f for gitleaks' own tools (baselines,
// .gitleaksignore, SARIF), or "".
func check(f report.Finding) string {
	switch {
	case f.RuleID == "" || f.Description == "":
		return "no RuleID or Description"
	case f.StartLine < 1 || f.EndLine < f.StartLine:
		return fmt.Sprintf("lines %d-%d", f.StartLine, f.EndLine)
	case f.StartColumn < 1 || (f.EndLine == f.StartLine && f.EndColumn < f.StartColumn):
		return fmt.Sprintf("columns %d-%d", f.StartColumn, f.EndColumn)
	case f.Secret == "" || !strings.Contains(f.Match, f.Secret):
		return "the Match does not hold the Secret"
	case f.Entropy <= 0:
		return "no Entropy"
	case (f.Commit == "") != (f.Author == "" && f.Date == ""):
		return "commit metadata without a Commit, or a Commit without it"
	}
	// gitleaks' fingerprint: [commit:]file:rule:line (detect.Detector.AddFinding)
	want := f.File + ":" + f.RuleID + ":" + strconv.Itoa(f.StartLine)
	if f.Commit != "" {
		want = f.Commit + ":" + want
	}
	if f.Fingerprint != want {
		return fmt.Sprintf("Fingerprint %q, gitleaks makes %q", f.Fingerprint, want)
	}
	return ""
}
