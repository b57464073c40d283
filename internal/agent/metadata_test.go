package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testenv"
)

func getxattr(t *testing.T, path, name string) (string, error) {
	t.Helper()
	buf := make([]byte, 8<<10)
	n, err := unix.Lgetxattr(path, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

func readAll(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestFileMetadata(t *testing.T) {
	_, c := startAgent(t)
	ctx := context.Background()
	dir := testenv.XattrDir(t)
	path := filepath.Join(dir, "sub", "f.txt")
	md := map[string]string{"author": "mish", "Purpose": "up load", "empty": ""}

	st, err := c.WriteFileMetadata(ctx, path, 0o600, md, strings.NewReader("one"))
	if err != nil || !maps.Equal(st.Metadata, md) || st.Type != "file" || st.SizeBytes != 3 || st.Mode != "0600" {
		t.Fatalf("write: stat %+v, err %v", st, err)
	}
	if v, err := getxattr(t, path, "user.e2b.author"); err != nil || v != "mish" {
		t.Fatalf("user.e2b.author on the file: %q, %v", v, err)
	}
	if v, err := getxattr(t, path, "user.e2b.Purpose"); err != nil || v != "up load" {
		t.Fatalf("user.e2b.Purpose on the file: %q, %v", v, err)
	}
	if st, err := c.Stat(ctx, path); err != nil || !maps.Equal(st.Metadata, md) {
		t.Fatalf("stat: %+v, %v", st, err)
	}
	items, err := c.List(ctx, dir, 2)
	if err != nil || len(items) != 2 || items[0].Metadata != nil || !maps.Equal(items[1].Metadata, md) {
		t.Fatalf("list: %+v, %v", items, err)
	}

	// A write without metadata is a new file without any: the old one's
	// goes with it.
	if err := c.WriteFile(ctx, path, 0, strings.NewReader("two")); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Stat(ctx, path); err != nil || st.Metadata != nil || readAll(t, path) != "two" {
		t.Fatalf("rewritten without metadata: %+v, %v, %q", st, err, readAll(t, path))
	}
	if _, err := getxattr(t, path, "user.e2b.author"); !errors.Is(err, unix.ENODATA) {
		t.Fatalf("user.e2b.author after a rewrite without metadata: %v", err)
	}
}

// Bad metadata is refused before anything is written: the file there
// stays as it was, and a new one is not made.
func TestFileMetadataRefusedChangesNothing(t *testing.T) {
	_, c := startAgent(t)
	ctx := context.Background()
	dir := testenv.XattrDir(t)
	old := filepath.Join(dir, "old")
	if err := os.WriteFile(old, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	many := map[string]string{}
	for i := range agentproto.MaxMetadataKeys + 1 {
		many[fmt.Sprintf("k%d", i)] = "v"
	}
	bad := []map[string]string{
		{"a b": "v"},
		{"": "v"},
		{"k/../x": "v"},
		{"k": "line\nbreak"},
		{"k": strings.Repeat("v", agentproto.MaxMetadataBytes)},
		many,
	}
	for _, md := range bad {
		for _, p := range []string{old, filepath.Join(dir, "new", "file")} {
			_, err := c.WriteFileMetadata(ctx, p, 0, md, bytes.NewReader(make([]byte, 1<<20)))
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("write %s with metadata of %d keys: %v, want invalid", p, len(md), err)
			}
		}
	}
	if got := readAll(t, old); got != "old" {
		t.Errorf("the file there became %q", got)
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 {
		t.Errorf("the directory holds %v (%v), want only the old file", entries, err)
	}
}

// A symlink a tenant placed at the path is replaced, not followed: the
// file it points at gets neither the data nor the metadata.
func TestFileMetadataDoesNotFollowSymlink(t *testing.T) {
	_, c := startAgent(t)
	ctx := context.Background()
	dir := testenv.XattrDir(t)
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("victim"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteFileMetadata(ctx, link, 0, map[string]string{"k": "v"}, strings.NewReader("mine")); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, victim); got != "victim" {
		t.Errorf("the link's target became %q", got)
	}
	if v, err := getxattr(t, victim, "user.e2b.k"); !errors.Is(err, unix.ENODATA) {
		t.Errorf("the link's target got metadata %q (%v)", v, err)
	}
	fi, err := os.Lstat(link)
	if err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("the path is %v (%v), want a regular file", fi.Mode(), err)
	}
	if v, err := getxattr(t, link, "user.e2b.k"); err != nil || v != "v" {
		t.Errorf("the new file's metadata: %q, %v", v, err)
	}
}

// Metadata set in the guest by other means is read as far as a write
// could have set it; a symlink shows its own (none), not its target's.
func TestFileMetadataRead(t *testing.T) {
	_, c := startAgent(t)
	ctx := context.Background()
	dir := testenv.XattrDir(t)
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{
		"user.e2b.good":    "yes",
		"user.e2b.ctl":     "bell\a",
		"user.e2b.bad key": "x",
		"user.other":       "not ours",
		"user.e2b.UPPER":   "kept as set",
	} {
		if err := unix.Setxattr(path, name, []byte(v), 0); err != nil {
			t.Fatalf("set %s: %v", name, err)
		}
	}
	want := map[string]string{"good": "yes", "UPPER": "kept as set"}
	if st, err := c.Stat(ctx, path); err != nil || !maps.Equal(st.Metadata, want) {
		t.Fatalf("stat: %v (%v), want %v", st.Metadata, err, want)
	}
	long := filepath.Join(dir, "long")
	if err := os.WriteFile(long, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(long, "user.e2b.k", []byte(strings.Repeat("v", agentproto.MaxMetadataBytes+1)), 0); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Stat(ctx, long); err != nil || st.Metadata != nil {
		t.Fatalf("stat of a file with a value longer than any a write sets: %d keys (%v)", len(st.Metadata), err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Stat(ctx, link); err != nil || st.Type != "symlink" || st.Metadata != nil {
		t.Fatalf("stat of a link: %+v (%v)", st, err)
	}
}

// A listing too large for one answer, as metadata can make one, is an
// error, not an answer that never comes.
func TestListTooLargeForOneAnswer(t *testing.T) {
	_, c := startAgent(t)
	dir := testenv.XattrDir(t)
	value := []byte(strings.Repeat("v", 3900))
	for i := range 400 {
		p := filepath.Join(dir, fmt.Sprintf("f%03d", i))
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := unix.Setxattr(p, "user.e2b.k", value, 0); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.List(ctx, dir, 1); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "too large") {
		t.Fatalf("list: %v, want invalid: too large", err)
	}
}
