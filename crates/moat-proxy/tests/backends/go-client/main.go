// go-client reads responses through moat with Go's net/http client, for moat's test that
// the responses it frames read as one response each in parsers that are not moat's own
// (crates/moat-proxy/tests/backend_parsers.rs).
//
// Usage: go-client BASE_URL N [--h2]. For each case i < N it sends, on one kept-alive
// connection, GET BASE_URL/r/i and then GET BASE_URL/second, and prints one JSON object
// per case: {"case":i,"first":R,"second":R}, R = {"status":S,"body":B64,"proto":P} or
// {"error":E}. With --h2 it speaks HTTP/2 with prior knowledge over plain TCP (h2c), the
// two requests as streams of one connection.
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
	Proto  string `json:"proto,omitempty"`
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
	return result{Status: resp.StatusCode, Body: base64.StdEncoding.EncodeToString(body), Proto: resp.Proto}
}

func main() {
	base := os.Args[1]
	n, err := strconv.Atoi(os.Args[2])
	if err != nil {
		panic(err)
	}
	transport := &http.Transport{
		MaxConnsPerHost:    1,
		MaxIdleConns:       1,
		DisableCompression: true,
	}
	if len(os.Args) > 3 && os.Args[3] == "--h2" {
		protocols := new(http.Protocols)
		protocols.SetUnencryptedHTTP2(true)
		transport.Protocols = protocols
	}
	// A response that never ends is an error of its own, not a hung test.
	client := &http.Client{Timeout: 10 * time.Second, Transport: transport}
	out := json.NewEncoder(os.Stdout)
	for i := 0; i < n; i++ {
		first := get(client, fmt.Sprintf("%s/r/%d", base, i))
		second := get(client, base+"/second")
		if err := out.Encode(map[string]any{"case": i, "first": first, "second": second}); err != nil {
			panic(err)
		}
	}
}
