package auth

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"golang.org/x/crypto/bcrypt"
)

// Bcrypt costs HashPassword accepts. Each step doubles the time a check
// takes: DefaultCost takes tens of milliseconds, MinCost well under one.
const (
	MinCost     = bcrypt.MinCost
	MaxCost     = bcrypt.MaxCost
	DefaultCost = bcrypt.DefaultCost
	// MaxPassword is the longest password bcrypt takes, in bytes.
	MaxPassword = 72
	// MaxUsername bounds a username, in bytes.
	MaxUsername = 256
)

// Users are the accounts of a users file: each name with its bcrypt hash.
// A Users is read-only once parsed and safe for concurrent use.
type Users struct {
	hashes map[string][]byte
}

// ParseUsers reads a users file: one USER:BCRYPT-HASH line per user (the
// line `shardq passwd USER` prints). Blank lines and lines starting with #
// are skipped; a trailing carriage return is ignored. Every invalid line
// is reported, as a *LineError, joined with errors.Join.
func ParseUsers(r io.Reader) (*Users, error) {
	u := &Users{hashes: map[string][]byte{}}
	first := map[string]int{}
	var errs []error
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSuffix(sc.Text(), "\r")
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		name, hash, ok := strings.Cut(line, ":")
		hash = strings.TrimRight(hash, " \t")
		if !ok {
			errs = append(errs, &LineError{n, "want USER:BCRYPT-HASH (the line shardq passwd USER prints)"})
			continue
		}
		if err := ValidUsername(name); err != nil {
			errs = append(errs, &LineError{n, err.Error()})
			continue
		}
		if _, err := bcrypt.Cost([]byte(hash)); err != nil || len(hash) != 60 {
			errs = append(errs, &LineError{n, fmt.Sprintf("the hash of %q is not a bcrypt hash ($2a$, $2b$ or $2y$, 60 characters)", name)})
			continue
		}
		if l, dup := first[name]; dup {
			errs = append(errs, &LineError{n, fmt.Sprintf("user %q is already on line %d", name, l)})
			continue
		}
		first[name] = n
		u.hashes[name] = []byte(hash)
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return u, nil
}

// LoadUsers reads the users file at path (see ParseUsers).
func LoadUsers(path string) (*Users, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseUsers(bytes.NewReader(data))
}

// Len returns the number of users.
func (u *Users) Len() int {
	if u == nil {
		return 0
	}
	return len(u.hashes)
}

// Has reports whether name is a user.
func (u *Users) Has(name string) bool {
	if u == nil {
		return false
	}
	_, ok := u.hashes[name]
	return ok
}

// Names returns the users' names, in no order.
func (u *Users) Names() []string {
	if u == nil {
		return nil
	}
	out := make([]string, 0, len(u.hashes))
	for n := range u.hashes {
		out = append(out, n)
	}
	return out
}

// Authenticate reports whether password is the password of the user name.
// An unknown name costs as much time as a known one, so that the answer's
// timing does not tell which names exist.
func (u *Users) Authenticate(name, password string) bool {
	var hash []byte
	if u != nil {
		hash = u.hashes[name]
	}
	if hash == nil {
		_ = bcrypt.CompareHashAndPassword(dummyHash(), []byte(password))
		return false
	}
	return bcrypt.CompareHashAndPassword(hash, []byte(password)) == nil
}

var dummyHash = sync.OnceValue(func() []byte {
	h, err := bcrypt.GenerateFromPassword([]byte("shardq: no such user"), DefaultCost)
	if err != nil {
		panic(err) // only for a cost out of range
	}
	return h
})

// HashPassword returns the bcrypt hash of password at cost (MinCost to
// MaxCost).
func HashPassword(password string, cost int) ([]byte, error) {
	if password == "" || len(password) > MaxPassword {
		return nil, fmt.Errorf("%w: must be 1 to %d bytes, got %d", ErrBadPassword, MaxPassword, len(password))
	}
	if cost < MinCost || cost > MaxCost {
		return nil, fmt.Errorf("auth: bcrypt cost must be from %d to %d, got %d", MinCost, MaxCost, cost)
	}
	return bcrypt.GenerateFromPassword([]byte(password), cost)
}

// Line returns the users file line of a user: USER:HASH.
func Line(name string, hash []byte) string { return name + ":" + string(hash) }

// ValidUsername returns nil when name may be a user of a users file: 1 to
// MaxUsername bytes of UTF-8 without ':' or control characters, not
// starting or ending with a space, and not "*" (which ACL rules read as
// every user).
func ValidUsername(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrBadUsername)
	case len(name) > MaxUsername:
		return fmt.Errorf("%w: longer than %d bytes", ErrBadUsername, MaxUsername)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: not UTF-8", ErrBadUsername)
	case name == "*":
		return fmt.Errorf("%w: \"*\" means every user in ACL rules", ErrBadUsername)
	case strings.TrimSpace(name) != name:
		return fmt.Errorf("%w: %q starts or ends with a space", ErrBadUsername, name)
	case strings.ContainsRune(name, ':'):
		return fmt.Errorf("%w: %q holds ':'", ErrBadUsername, name)
	case strings.IndexFunc(name, unicode.IsControl) >= 0:
		return fmt.Errorf("%w: %q holds a control character", ErrBadUsername, name)
	}
	return nil
}
