package template

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testenv"
)

// needRoot skips a test that builds a root filesystem as another user.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Lacking(t, "building templates needs root")
	}
}

func TestBuildTiny(t *testing.T) {
	needRoot(t)
	if _, err := staticBusybox(context.Background()); err != nil {
		testenv.Lacking(t, "no static busybox: %v", err)
	}
	dd := datadir.Dir{Root: t.TempDir()}
	s := Open(dd)
	var out bytes.Buffer
	cfg := BuildConfig{Cache: dd.Cache(), Out: &out}
	tpl, err := s.BuildBuiltin(context.Background(), "tiny", cfg)
	if err != nil {
		t.Fatalf("BuildBuiltin(tiny): %v\n%s", err, out.String())
	}
	t.Logf("tiny: %s, %d bytes\n%s", tpl.Digest, tpl.SizeBytes, out.String())
	if tpl.Ref() != "tiny:latest" || tpl.MemoryMiB != 256 || tpl.DiskMiB != 256 || tpl.VCPUs != 1 {
		t.Errorf("tiny = %+v", tpl)
	}
	for cmd, want := range map[string]string{
		"cat /etc/passwd":   "root:x:0:0:root:/root:/bin/sh\n",
		"stat /bin/sh":      "Fast link dest: \"/bin/busybox\"",
		"stat /tmp":         "Mode:  01777",
		"stat /bin/busybox": "User:     0   Group:     0",
	} {
		got, err := exec.Command("debugfs", "-R", cmd, tpl.Image).Output()
		if err != nil || !strings.Contains(string(got), want) {
			t.Errorf("debugfs %s = %q, %v, want it to contain %q", cmd, got, err, want)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dd.Cache(), "rootfs-*")); len(left) > 0 {
		t.Errorf("build trees left behind: %q", left)
	}
}

func TestBuildBuiltinUnknown(t *testing.T) {
	s := Open(datadir.Dir{Root: t.TempDir()})
	_, err := s.BuildBuiltin(context.Background(), "huge", BuildConfig{Cache: t.TempDir()})
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("BuildBuiltin(huge) = %v, want ErrInvalid", err)
	}
}
