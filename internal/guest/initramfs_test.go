package guest

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/cavaliergopher/cpio"
)

// entry is one archive member as read back.
type entry struct {
	mode cpio.FileMode
	data string
}

func readArchive(t *testing.T, r io.Reader) map[string]entry {
	t.Helper()
	got := make(map[string]entry)
	cr := cpio.NewReader(r)
	for {
		hdr, err := cr.Next()
		if errors.Is(err, io.EOF) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(cr)
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Uid != 0 || hdr.Guid != 0 {
			t.Errorf("%s owned by %d:%d, want 0:0", hdr.Name, hdr.Uid, hdr.Guid)
		}
		got[hdr.Name] = entry{mode: hdr.Mode, data: string(b)}
	}
}

func TestWriteInitramfs(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	agent := write("agent", "AGENT")
	mods := []Module{
		{Name: "virtio", Path: write("virtio.ko", "V")},
		{Name: "virtio_rng", Path: write("virtio-rng.ko", "RNG")},
	}
	var buf bytes.Buffer
	if err := writeInitramfs(&buf, agent, mods); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(buf.Bytes(), []byte("070701")) {
		t.Fatalf("archive starts with %q, want the newc magic 070701", buf.Bytes()[:6])
	}
	got := readArchive(t, &buf)
	want := map[string]entry{
		"dev":                       {cpio.TypeDir | 0o755, ""},
		"proc":                      {cpio.TypeDir | 0o755, ""},
		"sys":                       {cpio.TypeDir | 0o755, ""},
		"tmp":                       {cpio.TypeDir | 0o1777, ""},
		"mnt":                       {cpio.TypeDir | 0o755, ""},
		"etc":                       {cpio.TypeDir | 0o755, ""},
		"etc/airlock":               {cpio.TypeDir | 0o755, ""},
		"lib":                       {cpio.TypeDir | 0o755, ""},
		"lib/modules":               {cpio.TypeDir | 0o755, ""},
		"init":                      {cpio.TypeReg | 0o755, "AGENT"},
		"lib/modules/virtio.ko":     {cpio.TypeReg | 0o644, "V"},
		"lib/modules/virtio_rng.ko": {cpio.TypeReg | 0o644, "RNG"},
		"etc/airlock/modules":       {cpio.TypeReg | 0o644, "/lib/modules/virtio.ko\n/lib/modules/virtio_rng.ko\n"},
	}
	if !reflect.DeepEqual(got, want) {
		for name, e := range got {
			if w, ok := want[name]; !ok || w != e {
				t.Errorf("archive has %s %v %q, want %v %q (present %v)", name, e.mode, e.data, w.mode, w.data, ok)
			}
		}
		for name := range want {
			if _, ok := got[name]; !ok {
				t.Errorf("archive lacks %s", name)
			}
		}
	}
}

func TestWriteInitramfsMissingAgent(t *testing.T) {
	err := writeInitramfs(io.Discard, filepath.Join(t.TempDir(), "nope"), nil)
	if err == nil {
		t.Fatal("writeInitramfs with a missing agent succeeded")
	}
}
