// go-recorder is an HTTP/1.1 backend on Go's net/http server that reports every request
// the server parsed, for moat's test that its forwarded bytes frame the same requests in
// parsers that are not moat's own (crates/moat-proxy/tests/backend_parsers.rs).
//
// It listens on 127.0.0.1 (an ephemeral port), prints "listening PORT", then one JSON
// object per line:
//
//	{"kind":"request","conn":N,"method":M,"target":T,"headers":[[name,value]...],"body":B64,
//	 "trailers":[[name,value]...]}
//	{"kind":"request",...,"body_error":E}  the body could not be read as framed
//	{"kind":"refused","conn":N,"status":S} net/http answered the connection itself (a
//	                                       request it could not parse)
//
// Every request is answered 200 with `x-upstream: yes` and the body "upstream".
//
// With -h2c the handler is wrapped in golang.org/x/net/http2/h2c, as Go services that
// speak HTTP/2 without TLS (gRPC gateways, say) are: a request asking `Upgrade: h2c`
// switches its connection to HTTP/2, and the requests then sent on it are recorded too.
package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"
)

var (
	out   = bufio.NewWriter(os.Stdout)
	outMu sync.Mutex
	// A status line net/http wrote on its own: the handler only ever answers 200.
	ownAnswer = regexp.MustCompile(`HTTP/1\.[01] ([45][0-9][0-9])`)
)

func emit(record map[string]any) {
	line, err := json.Marshal(record)
	if err != nil {
		panic(err)
	}
	outMu.Lock()
	defer outMu.Unlock()
	out.Write(line)
	out.WriteByte('\n')
	out.Flush()
}

type connKey struct{}

// recordingConn reports a status line net/http wrote without the handler.
type recordingConn struct {
	net.Conn
	id uint64
}

func (c *recordingConn) Write(p []byte) (int, error) {
	for _, m := range ownAnswer.FindAllSubmatch(p, -1) {
		emit(map[string]any{"kind": "refused", "conn": c.id, "status": string(m[1])})
	}
	return c.Conn.Write(p)
}

type recordingListener struct {
	net.Listener
	next atomic.Uint64
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &recordingConn{Conn: c, id: l.next.Add(1)}, nil
}

func handle(w http.ResponseWriter, r *http.Request) {
	record := map[string]any{
		"kind":   "request",
		"conn":   r.Context().Value(connKey{}),
		"method": r.Method,
		"target": r.RequestURI,
		"proto":  r.Proto,
	}
	headers := [][2]string{}
	for name, values := range r.Header {
		for _, v := range values {
			headers = append(headers, [2]string{name, v})
		}
	}
	if r.Host != "" {
		headers = append(headers, [2]string{"Host", r.Host})
	}
	for _, te := range r.TransferEncoding {
		headers = append(headers, [2]string{"Transfer-Encoding", te})
	}
	record["headers"] = headers
	body, err := io.ReadAll(r.Body)
	record["body"] = base64.StdEncoding.EncodeToString(body)
	if err != nil {
		record["body_error"] = err.Error()
	}
	// The trailer section, once the body is read (every field of it, declared or not).
	trailers := [][2]string{}
	for name, values := range r.Trailer {
		for _, v := range values {
			trailers = append(trailers, [2]string{name, v})
		}
	}
	record["trailers"] = trailers
	emit(record)
	w.Header().Set("x-upstream", "yes")
	w.Header().Set("content-length", "8")
	w.WriteHeader(200)
	w.Write([]byte("upstream"))
}

func main() {
	upgradeH2C := flag.Bool("h2c", false, "switch to HTTP/2 on `Upgrade: h2c`")
	flag.Parse()
	var handler http.Handler = http.HandlerFunc(handle)
	if *upgradeH2C {
		handler = h2c.NewHandler(handler, &http2.Server{})
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	srv := &http.Server{
		Handler: handler,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c.(*recordingConn).id)
		},
	}
	fmt.Fprintf(out, "listening %d\n", ln.Addr().(*net.TCPAddr).Port)
	out.Flush()
	srv.Serve(&recordingListener{Listener: ln})
}
