# scripts/extauthz-perf: OPA's Envoy plugin allows GETs (one comparison: the policy's own
# cost is not what is measured).
package envoy.authz

default allow := false

allow if input.attributes.request.http.method == "GET"
