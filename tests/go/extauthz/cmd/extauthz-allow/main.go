// Command extauthz-allow is an envoy.service.auth.v3.Authorization server that allows
// every Check without looking at it (grpc-go and Envoy's published API types, as
// extauthz-client). scripts/extauthz-perf serves it where moat's decision listener runs
// and drives both with the same client: its latency is the floor the client, gRPC and
// the machine set, and moat's figure minus it is what moat adds.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"

	auth "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
)

type allowAll struct {
	auth.UnimplementedAuthorizationServer
}

func (allowAll) Check(context.Context, *auth.CheckRequest) (*auth.CheckResponse, error) {
	return &auth.CheckResponse{Status: &status.Status{Code: 0}}, nil
}

func main() {
	addr := flag.String("listen", "127.0.0.1:9192", "address to serve on")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "extauthz-allow:", err)
		os.Exit(1)
	}
	srv := grpc.NewServer()
	auth.RegisterAuthorizationServer(srv, allowAll{})
	if err := srv.Serve(ln); err != nil {
		fmt.Fprintln(os.Stderr, "extauthz-allow:", err)
		os.Exit(1)
	}
}
