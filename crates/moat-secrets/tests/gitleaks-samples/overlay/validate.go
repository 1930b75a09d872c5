// Replaces gitleaks' cmd/generate/config/utils/validate.go (through `go build
// -overlay`, see scripts/gitleaks-fresh-samples): instead of checking each rule's
// generated true and false positives, it records them as JSON lines, the format
// of shared/datasets/gitleaks/samples-dev.jsonl, in the file named by
// MOAT_SAMPLES_OUT. Keywords are lower-cased as the original does.

package utils

import (
	"encoding/json"
	"os"
	"strings"

	"github.com/zricethezav/gitleaks/v8/config"
)

type sample struct {
	RuleID string `json:"rule_id"`
	Text   string `json:"text"`
	Path   string `json:"path,omitempty"`
	Expect string `json:"expect"`
}

var out *json.Encoder

func record(ruleID, text, path, expect string) {
	if out == nil {
		f, err := os.OpenFile(os.Getenv("MOAT_SAMPLES_OUT"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			panic(err)
		}
		out = json.NewEncoder(f)
		out.SetEscapeHTML(false)
	}
	if err := out.Encode(sample{ruleID, text, path, expect}); err != nil {
		panic(err)
	}
}

func lowerKeywords(r *config.Rule) {
	seen := map[string]struct{}{}
	var keywords []string
	for _, k := range r.Keywords {
		k = strings.ToLower(k)
		if _, ok := seen[k]; !ok {
			seen[k] = struct{}{}
			keywords = append(keywords, k)
		}
	}
	r.Keywords = keywords
}

func Validate(rule config.Rule, truePositives []string, falsePositives []string) *config.Rule {
	r := &rule
	lowerKeywords(r)
	for _, tp := range truePositives {
		record(r.RuleID, tp, "", "tp")
	}
	for _, fp := range falsePositives {
		record(r.RuleID, fp, "", "fp")
	}
	return r
}

func ValidateWithPaths(rule config.Rule, truePositives map[string]string, falsePositives map[string]string) *config.Rule {
	r := &rule
	lowerKeywords(r)
	for path, tp := range truePositives {
		record(r.RuleID, tp, path, "tp")
	}
	for path, fp := range falsePositives {
		record(r.RuleID, fp, path, "fp")
	}
	return r
}
