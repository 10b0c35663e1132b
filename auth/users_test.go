package auth

import (
	"errors"
	"strings"
	"testing"
)

func hash(t testing.TB, pw string) string {
	t.Helper()
	h, err := HashPassword(pw, MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

func TestUsersParseAndAuthenticate(t *testing.T) {
	file := "# shardq users\n\n" +
		Line("alice", []byte(hash(t, "secret"))) + "\r\n" +
		"  # indented comment\n" +
		Line("bob smith", []byte(hash(t, "pässword"))) + "\n"
	u, err := ParseUsers(strings.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	if u.Len() != 2 || !u.Has("alice") || !u.Has("bob smith") || u.Has("carol") {
		t.Fatalf("users %v", u.Names())
	}
	tests := []struct {
		name, user, pw string
		want           bool
	}{
		{"right password", "alice", "secret", true},
		{"utf-8 password", "bob smith", "pässword", true},
		{"wrong password", "alice", "Secret", false},
		{"empty password", "alice", "", false},
		{"another's password", "bob smith", "secret", false},
		{"unknown user", "carol", "secret", false},
		{"too long", "alice", strings.Repeat("x", 100), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := u.Authenticate(tc.user, tc.pw); got != tc.want {
				t.Errorf("Authenticate(%q, %q) = %v, want %v", tc.user, tc.pw, got, tc.want)
			}
		})
	}
	var none *Users
	if none.Authenticate("alice", "secret") || none.Len() != 0 || none.Has("alice") {
		t.Error("a nil Users authenticates nobody")
	}
}

func TestUsersParseErrors(t *testing.T) {
	good := hash(t, "pw")
	file := strings.Join([]string{
		"alice:" + good,
		"no colon here",
		"alice:" + good,
		":" + good,
		"carol:plaintext",
		" dave:" + good,
		"*:" + good,
		"erin:$2a$04$short",
	}, "\n")
	_, err := ParseUsers(strings.NewReader(file))
	if err == nil {
		t.Fatal("no error")
	}
	want := map[int]string{
		2: "want USER:BCRYPT-HASH",
		3: `user "alice" is already on line 1`,
		4: "empty",
		5: `the hash of "carol" is not a bcrypt hash`,
		6: "starts or ends with a space",
		7: "every user",
		8: `the hash of "erin"`,
	}
	got := map[int]string{}
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		le, ok := errors.AsType[*LineError](e)
		if !ok {
			t.Fatalf("%v is not a *LineError", e)
		}
		got[le.Line] = le.Reason
	}
	if len(got) != len(want) {
		t.Errorf("errors on lines %v, want %v", got, want)
	}
	for line, w := range want {
		if !strings.Contains(got[line], w) {
			t.Errorf("line %d: %q, want it to say %q", line, got[line], w)
		}
	}
}

func TestUsersHashPassword(t *testing.T) {
	for _, pw := range []string{"", strings.Repeat("x", MaxPassword+1)} {
		if _, err := HashPassword(pw, MinCost); !errors.Is(err, ErrBadPassword) {
			t.Errorf("HashPassword(%d bytes): %v, want ErrBadPassword", len(pw), err)
		}
	}
	if _, err := HashPassword("pw", MaxCost+1); err == nil {
		t.Error("a cost past MaxCost is accepted")
	}
	h := hash(t, strings.Repeat("y", MaxPassword))
	u, err := ParseUsers(strings.NewReader(Line("u", []byte(h))))
	if err != nil || !u.Authenticate("u", strings.Repeat("y", MaxPassword)) {
		t.Fatalf("a %d-byte password: %v", MaxPassword, err)
	}
}

// FuzzParseUsers checks that any users file parses or fails without
// panicking, and that every user it accepts prints back (Line) to a file
// that parses to the same user and hash.
func FuzzParseUsers(f *testing.F) {
	h := hash(f, "secret")
	f.Add("alice:" + h + "\n")
	f.Add("# c\n\nbob:" + h + "\r\nalice:" + h)
	f.Add("a:b:c\n:\n\x00:" + h)
	f.Add("é:" + h + "\nx:$2y$04$" + strings.Repeat("a", 53))
	f.Fuzz(func(t *testing.T, file string) {
		u, err := ParseUsers(strings.NewReader(file))
		if err != nil {
			if u != nil {
				t.Fatal("users and an error")
			}
			return
		}
		for _, name := range u.Names() {
			if err := ValidUsername(name); err != nil {
				t.Fatalf("accepted user %q: %v", name, err)
			}
			again, err := ParseUsers(strings.NewReader(Line(name, u.hashes[name])))
			if err != nil || again.Len() != 1 || string(again.hashes[name]) != string(u.hashes[name]) {
				t.Fatalf("user %q does not round-trip: %v", name, err)
			}
		}
	})
}
