package cli

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/clustertls"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// `airlock cluster-certs DIR` makes what `--cluster-tls` loads, and
// refuses bad arguments and a directory that holds a CA already, leaving
// it as it was.
func TestClusterCerts(t *testing.T) {
	dir := testClusterTLS(t)
	for sub, role := range map[string]string{"node": clustertls.RoleNode, "server": clustertls.RoleServer} {
		if _, err := clustertls.Load(filepath.Join(dir, sub), role); err != nil {
			t.Errorf("%s: %v", sub, err)
		}
	}
	ca, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want error
		says string
	}{
		{nil, errdefs.ErrInvalid, "give one DIR"},
		{[]string{dir, "more"}, errdefs.ErrInvalid, "give one DIR"},
		{[]string{"--validity", "1m", filepath.Join(t.TempDir(), "x")}, errdefs.ErrInvalid, "shorter than an hour"},
		{[]string{"--validity", "soon", filepath.Join(t.TempDir(), "x")}, errdefs.ErrInvalid, "invalid value"},
		{[]string{dir}, errdefs.ErrConflict, "already holds a cluster CA"},
	} {
		var out bytes.Buffer
		err := Run(t.Context(), &Env{Stdout: &out, Stderr: &out}, append([]string{"cluster-certs"}, c.args...))
		if !errors.Is(err, c.want) || ExitCode(err) != 2 || !strings.Contains(Message(err)+out.String(), c.says) {
			t.Errorf("%q: exit %d, %v %s; want %q", c.args, ExitCode(err), err, out.String(), c.says)
		}
	}
	if again, err := os.ReadFile(filepath.Join(dir, "ca.key")); err != nil || !bytes.Equal(again, ca) {
		t.Errorf("the CA's key changed: %v", err)
	}
}
