package cli

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// Bad flags, a host not set up and missing Kubernetes binaries are
// refused with exit status 2 and leave no cluster directory; a down with
// nothing to stop succeeds and says so.
func TestLocalClusterRefusals(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "cluster")
	bin := filepath.Join(root, "kube")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	base := []string{"localcluster", "--dir", dir}
	for _, tc := range []struct {
		args  []string
		class error
		want  string
	}{
		{append(base, "--kube-bin", bin, "--nodes", "0"), errdefs.ErrInvalid, "between 1 and 8"},
		{append(base, "--kube-bin", bin, "--replicas", "9"), errdefs.ErrInvalid, "between 1 and 8"},
		{append(base, "--kube-bin", bin, "--node-cpus", "0"), errdefs.ErrInvalid, "--node-cpus must be at least 1"},
		{append(base, "--kube-bin", bin, "--nodes", "two"), errdefs.ErrInvalid, "invalid value"},
		{base, errdefs.ErrInvalid, "--kube-bin (or $AIRLOCK_KUBE_BIN) is needed"},
		{append(base, "--kube-bin", bin, "extra"), errdefs.ErrInvalid, "unexpected argument"},
		{[]string{"localcluster", "down", "--dir", dir, "extra"}, errdefs.ErrInvalid, "unexpected argument"},
		// The data directory is not set up.
		{append(base, "--kube-bin", bin), errdefs.ErrPrecondition, "is not set up (no kernel)"},
	} {
		var out, errb bytes.Buffer
		t.Setenv("AIRLOCK_KUBE_BIN", "")
		env := &Env{Stdout: &out, Stderr: &errb, Dir: datadir.Dir{Root: filepath.Join(root, "home")}, Log: slog.New(slog.DiscardHandler)}
		err := Run(t.Context(), env, tc.args)
		if !errors.Is(err, tc.class) || ExitCode(err) != 2 || !strings.Contains(Message(err), tc.want) {
			t.Errorf("%q: exit %d, %v; want %q", tc.args, ExitCode(err), err, tc.want)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%q left the cluster directory: %v", tc.args, err)
		}
	}

	// Set up, but without the binaries.
	home := datadir.Dir{Root: filepath.Join(root, "home")}
	if err := os.MkdirAll(home.Boot(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(home.Kernel(), []byte("kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	env := &Env{Stdout: &out, Stderr: &errb, Dir: home, Log: slog.New(slog.DiscardHandler)}
	err := Run(t.Context(), env, append(base, "--kube-bin", bin))
	if !errors.Is(err, errdefs.ErrPrecondition) || ExitCode(err) != 2 || !strings.Contains(Message(err), "no etcd in") {
		t.Errorf("no binaries: exit %d, %v", ExitCode(err), err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a failed start left the cluster directory: %v", err)
	}

	errb.Reset()
	if err := Run(t.Context(), env, []string{"localcluster", "down", "--dir", dir}); err != nil || !strings.Contains(errb.String(), "no local cluster in "+dir) {
		t.Errorf("down with nothing to stop: %v %q", err, errb.String())
	}
}
