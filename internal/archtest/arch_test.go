// Package archtest keeps the import arrows between shardq's packages true: a
// package that imports what it must not fails this test, not review.
//
// The rules look at the packages' own imports (not their tests'): the
// direct imports of each package for the arrows between shardq's packages
// and, where a rule says so, for the third-party modules it may use; and
// all of its dependencies, direct or not, for what it must never pull in.
package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/shardq/shardq"

// Third-party modules, as patterns.
const (
	badger     = "github.com/dgraph-io/..." // badger and its cache, ristretto
	mochi      = "github.com/mochi-mqtt/..."
	etcd       = "go.etcd.io/..."
	etcdCore   = "go.etcd.io/etcd/..." // etcd's client, server and API, not raft
	raftpb     = "go.etcd.io/raft/v3/raftpb"
	protobuf   = "google.golang.org/protobuf/..."
	grpc       = "google.golang.org/grpc/..."
	paho       = "github.com/eclipse/paho.golang/..."
	pahoV3     = "github.com/eclipse/paho.mqtt.golang/..."
	prometheus = "github.com/prometheus/..."
	yaml       = "gopkg.in/yaml.v3"
	xcrypto    = "golang.org/x/crypto/..."
)

// mod returns the pattern of a package of this module.
func mod(rel string) string { return module + "/" + rel }

// rule constrains the packages that match pkgs. A pattern is an import
// path, or one ending in "/..." for it and the packages under it.
type rule struct {
	name string
	pkgs string
	// except are packages that pkgs matches but the rule does not apply to.
	except []string
	// internal are the packages of this module that the packages may
	// import directly, besides their own; nil allows any.
	internal []string
	// external are the third-party packages that the packages may import
	// directly; nil allows any. The standard library is always allowed.
	external []string
	// forbidden are the packages that must not be among the packages'
	// dependencies, direct or not.
	forbidden []string
}

var rules = []rule{
	{
		name:      "queue is the domain: standard library and prometheus only",
		pkgs:      mod("queue/..."),
		internal:  []string{},
		external:  []string{prometheus},
		forbidden: []string{mod("..."), mochi, badger, etcd, grpc, paho, pahoV3},
	},
	{
		name:      "storage implements queue with badger",
		pkgs:      mod("storage/..."),
		except:    []string{mod("storage/raftlog/...")}, // its own rule below
		internal:  []string{mod("queue/..."), mod("storage/..."), mod("internal/...")},
		forbidden: []string{mod("hooks/..."), mod("broker/..."), mod("cluster/..."), mod("config/..."), mochi, paho, pahoV3, etcd, grpc},
	},
	{
		name:      "storage/raftlog keeps the raft log in files: raft's messages and protobuf only",
		pkgs:      mod("storage/raftlog/..."),
		internal:  []string{},
		external:  []string{raftpb, protobuf},
		forbidden: []string{mod("..."), mochi, paho, pahoV3, etcdCore, grpc, badger},
	},
	{
		name:      "hooks is the only MQTT-aware code: queue and mochi",
		pkgs:      mod("hooks/..."),
		internal:  []string{mod("queue/..."), mod("hooks/..."), mod("internal/...")},
		forbidden: []string{mod("storage/..."), mod("broker/..."), mod("cluster/..."), badger, etcd, grpc},
	},
	{
		name:      "cluster is the only etcd and gRPC-aware code",
		pkgs:      mod("cluster/..."),
		internal:  []string{mod("queue/..."), mod("cluster/..."), mod("internal/...")},
		forbidden: []string{mod("storage/..."), mod("hooks/..."), mod("broker/..."), mochi, badger},
	},
	{
		name:      "auth: standard library and x/crypto only",
		pkgs:      mod("auth/..."),
		internal:  []string{},
		external:  []string{xcrypto},
		forbidden: []string{mod("..."), mochi, badger, etcd, grpc, paho, pahoV3},
	},
	{
		name:      "config: standard library, yaml, queue and auth",
		pkgs:      mod("config/..."),
		internal:  []string{mod("queue"), mod("auth"), mod("config/...")},
		external:  []string{yaml},
		forbidden: []string{mod("storage/..."), mod("hooks/..."), mod("broker/..."), mod("cluster/..."), mochi, badger, etcd, grpc, paho, pahoV3},
	},
	{
		name:      "broker may import any package but cmd",
		pkgs:      mod("broker/..."),
		forbidden: []string{mod("cmd/...")},
	},
	{
		name:      "nothing imports cmd",
		pkgs:      mod("..."),
		except:    []string{mod("cmd/...")},
		forbidden: []string{mod("cmd/...")},
	},
	{
		// storage/raftlog imports raft's messages, go.etcd.io/raft/v3/raftpb;
		// its own rule keeps etcd's client and server and gRPC from it.
		name:     "etcd and gRPC are imported in cluster only",
		pkgs:     mod("..."),
		except:   []string{mod("cluster/..."), mod("storage/raftlog/...")},
		external: []string{"!" + etcd, "!" + grpc},
	},
}

// pkg is what go list says of a package.
type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
	Error      *struct{ Err string }
}

func TestArchImports(t *testing.T) {
	pkgs := listPackages(t)
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			checked := 0
			for _, p := range pkgs {
				if !r.covers(p.ImportPath) {
					continue
				}
				checked++
				if p.Error != nil {
					t.Logf("%s: go list: %s (checking what it lists)", p.ImportPath, p.Error.Err)
				}
				for _, v := range r.violations(p) {
					t.Error(v)
				}
			}
			if checked == 0 {
				t.Skipf("no package matches %s yet", r.pkgs)
			}
		})
	}
}

// TestArchRulesCatchViolations proves the checks on made-up packages, so
// that a rule that can never fail does not pass unnoticed.
func TestArchRulesCatchViolations(t *testing.T) {
	tests := []struct {
		name string
		pkg  pkg
		want string // "" when the package breaks no rule
	}{
		{"queue with prometheus", pkg{ImportPath: mod("queue"),
			Imports: []string{"fmt", "github.com/prometheus/client_golang/prometheus"},
			Deps:    []string{"fmt", "github.com/prometheus/client_golang/prometheus", "google.golang.org/protobuf/proto"}}, ""},
		{"queue importing storage", pkg{ImportPath: mod("queue"),
			Imports: []string{mod("storage/badger")}, Deps: []string{mod("storage/badger")}}, "imports " + mod("storage/badger")},
		{"queue depending on mochi", pkg{ImportPath: mod("queue/sub"),
			Imports: []string{"fmt"}, Deps: []string{"github.com/mochi-mqtt/server/v2/packets"}}, "depends on github.com/mochi-mqtt/server/v2/packets"},
		{"queue importing x/sync", pkg{ImportPath: mod("queue"),
			Imports: []string{"golang.org/x/sync/errgroup"}}, "imports golang.org/x/sync/errgroup"},
		{"storage with badger", pkg{ImportPath: mod("storage/badger"),
			Imports: []string{mod("queue"), "github.com/dgraph-io/badger/v4"},
			Deps:    []string{mod("queue"), "github.com/dgraph-io/badger/v4"}}, ""},
		{"storage importing hooks", pkg{ImportPath: mod("storage/badger"),
			Imports: []string{mod("hooks")}}, "imports " + mod("hooks")},
		{"hooks depending on badger", pkg{ImportPath: mod("hooks"),
			Imports: []string{mod("queue")}, Deps: []string{mod("queue"), "github.com/dgraph-io/badger/v4"}}, "depends on github.com/dgraph-io/badger/v4"},
		{"config importing mochi", pkg{ImportPath: mod("config"),
			Imports: []string{"github.com/mochi-mqtt/server/v2"}}, "imports github.com/mochi-mqtt/server/v2"},
		{"broker importing everything", pkg{ImportPath: mod("broker"),
			Imports: []string{mod("queue"), mod("hooks"), mod("storage/badger"), mod("config"), "github.com/mochi-mqtt/server/v2"}}, ""},
		{"broker importing cmd", pkg{ImportPath: mod("broker"),
			Imports: []string{mod("cmd/shardq/run")}, Deps: []string{mod("cmd/shardq/run")}}, "depends on " + mod("cmd/shardq/run")},
		{"bench importing etcd", pkg{ImportPath: mod("bench"),
			Imports: []string{"go.etcd.io/etcd/client/v3"}}, "imports go.etcd.io/etcd/client/v3"},
		{"raftlog with raftpb and protobuf", pkg{ImportPath: mod("storage/raftlog"),
			Imports: []string{"go.etcd.io/raft/v3/raftpb", "google.golang.org/protobuf/proto"},
			Deps:    []string{"go.etcd.io/raft/v3/raftpb", "google.golang.org/protobuf/proto"}}, ""},
		{"raftlog importing badger", pkg{ImportPath: mod("storage/raftlog"),
			Imports: []string{"github.com/dgraph-io/badger/v4"}}, "imports github.com/dgraph-io/badger/v4"},
		{"raftlog importing queue", pkg{ImportPath: mod("storage/raftlog"),
			Imports: []string{mod("queue")}, Deps: []string{mod("queue")}}, "imports " + mod("queue")},
		{"raftlog depending on storage/badger", pkg{ImportPath: mod("storage/raftlog"),
			Imports: []string{"fmt"}, Deps: []string{mod("storage/badger")}}, "depends on " + mod("storage/badger")},
		{"raftlog importing raft", pkg{ImportPath: mod("storage/raftlog"),
			Imports: []string{"go.etcd.io/raft/v3"}}, "imports go.etcd.io/raft/v3"},
		{"raftlog depending on etcd client", pkg{ImportPath: mod("storage/raftlog"),
			Imports: []string{"fmt"}, Deps: []string{"go.etcd.io/etcd/client/v3"}}, "depends on go.etcd.io/etcd/client/v3"},
		{"raftlog depending on grpc", pkg{ImportPath: mod("storage/raftlog"),
			Imports: []string{"fmt"}, Deps: []string{"google.golang.org/grpc"}}, "depends on google.golang.org/grpc"},
		{"raftlog depending on mochi", pkg{ImportPath: mod("storage/raftlog/sub"),
			Imports: []string{"fmt"}, Deps: []string{"github.com/mochi-mqtt/server/v2"}}, "depends on github.com/mochi-mqtt/server/v2"},
		{"storage/badger depending on raftpb", pkg{ImportPath: mod("storage/badger"),
			Imports: []string{"fmt"}, Deps: []string{"go.etcd.io/raft/v3/raftpb"}}, "depends on go.etcd.io/raft/v3/raftpb"},
		{"storage/other importing raftpb", pkg{ImportPath: mod("storage/other"),
			Imports: []string{"go.etcd.io/raft/v3/raftpb"}}, "imports go.etcd.io/raft/v3/raftpb"},
		{"bench importing raftpb", pkg{ImportPath: mod("bench"),
			Imports: []string{"go.etcd.io/raft/v3/raftpb"}}, "imports go.etcd.io/raft/v3/raftpb"},
		{"cmd importing cmd", pkg{ImportPath: mod("cmd/shardq"),
			Imports: []string{mod("cmd/shardq/internal/run")}, Deps: []string{mod("cmd/shardq/internal/run")}}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, r := range rules {
				if r.covers(tc.pkg.ImportPath) {
					got = append(got, r.violations(&tc.pkg)...)
				}
			}
			switch {
			case tc.want == "" && len(got) > 0:
				t.Errorf("violations %q, want none", got)
			case tc.want != "" && !strings.Contains(strings.Join(got, "\n"), tc.want):
				t.Errorf("violations %q, want one containing %q", got, tc.want)
			}
		})
	}
}

// covers reports whether r applies to the package path.
func (r rule) covers(path string) bool {
	return match(r.pkgs, path) && !matchAny(r.except, path)
}

// violations lists how p breaks r. The packages r covers may always
// import each other.
func (r rule) violations(p *pkg) []string {
	var out []string
	for _, imp := range p.Imports {
		switch {
		case std(imp):
		case match(mod("..."), imp):
			if r.internal != nil && !matchAny(r.internal, imp) && !r.covers(imp) {
				out = append(out, fmt.Sprintf("%s imports %s: %s", p.ImportPath, imp, r.name))
			}
		case r.external != nil && !allowed(r.external, imp):
			out = append(out, fmt.Sprintf("%s imports %s: %s", p.ImportPath, imp, r.name))
		}
	}
	for _, dep := range p.Deps {
		if matchAny(r.forbidden, dep) && !r.covers(dep) {
			out = append(out, fmt.Sprintf("%s depends on %s: %s", p.ImportPath, dep, r.name))
		}
	}
	return out
}

// allowed reports whether path passes the list: it must match no pattern
// that starts with "!" and, if there are others, one of them.
func allowed(patterns []string, path string) bool {
	positive := false
	for _, p := range patterns {
		if deny, ok := strings.CutPrefix(p, "!"); ok {
			if match(deny, path) {
				return false
			}
			continue
		}
		positive = true
	}
	if !positive {
		return true
	}
	return matchAny(patterns, path)
}

// match reports whether path matches pattern: equal to it or, for a
// pattern ending in "/...", equal to the part before or under it.
func match(pattern, path string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

func matchAny(patterns []string, path string) bool {
	for _, p := range patterns {
		if match(p, path) {
			return true
		}
	}
	return false
}

// std reports whether path is in the standard library: its first element
// has no dot, as cmd/go decides.
func std(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}

// listPackages returns the module's packages as go list sees them; -e
// lists the ones that do not build yet too.
func listPackages(t *testing.T) []*pkg {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("go command not found: %v", err)
	}
	cmd := exec.Command(goBin, "list", "-e", "-json=ImportPath,Imports,Deps,Error", mod("..."))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []*pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		p := new(pkg)
		if err := dec.Decode(p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatal("go list found no packages")
	}
	return pkgs
}
