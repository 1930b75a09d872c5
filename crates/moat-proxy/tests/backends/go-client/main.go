// go-client reads responses through moat with Go's net/http client, for moat's test that
// the responses it frames read as one response each in parsers that are not moat's own
// (crates/moat-proxy/tests/backend_parsers.rs).
//
// Usage: go-client BASE_URL N. For each case i < N it sends, on one kept-alive
// connection, GET BASE_URL/r/i and then GET BASE_URL/second, and prints one JSON object
// per case: {"case":i,"first":R,"second":R}, R = {"status":S,"body":B64} or
// {"error":E}.
package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"time"
)

type result struct {
	Status int    `json:"status,omitempty"`
	Body   string `json:"body,omitempty"`
	Error  string `json:"error,omitempty"`
}

func get(c *http.Client, url string) result {
	resp, err := c.Get(url)
	if err != nil {
		return result{Error: err.Error()}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return result{Error: "body: " + err.Error()}
	}
	return result{Status: resp.StatusCode, Body: base64.StdEncoding.EncodeToString(body)}
}

func main() {
	base := os.Args[1]
	n, err := strconv.Atoi(os.Args[2])
	if err != nil {
		panic(err)
	}
	// A response that never ends is an error of its own, not a hung test.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		MaxConnsPerHost:    1,
		MaxIdleConns:       1,
		DisableCompression: true,
	}}
	out := json.NewEncoder(os.Stdout)
	for i := 0; i < n; i++ {
		first := get(client, fmt.Sprintf("%s/r/%d", base, i))
		second := get(client, base+"/second")
		if err := out.Encode(map[string]any{"case": i, "first": first, "second": second}); err != nil {
			panic(err)
		}
	}
}
