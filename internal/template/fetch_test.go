package template

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testenv"
)

// An exported image goes into another store only as exactly its bytes:
// the copy resolves by digest with the same settings and content, and a
// stream that is short, long, altered or not ext4, or settings that are
// not valid, store nothing.
func TestPutFetched(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		testenv.Lacking(t, "mkfs.ext4 not found")
	}
	ctx := context.Background()
	from := Open(datadir.Dir{Root: t.TempDir()})
	orig, err := from.Import(ctx, "tiny", "", smallTree(t, "fetched\n"), Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 512, StartCmd: "sleep 1000"})
	if err != nil {
		t.Fatal(err)
	}
	e, f, err := from.Export(orig.Digest)
	if err != nil {
		t.Fatal(err)
	}
	content, err := io.ReadAll(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if e.SizeBytes != int64(len(content)) || e.Settings.StartCmd != "sleep 1000" || e.Settings.DiskMiB != 512 {
		t.Fatalf("export %+v of %d bytes", e, len(content))
	}

	to := Open(datadir.Dir{Root: t.TempDir()})
	altered := bytes.Clone(content)
	altered[len(altered)/2] ^= 1
	notExt4 := bytes.Clone(content)
	notExt4[ext4MagicOffset] ^= 0xff
	notExt4Export := e
	notExt4Export.Digest = "sha256:" + sha256Hex(notExt4)
	badSettings := e
	badSettings.Settings.VCPUs = 0
	huge := e
	huge.SizeBytes = MaxFetchBytes + 1
	for _, c := range []struct {
		name string
		e    Export
		r    io.Reader
		want string
	}{
		{"altered", e, bytes.NewReader(altered), "hash to"},
		{"short", e, bytes.NewReader(content[:len(content)-1]), "want"},
		{"long", e, io.MultiReader(bytes.NewReader(content), strings.NewReader("x")), "want"},
		{"not ext4", notExt4Export, bytes.NewReader(notExt4), "not an ext4 image"},
		{"bad settings", badSettings, bytes.NewReader(content), "must be positive"},
		{"huge", huge, bytes.NewReader(content), "is not between"},
		{"bad digest", Export{Digest: "sha256:../../x", SizeBytes: 1}, bytes.NewReader(content), "not sha256"},
		{"read error", e, io.MultiReader(bytes.NewReader(content[:10]), errReader{}), "cut"},
	} {
		_, err := to.PutFetched(ctx, c.e, c.r)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want one saying %q", c.name, err, c.want)
		}
		if c.name != "read error" && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: %v is not ErrInvalid", c.name, err)
		}
		if _, err := to.Resolve(c.e.Digest); !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: stored anyway: %v", c.name, err)
		}
	}
	if left, _ := os.ReadDir(to.dir); len(left) != 0 {
		t.Errorf("failed fetches left %v in the store", left)
	}

	got, err := to.PutFetched(ctx, e, bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != orig.Digest || got.Name != "" || got.StartCmd != "sleep 1000" || got.SizeBytes != orig.SizeBytes {
		t.Errorf("fetched %+v, from %+v", got, orig)
	}
	if err := to.Verify(ctx, got); err != nil {
		t.Error(err)
	}
	if fi, err := os.Stat(got.Image); err != nil || fi.Mode().Perm() != 0o444 || filepath.Dir(got.Image) != to.dir {
		t.Errorf("fetched image %s: %v %v", got.Image, fi, err)
	}
	// Stored already: the stream is not read.
	if _, err := to.PutFetched(ctx, e, errReader{}); err != nil {
		t.Errorf("a second fetch of a stored digest: %v", err)
	}
	if _, _, err := to.Export("sha256:" + strings.Repeat("0", 64)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("export of an unknown digest: %v", err)
	}
	if _, _, err := to.Export("../x"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("export of a malformed digest: %v", err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection cut") }

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
