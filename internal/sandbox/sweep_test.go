package sandbox

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/vm"
)

func TestSweep(t *testing.T) {
	dir := datadir.Dir{Root: t.TempDir()}
	old := time.Now().Add(-2 * sweepGrace)
	mk := func(name string, age time.Time) string {
		p := dir.Sandbox(name)
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(p, "disk.qcow2"), []byte("x"), 0o600)
		os.WriteFile(filepath.Join(p, vm.PIDFileName), []byte("999999999\n"), 0o600)
		os.Chtimes(p, age, age)
		return p
	}
	abandoned := mk("sbxabandoned", old)
	owned := mk("sbxowned", old)
	fresh := mk("sbxfresh", time.Now())
	live := mk("sbxlive", old)
	startFakeQEMU(t, live)
	os.Chtimes(live, old, old)
	// A suspended sandbox has no QEMU and no owner, only its saved state.
	suspended := mk("sbxsuspended", old)
	os.WriteFile(filepath.Join(suspended, StateName), []byte("QEVM"), 0o600)
	os.Chtimes(suspended, old, old)
	// A suspend that died mid-save left only a temporary file: abandoned.
	halfSaved := mk("sbxhalfsaved", old)
	os.WriteFile(filepath.Join(halfSaved, "."+StateName+".tmp-1"), []byte("QEVM"), 0o600)
	os.Chtimes(halfSaved, old, old)
	lock, err := lockOwner(owned)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	os.Chtimes(owned, old, old)

	Sweep(dir, slog.New(slog.DiscardHandler))

	for p, wantGone := range map[string]bool{abandoned: true, owned: false, fresh: false, live: false, suspended: false, halfSaved: true} {
		_, err := os.Stat(p)
		if gone := os.IsNotExist(err); gone != wantGone {
			t.Errorf("%s: gone %v, want %v", filepath.Base(p), gone, wantGone)
		}
	}
}
