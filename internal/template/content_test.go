package template

import (
	"context"
	"os/exec"
	"testing"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/testenv"
)

// A linked template resolves in the new store to the same image, and
// removing it there leaves the other store's image.
func TestLink(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		testenv.Lacking(t, "mkfs.ext4 not found")
	}
	host := Open(datadir.Dir{Root: t.TempDir()})
	orig, err := host.Import(context.Background(), "tiny", "", smallTree(t, "one\n"), Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	own := Open(datadir.Dir{Root: t.TempDir()})
	linked, err := own.Link(host, "tiny")
	if err != nil {
		t.Fatal(err)
	}
	if linked.Digest != orig.Digest || linked.Ref() != "tiny:latest" || linked.Image == orig.Image || linked.SizeBytes != orig.SizeBytes {
		t.Errorf("linked %+v, from %+v", linked, orig)
	}
	if err := own.Untag("tiny", "latest"); err != nil {
		t.Fatal(err)
	}
	if err := own.RemoveImage(linked.Digest); err != nil {
		t.Fatal(err)
	}
	if _, err := host.Resolve("tiny"); err != nil {
		t.Errorf("removing the link removed the original: %v", err)
	}
	if _, err := own.Link(host, "nosuch"); err == nil {
		t.Error("linked a template that does not exist")
	}
}
