//go:build tools

// The external authorizer the CUSTOM-action tests start: Open Policy Agent with its
// Envoy plugin, pinned by this module's go.mod and go.sum (the plugin is built from
// here because its version tags are not listed by the module proxy, which `go install
// MODULE@VERSION` needs).
package tools

import _ "github.com/open-policy-agent/opa-envoy-plugin/cmd/opa-envoy-plugin"
