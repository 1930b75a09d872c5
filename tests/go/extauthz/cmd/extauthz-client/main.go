// Command extauthz-client calls envoy.service.auth.v3.Authorization/Check the way Envoy's
// ext_authz filter does, with the message types of Envoy's published API
// (github.com/envoyproxy/go-control-plane). moat's tests use it as an independent
// client of moat's ext_authz server, and as the load generator of its benchmark.
//
// One call (default) prints the answer as one JSON object:
//
//	{"grpc_code":0,"allowed":true,"status":200,"headers":{"x-moat-event-id":"..."},"body":""}
//
// With -n N it sends N calls, either at -rate per second (open loop: a call is timed from
// when it is sent, or from its schedule when no caller was free then) or as fast as -c
// concurrent callers can, and prints {"calls":N,"errors":E,"seconds":S,"per_second":R,
// "p50_us":..,"p99_us":..,"max_us":..,"start_late_p50_us":..,"start_late_p99_us":..}.
//
// With -frame FILE it writes the CheckRequest as one gRPC message (the 5-byte length
// prefix, then the protobuf) to FILE and exits: the body `moat bench load --h2` posts
// to /envoy.service.auth.v3.Authorization/Check, a load generator without Go's runtime.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	auth "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

type headerList []string

func (h *headerList) String() string     { return strings.Join(*h, ",") }
func (h *headerList) Set(v string) error { *h = append(*h, v); return nil }

func main() {
	addr := flag.String("addr", "127.0.0.1:9191", "ext_authz server address")
	method := flag.String("method", "GET", "request method")
	path := flag.String("path", "/", "request path with query")
	host := flag.String("host", "example.com", "request host (:authority)")
	scheme := flag.String("scheme", "https", "request scheme")
	body := flag.String("body", "", "request body sent as raw_body (with_request_body)")
	source := flag.String("source", "10.1.2.3:51234", "source (downstream client) ip:port")
	dest := flag.String("dest", "10.9.8.7:8443", "destination ip:port")
	principal := flag.String("principal", "", "source principal (SPIFFE URI)")
	certFile := flag.String("cert", "", "PEM client certificate sent as source.certificate")
	sni := flag.String("sni", "", "TLS session SNI")
	ctxExt := flag.String("context", "", "context_extensions as k=v,k=v")
	n := flag.Int("n", 0, "number of calls (0 = one call, printed in full)")
	rate := flag.Int("rate", 0, "calls per second with -n (0 = as fast as possible)")
	conc := flag.Int("c", 1, "concurrent callers with -n")
	timeout := flag.Duration("timeout", 5*time.Second, "per-call deadline")
	frame := flag.String("frame", "", "write the request as a gRPC message to this file and exit")
	var headers headerList
	flag.Var(&headers, "H", "request header name:value (repeatable)")
	flag.Parse()

	req, err := buildRequest(*method, *path, *host, *scheme, *body, *source, *dest, *principal, *certFile, *sni, *ctxExt, headers)
	if err != nil {
		fail(err)
	}
	if *frame != "" {
		if err := writeFrame(*frame, req); err != nil {
			fail(err)
		}
		return
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail(err)
	}
	defer conn.Close()
	client := auth.NewAuthorizationClient(conn)
	if *n == 0 {
		one(client, req, *timeout)
		return
	}
	load(client, req, *n, *rate, *conc, *timeout)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "extauthz-client:", err)
	os.Exit(2)
}

// writeFrame writes req as gRPC frames it on the wire: a zero byte (not compressed),
// the message length as 4 big-endian bytes, the protobuf encoding.
func writeFrame(path string, req *auth.CheckRequest) error {
	msg, err := proto.Marshal(req)
	if err != nil {
		return err
	}
	n := len(msg)
	out := append([]byte{0, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, msg...)
	return os.WriteFile(path, out, 0o644)
}

func socketAddress(s string) (*core.Address, error) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return nil, err
	}
	return &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
		Address: h, PortSpecifier: &core.SocketAddress_PortValue{PortValue: uint32(port)},
	}}}, nil
}

func buildRequest(method, path, host, scheme, body, source, dest, principal, certFile, sni, ctxExt string, headers headerList) (*auth.CheckRequest, error) {
	src, err := socketAddress(source)
	if err != nil {
		return nil, fmt.Errorf("-source: %w", err)
	}
	dst, err := socketAddress(dest)
	if err != nil {
		return nil, fmt.Errorf("-dest: %w", err)
	}
	// Envoy sends the pseudo-headers among the headers, and lowercase names.
	hm := map[string]string{":method": method, ":path": path, ":authority": host, ":scheme": scheme}
	for _, h := range headers {
		k, v, ok := strings.Cut(h, ":")
		if !ok {
			return nil, fmt.Errorf("-H %q: want name:value", h)
		}
		hm[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
	}
	cert := ""
	if certFile != "" {
		pem, err := os.ReadFile(certFile)
		if err != nil {
			return nil, err
		}
		// Envoy URL-encodes the PEM certificate (AttributeContext.Peer.certificate).
		cert = url.QueryEscape(string(pem))
	}
	ext := map[string]string{}
	if ctxExt != "" {
		for _, kv := range strings.Split(ctxExt, ",") {
			k, v, _ := strings.Cut(kv, "=")
			ext[k] = v
		}
	}
	http := &auth.AttributeContext_HttpRequest{
		Id: "1234567890", Method: method, Headers: hm, Path: path, Host: host,
		Scheme: scheme, Protocol: "HTTP/1.1", Size: int64(len(body)),
	}
	if body != "" {
		http.RawBody = []byte(body)
	}
	req := &auth.CheckRequest{Attributes: &auth.AttributeContext{
		Source:            &auth.AttributeContext_Peer{Address: src, Principal: principal, Certificate: cert},
		Destination:       &auth.AttributeContext_Peer{Address: dst},
		Request:           &auth.AttributeContext_Request{Http: http},
		ContextExtensions: ext,
	}}
	if sni != "" {
		req.Attributes.TlsSession = &auth.AttributeContext_TLSSession{Sni: sni}
	}
	return req, nil
}

type answer struct {
	GrpcCode int32             `json:"grpc_code"`
	Message  string            `json:"message,omitempty"`
	Allowed  bool              `json:"allowed"`
	Status   int32             `json:"status"`
	Headers  map[string]string `json:"headers"`
	Removed  []string          `json:"headers_to_remove,omitempty"`
	Body     string            `json:"body"`
}

func one(client auth.AuthorizationClient, req *auth.CheckRequest, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	resp, err := client.Check(ctx, req)
	if err != nil {
		fail(err)
	}
	a := answer{GrpcCode: resp.GetStatus().GetCode(), Message: resp.GetStatus().GetMessage(), Headers: map[string]string{}}
	if ok := resp.GetOkResponse(); ok != nil {
		a.Allowed = a.GrpcCode == 0
		a.Status = 200
		for _, h := range ok.GetHeaders() {
			a.Headers[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
		}
		a.Removed = ok.GetHeadersToRemove()
	} else if d := resp.GetDeniedResponse(); d != nil {
		a.Status = int32(d.GetStatus().GetCode())
		for _, h := range d.GetHeaders() {
			a.Headers[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
		}
		a.Body = d.GetBody()
	} else {
		a.Allowed = a.GrpcCode == 0
	}
	out, _ := json.Marshal(a)
	fmt.Println(string(out))
}

func load(client auth.AuthorizationClient, req *auth.CheckRequest, n, rate, conc int, timeout time.Duration) {
	lat := make([]time.Duration, n)
	late := make([]time.Duration, n)
	var errs atomic.Int64
	var next atomic.Int64
	start := time.Now()
	var interval time.Duration
	if rate > 0 {
		interval = time.Second / time.Duration(rate)
		// Open loop: enough callers that a slow answer does not delay the next call.
		if conc < 64 {
			conc = 64
		}
	}
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				sched := time.Now()
				if rate > 0 {
					sched = start.Add(time.Duration(i) * interval)
					if d := time.Until(sched); d > 0 {
						time.Sleep(d)
						// This caller was free before the call was due, so any lateness
						// now is this client's own timer (Go's netpoller sleeps in whole
						// milliseconds: up to ~1 ms late), not the server's: the call is
						// timed from when it is sent. A call no caller was free for is
						// timed from its schedule (no coordinated omission).
						sent := time.Now()
						late[i] = sent.Sub(sched)
						sched = sent
					}
				}
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				resp, err := client.Check(ctx, req)
				cancel()
				lat[i] = time.Since(sched)
				if err != nil || resp.GetStatus().GetCode() != 0 {
					errs.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	sort.Slice(late, func(a, b int) bool { return late[a] < late[b] })
	pct := func(d []time.Duration, p float64) int64 { return d[int(float64(n-1)*p)].Microseconds() }
	out, _ := json.Marshal(map[string]any{
		"calls": n, "errors": errs.Load(), "seconds": secs, "per_second": float64(n) / secs,
		"p50_us": pct(lat, 0.50), "p99_us": pct(lat, 0.99), "max_us": lat[n-1].Microseconds(),
		// How late this client's timer started calls (open loop): not in the latencies.
		"start_late_p50_us": pct(late, 0.50), "start_late_p99_us": pct(late, 0.99),
	})
	fmt.Println(string(out))
}
