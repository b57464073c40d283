package service

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/sandbox/sandboxtest"
	"github.com/airlockhq/airlock/internal/store"
)

func tokenService(key byte) *Service {
	return &Service{cfg: Config{TokenKey: bytes.Repeat([]byte{key}, tokenKeySize)}}
}

func TestSandboxAccessToken(t *testing.T) {
	s := tokenService(1)
	const a, b = "sbxaaaaaaaaaaaaaaaaaaaa", "sbxbbbbbbbbbbbbbbbbbbbb"
	ta := s.SandboxAccessToken(a)
	if !regexp.MustCompile(`^ea_[0-9a-f]{40}$`).MatchString(ta) {
		t.Fatalf("token %q, want ea_ and 40 hex digits", ta)
	}
	if strings.Contains(ta, strings.TrimPrefix(a, "sbx")) {
		t.Errorf("the token %q holds the sandbox ID", ta)
	}
	// The same on every call and for every service with the same key: a
	// restarted server gives the same token again.
	if again := s.SandboxAccessToken(a); again != ta {
		t.Errorf("second token %q, first %q", again, ta)
	}
	if same := tokenService(1).SandboxAccessToken(a); same != ta {
		t.Errorf("another service with the key gives %q, want %q", same, ta)
	}
	tb := s.SandboxAccessToken(b)
	if tb == ta {
		t.Errorf("two sandboxes have the token %q", ta)
	}
	other := tokenService(2)
	if to := other.SandboxAccessToken(a); to == ta {
		t.Errorf("two token keys give the token %q", ta)
	}
	// The known answer: HMAC-SHA256(key, "envd-access:" + id), 40 hex digits.
	if got, want := s.SandboxAccessToken("sbx1"), "ea_"+hmacHex(t, bytes.Repeat([]byte{1}, 32), "envd-access:sbx1")[:40]; got != want {
		t.Errorf("token %q, want %q", got, want)
	}

	if !s.CheckSandboxAccessToken(a, ta) || !s.CheckSandboxAccessToken(b, tb) {
		t.Fatal("a sandbox's own token is refused")
	}
	for _, tc := range []struct {
		name, id, token string
	}{
		{"another sandbox's token", a, tb},
		{"another key's token", a, other.SandboxAccessToken(a)},
		{"empty", a, ""},
		{"prefix only", a, "ea_"},
		{"truncated", a, ta[:len(ta)-1]},
		{"longer", a, ta + "0"},
		{"the whole HMAC", a, "ea_" + hmacHex(t, bytes.Repeat([]byte{1}, 32), "envd-access:"+a)},
		{"upper case", a, "ea_" + strings.ToUpper(ta[3:])},
		{"without its prefix", a, ta[3:]},
		{"one digit changed", a, ta[:10] + string(ta[10]^1) + ta[11:]},
		{"the token as the ID", ta, ta},
		{"no sandbox", "", s.SandboxAccessToken("")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if s.CheckSandboxAccessToken(tc.id, tc.token) {
				t.Errorf("CheckSandboxAccessToken(%q, %q) = true", tc.id, tc.token)
			}
		})
	}
}

func TestTokenKeyConfig(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	base := Config{Runtime: RuntimeOf(sandboxtest.New(t, datadir.Dir{Root: t.TempDir()})), Store: st}

	// None given: a random key per service, so tokens differ between them.
	c1, c2 := base, base
	if err := c1.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := c2.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(c1.TokenKey) != tokenKeySize || bytes.Equal(c1.TokenKey, c2.TokenKey) || bytes.Equal(c1.TokenKey, make([]byte, tokenKeySize)) {
		t.Errorf("made token keys %x and %x, want two random %d-byte keys", c1.TokenKey, c2.TokenKey, tokenKeySize)
	}
	s1, s2 := &Service{cfg: c1}, &Service{cfg: c2}
	if s1.SandboxAccessToken("sbx1") == s2.SandboxAccessToken("sbx1") {
		t.Error("two services with random keys give one token")
	}

	// A given key is kept, and copied: changing the caller's slice later
	// changes no token.
	key := bytes.Repeat([]byte{7}, 40)
	c := base
	c.TokenKey = key
	if err := c.Validate(); err != nil || !bytes.Equal(c.TokenKey, key) {
		t.Fatalf("Validate with a key: %x, %v", c.TokenKey, err)
	}
	s := &Service{cfg: c}
	before := s.SandboxAccessToken("sbx1")
	key[0] = 8
	if s.SandboxAccessToken("sbx1") != before {
		t.Error("the service shares the caller's token key")
	}

	short := base
	short.TokenKey = make([]byte, tokenKeySize-1)
	if err := short.Validate(); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "token key is 31 bytes, under 32") {
		t.Errorf("Validate with a short key: %v", err)
	}
}

func hmacHex(t *testing.T, key []byte, msg string) string {
	t.Helper()
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return hex.EncodeToString(m.Sum(nil))
}
