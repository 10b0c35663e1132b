// Package testbin builds the shardq command once per test binary, for the
// tests that run it as a process.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var (
	once sync.Once
	path string
	err  error
)

// Shardq returns the path of a shardq binary built from this checkout,
// with the race detector when race is set (the value of the first call
// holds for the test binary).
func Shardq(tb testing.TB, race bool) string {
	tb.Helper()
	once.Do(func() {
		dir, derr := os.MkdirTemp("", "shardq-bin")
		if derr != nil {
			err = derr
			return
		}
		path = filepath.Join(dir, "shardq")
		args := []string{"build", "-o", path}
		if race {
			args = append(args, "-race")
		}
		out, berr := exec.Command("go", append(args, "github.com/shardq/shardq/cmd/shardq")...).CombinedOutput()
		if berr != nil {
			err = fmt.Errorf("go build: %v\n%s", berr, out)
		}
	})
	if err != nil {
		tb.Fatal(err)
	}
	return path
}

// Main runs the tests of m and removes the binary; call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if path != "" {
		_ = os.RemoveAll(filepath.Dir(path))
	}
	os.Exit(code)
}
