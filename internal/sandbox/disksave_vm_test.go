package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/vm"
)

// stampWriter records when each write of a process's output arrived.
type stampWriter struct {
	mu     sync.Mutex // guards the fields below
	stamps []time.Time
	buf    bytes.Buffer
}

func (w *stampWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stamps = append(w.stamps, time.Now())
	return w.buf.Write(p)
}

// longestGap is the longest time between two writes that arrived within
// [from, to], and how many did.
func (w *stampWriter) longestGap(from, to time.Time) (time.Duration, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var gap time.Duration
	n := 0
	last := from
	for _, s := range w.stamps {
		if s.Before(from) || s.After(to) {
			continue
		}
		n++
		gap = max(gap, s.Sub(last))
		last = s
	}
	return max(gap, to.Sub(last)), n
}

func (w *stampWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.stamps)
}

// writerScript appends a line to /busy.log, and says so on stdout, every
// 20 ms: its output stops while the root filesystem is frozen.
const writerScript = `i=0; while :; do i=$((i+1)); echo line$i >> /busy.log; echo $i; sleep 0.02; done`

// TestSaveDiskVM saves the disk of a real sandbox, running (while a
// process keeps writing), paused and suspended, and makes templates of
// the images: what the sandbox wrote is in them, even unsynced; the
// sandbox's hostname, resolver and CA are not; a sandbox created from
// one sees the files and only its own CA. It reports how long the guest
// stayed frozen, and how long a paused one ran.
func TestSaveDiskVM(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	rt := agentRuntime(t, ctx)
	sb, err := rt.Create(ctx, Spec{Template: "tiny", Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	cur := sb // the Sandbox of id this test owns now, if any
	t.Cleanup(func() {
		if cur != nil {
			cur.Destroy(context.Background())
		}
		rt.Remove(context.Background(), id)
	})
	out := t.TempDir()
	settings := template.Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 256}

	shell(ctx, t, sb, "mkdir -p /data && echo 'saved content' > /data/file.txt")
	stdout := &stampWriter{}
	if _, err := sb.Exec(ctx, agentproto.ExecRequest{Cmd: writerScript}, agentclient.Stdio{Stdout: stdout}); err != nil {
		t.Fatal(err)
	}
	for stdout.count() < 10 {
		time.Sleep(20 * time.Millisecond)
	}

	// Running, while the writer writes.
	running := filepath.Join(out, "running.ext4")
	from := time.Now()
	st, err := sb.saveDisk(ctx, running)
	if err != nil {
		t.Fatal(err)
	}
	to := time.Now()
	gap, lines := stdout.longestGap(from, to)
	t.Logf("running: frozen %s (copy %s), whole save %s, image %d KiB; the writer's longest pause %s, %d lines meanwhile",
		st.Frozen.Round(time.Millisecond), st.Copy.Round(time.Millisecond), st.Total.Round(time.Millisecond), st.Bytes>>10, gap.Round(time.Millisecond), lines)
	if st.Frozen <= 0 || st.Frozen > 30*time.Second {
		t.Errorf("frozen for %s", st.Frozen)
	}
	// The writer goes on after the thaw.
	n := stdout.count()
	testenv.Eventually(t, 10*time.Second, "the writer going on after the save (the guest thawed)", func() (bool, string) {
		return stdout.count() > n, fmt.Sprintf("%d lines, %d before", stdout.count(), n)
	})
	checkSaved(ctx, t, running, map[string]string{"data/file.txt": "saved content\n"}, sb)
	busy, err := ext4Image{path: running}.readFile(ctx, "/busy.log")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(busy, []byte("line1\n")) || !bytes.HasSuffix(busy, []byte("\n")) {
		t.Errorf("the copy of the file being written is torn: %q", busy[max(0, len(busy)-40):])
	}

	// A template of it: a sandbox made from it has the files, and only its
	// own identity.
	tpl, err := rt.Templates().ImportImage(ctx, "saved", "running", running, settings)
	if err != nil {
		t.Fatal(err)
	}
	child, err := rt.Create(ctx, Spec{Template: tpl.Ref()})
	if err != nil {
		t.Fatal(err)
	}
	defer child.Destroy(context.Background())
	if got := shell(ctx, t, child, "cat /data/file.txt"); got != "saved content" {
		t.Errorf("the saved file holds %q in a sandbox of the saved template", got)
	}
	if got := shell(ctx, t, child, "hostname; cat /etc/hostname; grep -c 127.0.1.1 /etc/hosts"); got != child.ID+"\n"+child.ID+"\n1" {
		t.Errorf("the new sandbox's hostname and hosts say %q", got)
	}
	bundle := shell(ctx, t, child, "cat "+agentproto.CABundles()[0])
	if bundle != strings.TrimSpace(string(child.ca.CertPEM())) {
		t.Errorf("the new sandbox's trust store holds %q, want its own CA alone", bundle)
	}

	// Paused: it stays paused, and what was written before the pause,
	// never synced, is in the copy.
	shell(ctx, t, sb, "echo 'before the pause' > /data/paused.txt")
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	paused := filepath.Join(out, "paused.ext4")
	if st, err = sb.saveDisk(ctx, paused); err != nil {
		t.Fatal(err)
	}
	t.Logf("paused: ran %s for the freeze and the thaw, frozen %s (copy %s), whole save %s",
		st.Ran.Round(time.Millisecond), st.Frozen.Round(time.Millisecond), st.Copy.Round(time.Millisecond), st.Total.Round(time.Millisecond))
	if s, err := sb.Machine().Status(ctx); err != nil || s != vm.StatusPaused || !sb.Paused() {
		t.Fatalf("after saving a paused sandbox: status %q, %v, Paused %v; want paused", s, err, sb.Paused())
	}
	if st.Ran <= 0 || st.Ran > st.Total {
		t.Errorf("a paused sandbox ran for %s of a %s save", st.Ran, st.Total)
	}
	checkSaved(ctx, t, paused, map[string]string{"data/file.txt": "saved content\n", "data/paused.txt": "before the pause\n"}, sb)
	if err := sb.Resume(ctx); err != nil {
		t.Fatal(err)
	}

	// Suspended: what was written just before, never synced, is in the
	// copy; only a suspended sandbox's disk is saved so.
	shell(ctx, t, sb, "echo 'before the suspend' > /data/suspended.txt")
	if err := rt.SaveSuspendedDisk(ctx, id, filepath.Join(out, "x.ext4")); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("SaveSuspendedDisk of a live sandbox: got %v, want a conflict", err)
	}
	if err := sb.Suspend(ctx); err != nil {
		t.Fatal(err)
	}
	cur = nil
	suspended := filepath.Join(out, "suspended.ext4")
	if st, err = rt.saveSuspendedDisk(ctx, id, suspended); err != nil {
		t.Fatal(err)
	}
	t.Logf("suspended: copy %s, whole save %s, image %d KiB", st.Copy.Round(time.Millisecond), st.Total.Round(time.Millisecond), st.Bytes>>10)
	checkSaved(ctx, t, suspended, map[string]string{"data/suspended.txt": "before the suspend\n"}, sb)
	if err := sb.SaveDisk(ctx, filepath.Join(out, "x.ext4")); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("SaveDisk of a suspended Sandbox: got %v, want a conflict", err)
	}
	if err := rt.SaveSuspendedDisk(ctx, child.ID, filepath.Join(out, "x.ext4")); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("SaveSuspendedDisk of a sandbox another Sandbox owns: got %v, want a conflict", err)
	}

	// The saved sandbox wakes as it was, its writer still writing.
	if sb, err = rt.Wake(ctx, id); err != nil {
		t.Fatal(err)
	}
	cur = sb
	if got := shell(ctx, t, sb, "cat /data/suspended.txt /etc/hostname"); got != "before the suspend\n"+id {
		t.Errorf("after the wake: %q", got)
	}
	n = strings.Count(shell(ctx, t, sb, "cat /busy.log"), "\n")
	testenv.Eventually(t, 10*time.Second, "the writer writing after the wake", func() (bool, string) {
		m := strings.Count(shell(ctx, t, sb, "cat /busy.log"), "\n")
		return m > n, fmt.Sprintf("%d lines, %d before", m, n)
	})
}

// checkSaved checks that the saved image img is clean, holds want and
// nothing of sb's own: its hostname, resolver and CA.
func checkSaved(ctx context.Context, t *testing.T, img string, want map[string]string, sb *Sandbox) {
	t.Helper()
	if _, err := (ImageTools{}).output(ctx, "e2fsck", nil, nil, "-f", "-n", img); err != nil {
		t.Errorf("the saved image does not check clean: %v", err)
	}
	want = maps.Clone(want)
	want["etc/hostname"] = "airlock\n" // tiny's own
	want["etc/resolv.conf"] = ""
	want["etc/ssl"] = ""
	want["usr/local"] = ""
	checkImage(t, img, want)
	hosts, err := ext4Image{path: img}.readFile(ctx, agentproto.HostsFile)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(hosts, []byte(sb.ID)) {
		t.Errorf("the saved /etc/hosts names the sandbox: %q", hosts)
	}
	for _, b := range agentproto.CABundles() {
		if e, err := (ext4Image{path: img}).stat(ctx, b); err != nil || e.exists() {
			t.Errorf("the saved image has a trust store at %s (%v)", b, err)
		}
	}
}
