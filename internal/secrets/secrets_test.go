package secrets

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func newBoxAt(t *testing.T) (*Box, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secrets.key")
	b, err := OpenBox(path)
	if err != nil {
		t.Fatal(err)
	}
	return b, path
}

func TestSealOpen(t *testing.T) {
	b, _ := newBoxAt(t)
	for _, value := range [][]byte{[]byte("sk-live-0123456789"), {}, {0}, bytes.Repeat([]byte{0xff}, 64<<10)} {
		sealed, err := b.Seal("keyabc", "openai", value)
		if err != nil {
			t.Fatal(err)
		}
		if len(sealed) != overhead+len(value) || sealed[0] != version {
			t.Errorf("sealed %d bytes into %d (version %d), want %d (version %d)", len(value), len(sealed), sealed[0], overhead+len(value), version)
		}
		if len(value) > 4 && bytes.Contains(sealed, value) {
			t.Errorf("the sealed value holds the value in clear")
		}
		got, err := b.Open("keyabc", "openai", sealed)
		if err != nil || !bytes.Equal(got, value) {
			t.Errorf("Open = %q, %v; want the value back", got, err)
		}
	}
	// Each seal has its own nonce.
	s1, _ := b.Seal("keyabc", "openai", []byte("v"))
	s2, _ := b.Seal("keyabc", "openai", []byte("v"))
	if bytes.Equal(s1, s2) {
		t.Error("two seals of one value are the same: the nonce repeats")
	}
}

func TestOpenRefuses(t *testing.T) {
	b, _ := newBoxAt(t)
	value := []byte("sk-live-0123456789")
	sealed, err := b.Seal("keyabc", "openai", value)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := newBoxAt(t)
	type openCase struct {
		desc           string
		box            *Box
		owner, secname string
		sealed         []byte
	}
	tests := []openCase{
		{"another owner", b, "keyabd", "openai", sealed},
		{"another name", b, "keyabc", "openai2", sealed},
		{"owner and name shifted", b, "keyab", "copenai", sealed},
		{"another key", other, "keyabc", "openai", sealed},
		{"truncated", b, "keyabc", "openai", sealed[:len(sealed)-1]},
		{"too short", b, "keyabc", "openai", sealed[:overhead-1]},
		{"empty", b, "keyabc", "openai", nil},
		{"unknown version", b, "keyabc", "openai", append([]byte{2}, sealed[1:]...)},
	}
	for i := range sealed {
		tampered := bytes.Clone(sealed)
		tampered[i] ^= 0x01
		tests = append(tests, openCase{fmt.Sprintf("byte %d changed", i), b, "keyabc", "openai", tampered})
	}
	for _, tt := range tests {
		t.Run(tt.desc, func(t *testing.T) {
			got, err := tt.box.Open(tt.owner, tt.secname, tt.sealed)
			if err == nil {
				t.Fatalf("opened to %q", got)
			}
			if strings.Contains(err.Error(), string(value)) {
				t.Errorf("the error holds the value: %v", err)
			}
		})
	}
}

func TestKeyFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "home")
	path := filepath.Join(dir, "secrets.key")
	b, err := OpenBox(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != KeySize {
		t.Fatalf("key file: %v, %v; want %d bytes, mode 0600", fi, err, KeySize)
	}
	if di, err := os.Stat(dir); err != nil || di.Mode().Perm() != 0o700 {
		t.Errorf("key directory: %v, %v; want mode 0700", di, err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*tmp*")); len(left) != 0 {
		t.Errorf("temporary files left: %q", left)
	}
	sealed, err := b.Seal("keyabc", "openai", []byte("v1"))
	if err != nil {
		t.Fatal(err)
	}

	// A later start reads the same key: old values open.
	again, err := OpenBox(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := again.Open("keyabc", "openai", sealed); err != nil || string(got) != "v1" {
		t.Fatalf("the reloaded key opens %q, %v", got, err)
	}
	if fi2, _ := os.Stat(path); !os.SameFile(fi, fi2) {
		t.Error("OpenBox replaced an existing key file")
	}
}

func TestKeyFileCreatedOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secrets.key")
	const n = 8
	boxes := make([]*Box, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { boxes[i], errs[i] = OpenBox(path) })
	}
	wg.Wait()
	sealed, err := func() ([]byte, error) {
		if errs[0] != nil {
			return nil, errs[0]
		}
		return boxes[0].Seal("o", "n", []byte("x"))
	}()
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("OpenBox %d: %v", i, errs[i])
		}
		if _, err := boxes[i].Open("o", "n", sealed); err != nil {
			t.Errorf("box %d has another key: %v", i, err)
		}
	}
}

func TestBadKeyFile(t *testing.T) {
	tests := []struct {
		name string
		make func(path string) error
		want string
	}{
		{"too short", func(p string) error { return os.WriteFile(p, make([]byte, KeySize-1), 0o600) }, "holds 31 bytes, not 32: restore it"},
		{"too long", func(p string) error { return os.WriteFile(p, make([]byte, KeySize+1), 0o600) }, "holds 33 bytes, not 32"},
		{"empty", func(p string) error { return os.WriteFile(p, nil, 0o600) }, "holds 0 bytes"},
		{"readable by others", func(p string) error {
			if err := os.WriteFile(p, make([]byte, KeySize), 0o600); err != nil {
				return err
			}
			return os.Chmod(p, 0o644)
		}, "has mode 0644, so other users may read it: run `chmod 600"},
		{"writable by the group", func(p string) error {
			if err := os.WriteFile(p, make([]byte, KeySize), 0o600); err != nil {
				return err
			}
			return os.Chmod(p, 0o620)
		}, "has mode 0620"},
		{"a directory", func(p string) error { return os.Mkdir(p, 0o700) }, "is not a regular file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "secrets.key")
			if err := tt.make(path); err != nil {
				t.Fatal(err)
			}
			before, _ := os.ReadFile(path)
			_, err := OpenBox(path)
			if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("OpenBox = %v, want a precondition error saying %q", err, tt.want)
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
				t.Error("OpenBox changed a bad key file")
			}
		})
	}
}

func TestLoadOrCreateKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "home")
	path := filepath.Join(dir, "e2b-token.key")
	key, err := LoadOrCreateKey(path, 48)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != 48 || len(key) != 48 {
		t.Fatalf("key file: %v, %v, key of %d bytes; want 48 bytes, mode 0600", fi, err, len(key))
	}
	if di, err := os.Stat(dir); err != nil || di.Mode().Perm() != 0o700 {
		t.Errorf("key directory: %v, %v; want mode 0700", di, err)
	}
	if bytes.Equal(key, make([]byte, 48)) {
		t.Error("the new key is all zeros")
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, key) {
		t.Errorf("the file holds %x, the key is %x", b, key)
	}
	again, err := LoadOrCreateKey(path, 48)
	if err != nil || !bytes.Equal(again, key) {
		t.Fatalf("a later load = %x, %v; want the same key", again, err)
	}
	if fi2, _ := os.Stat(path); !os.SameFile(fi, fi2) {
		t.Error("LoadOrCreateKey replaced an existing key file")
	}
	other, err := LoadOrCreateKey(filepath.Join(dir, "other.key"), 48)
	if err != nil || bytes.Equal(other, key) {
		t.Errorf("another file's key = %x, %v; want a different key", other, err)
	}

	// The size is checked against what the caller asks for.
	_, err = LoadOrCreateKey(path, 32)
	if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), "holds 48 bytes, not 32") {
		t.Errorf("loading a 48-byte key as 32 bytes: %v", err)
	}
	if _, err := LoadOrCreateKey(filepath.Join(dir, "zero.key"), 0); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a key of 0 bytes: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "zero.key")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused size made a file: %v", err)
	}
}

func TestLoadOrCreateKeyOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "e2b-token.key")
	const n = 8
	keys := make([][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { keys[i], errs[i] = LoadOrCreateKey(path, 32) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || !bytes.Equal(keys[i], keys[0]) {
			t.Errorf("load %d = %x, %v; want %x", i, keys[i], errs[i], keys[0])
		}
	}
}

func TestMAC(t *testing.T) {
	dir := t.TempDir()
	a, err := OpenBox(filepath.Join(dir, "a.key"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := OpenBox(filepath.Join(dir, "a.key"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := OpenBox(filepath.Join(dir, "b.key"))
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("POST\n/v1/secrets\n{\"value\":\"x\"}")
	if !bytes.Equal(a.MAC(data), again.MAC(data)) {
		t.Error("the same key gives another MAC")
	}
	if bytes.Equal(a.MAC(data), b.MAC(data)) {
		t.Error("two keys give the same MAC")
	}
	if bytes.Equal(a.MAC(data), a.MAC(append(data, '!'))) {
		t.Error("two inputs give the same MAC")
	}
	if sum := sha256.Sum256(data); bytes.Equal(a.MAC(data), sum[:]) {
		t.Error("the MAC is a plain sha256")
	}
}
