package cluster

import (
	"context"
	"crypto/subtle"

	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/shardq/shardq/cluster/clusterpb"
)

// Calls between nodes are authenticated by mutual TLS (cluster.tls) and,
// when Options.Token is set, by that shared secret, which every call
// carries and every node requires. The Admin call also carries the
// node's admin token: with http.admin_token set, it answers a peer only
// as the admin API answers a client, so that the cluster port does not
// give away what HTTP guards.

const (
	tokenKey      = "shardq-cluster-token"
	adminTokenKey = "shardq-admin-token"
)

// callTokens adds the node's tokens to every call it makes.
type callTokens struct{ token, admin string }

func (c callTokens) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	md := map[string]string{}
	if c.token != "" {
		md[tokenKey] = c.token
	}
	if c.admin != "" {
		md[adminTokenKey] = c.admin
	}
	return md, nil
}

// RequireTransportSecurity is false: a token on a plain link is what
// cluster.allow_insecure accepts.
func (callTokens) RequireTransportSecurity() bool { return false }

// checkCall refuses a call without the tokens this node requires.
func (n *Node) checkCall(ctx context.Context, method string) error {
	md, _ := metadata.FromIncomingContext(ctx)
	if !tokenMatches(md, tokenKey, n.opts.Token) {
		return status.Error(grpccodes.Unauthenticated, "cluster: call without this cluster's token (cluster.token)")
	}
	if method == pb.Node_Admin_FullMethodName && !tokenMatches(md, adminTokenKey, n.opts.AdminToken) {
		return status.Error(grpccodes.PermissionDenied, "cluster: admin call without this node's admin token (http.admin_token)")
	}
	return nil
}

func tokenMatches(md metadata.MD, key, want string) bool {
	if want == "" {
		return true
	}
	got := md.Get(key)
	return len(got) == 1 && subtle.ConstantTimeCompare([]byte(got[0]), []byte(want)) == 1
}

// serverAuth returns the server options that check every call.
func (n *Node) serverAuth() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := n.checkCall(ctx, info.FullMethod); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := n.checkCall(ss.Context(), info.FullMethod); err != nil {
				return err
			}
			return h(srv, ss)
		}),
	}
}
