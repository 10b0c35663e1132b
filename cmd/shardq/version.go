package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
)

// version and commit are set at build time, as `make build` does:
//
//	go build -ldflags "-X main.version=v1.2.3 -X main.commit=$(git rev-parse HEAD)" ./cmd/shardq
//
// Left empty they come from the build info Go records in the binary: the
// module version of `go install github.com/shardq/shardq/cmd/shardq@v1.2.3`,
// and the commit of the git checkout a binary was built in.
var (
	version string
	commit  string
)

// buildVersion is what shardq version prints.
type buildVersion struct {
	Version    string // "v1.2.3", a pseudo-version, or "devel"
	Commit     string // the git commit, or "unknown"
	CommitTime string // the commit's time, when Go recorded it
	Modified   bool   // built from a checkout with uncommitted changes
	Go         string // the Go version that built it
	Platform   string // GOOS/GOARCH
}

// readVersion returns the version of this binary: the values set at build
// time, completed from the build info.
func readVersion() buildVersion {
	v := buildVersion{Version: version, Commit: commit, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if info, ok := debug.ReadBuildInfo(); ok {
		if v.Version == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			v.Version = info.Main.Version
		}
		settings := map[string]string{}
		for _, s := range info.Settings {
			settings[s.Key] = s.Value
		}
		if rev := settings["vcs.revision"]; rev != "" && (v.Commit == "" || v.Commit == rev) {
			v.Commit, v.CommitTime, v.Modified = rev, settings["vcs.time"], settings["vcs.modified"] == "true"
		}
		if info.GoVersion != "" {
			v.Go = info.GoVersion
		}
	}
	if v.Version == "" {
		v.Version = "devel"
	}
	if v.Commit == "" {
		v.Commit = "unknown"
	}
	return v
}

const versionUsage = `usage: shardq version

Prints the version of shardq, the git commit it was built from (and when
that commit was made, and whether the checkout had uncommitted changes)
and the Go version and platform it was built with.
`

// versionCommand runs shardq version.
func versionCommand(args []string, stdout, stderr io.Writer) int {
	c := newCommand("version", versionUsage)
	if code := c.parseNoArgs(args, os.Getenv, stdout, stderr); code >= 0 {
		return code
	}
	v := readVersion()
	fmt.Fprintf(stdout, "shardq %s\n", v.Version)
	fmt.Fprintf(stdout, "commit %s", v.Commit)
	if v.CommitTime != "" {
		fmt.Fprintf(stdout, " (%s)", v.CommitTime)
	}
	if v.Modified {
		fmt.Fprint(stdout, " with uncommitted changes")
	}
	fmt.Fprintf(stdout, "\n%s %s\n", v.Go, v.Platform)
	return 0
}
