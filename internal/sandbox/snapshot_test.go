package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/vm"
)

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestSnapshotKey(t *testing.T) {
	// A cold snapshot's: a server without a readiness check starts in
	// each clone.
	k, err := newSnapshotKey(template.Template{Name: "t", Tag: "latest", Digest: testDigest, StartCmd: "serve"}, Spec{VCPUs: 2, MemoryMiB: 512})
	if err != nil {
		t.Fatal(err)
	}
	w, err := newSnapshotKey(template.Template{Name: "t", Tag: "latest", Digest: testDigest}, Spec{VCPUs: 2, MemoryMiB: 512})
	if err != nil {
		t.Fatal(err)
	}
	if w.warm == "" || w.name() != k.name()+"-w"+w.warm {
		t.Errorf("the snapshot of a template without a server is %q, not warm", w.name())
	}
	if got, want := k.name(), strings.TrimPrefix(testDigest, "sha256:")+"-2c-512m"; got != want {
		t.Errorf("name %q, want %q", got, want)
	}
	if got, want := k.short(), "0123456789abcdef-2c-512m"; got != want {
		t.Errorf("short %q, want %q", got, want)
	}
	if _, err := newSnapshotKey(template.Template{Name: "t", Tag: "latest"}, Spec{VCPUs: 1, MemoryMiB: 256}); err == nil {
		t.Error("a template without a digest got a snapshot key")
	}
}

// fakeSnapshot lays out a whole snapshot of key in r's data directory, as
// buildSnapshot leaves it, and returns its record.
func fakeSnapshot(t *testing.T, r *Runtime, key snapshotKey, origin string) snapshotRecord {
	t.Helper()
	dir := r.snapshotDir(key)
	mkdir(t, dir)
	mem := filepath.Join(dir, snapshotMemName)
	f, err := os.Create(mem)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(int64(key.memoryMiB) << 20) // sparse
	f.Close()
	if err := os.WriteFile(filepath.Join(dir, snapshotStateName), []byte("QEVM state"), 0o644); err != nil {
		t.Fatal(err)
	}
	rec := snapshotRecord{
		Template: key.digest, VCPUs: key.vcpus, MemoryMiB: key.memoryMiB, Origin: origin,
		VM: vm.Config{Accel: r.accel, VCPUs: key.vcpus, MemoryMiB: key.memoryMiB, Dir: dir, MemoryFile: mem, MemoryShared: true,
			NetMAC: gateway.GuestMAC},
		StateBytes: int64(len("QEVM state")), ID: "made-once", BuiltAt: time.Now(),
	}
	writeSnapshotRecord(t, dir, rec)
	return rec
}

func writeSnapshotRecord(t *testing.T, dir string, rec snapshotRecord) {
	t.Helper()
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, snapshotRecordName), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadSnapshot(t *testing.T) {
	const origin = "vmlinux:1:2 initramfs.cpio:3:4 qemu:5:6"
	key := snapshotKey{digest: testDigest, vcpus: 1, memoryMiB: 64}
	tests := []struct {
		name   string
		damage func(t *testing.T, dir string, rec snapshotRecord)
		want   string // in the error; "" for a usable snapshot
	}{
		{"whole", func(*testing.T, string, snapshotRecord) {}, ""},
		{"absent", func(t *testing.T, dir string, _ snapshotRecord) { os.RemoveAll(dir) }, "there is none"},
		{"no record", func(t *testing.T, dir string, _ snapshotRecord) {
			os.Remove(filepath.Join(dir, snapshotRecordName))
		}, "there is none"},
		{"marked broken", func(t *testing.T, dir string, _ snapshotRecord) {
			os.WriteFile(filepath.Join(dir, snapshotBrokenName), []byte("qemu said no\n"), 0o644)
		}, "marked broken: qemu said no"},
		{"other boot artifacts", func(t *testing.T, dir string, rec snapshotRecord) {
			rec.Origin = "vmlinux:1:3 initramfs.cpio:3:4 qemu:5:6"
			writeSnapshotRecord(t, dir, rec)
		}, "boot artifacts or QEMU changed"},
		{"other accelerator", func(t *testing.T, dir string, rec snapshotRecord) {
			rec.VM.Accel = vm.AccelKVM
			writeSnapshotRecord(t, dir, rec)
		}, "made for accelerator kvm"},
		{"made without a network device", func(t *testing.T, dir string, rec snapshotRecord) {
			rec.VM.NetMAC = ""
			writeSnapshotRecord(t, dir, rec)
		}, "without the network device"},
		{"other memory size", func(t *testing.T, dir string, rec snapshotRecord) {
			rec.MemoryMiB = 128
			writeSnapshotRecord(t, dir, rec)
		}, "record is of"},
		{"memory file elsewhere", func(t *testing.T, dir string, rec snapshotRecord) {
			rec.VM.MemoryFile = "/elsewhere/mem"
			writeSnapshotRecord(t, dir, rec)
		}, "names memory file /elsewhere/mem"},
		{"memory file missing", func(t *testing.T, dir string, _ snapshotRecord) {
			os.Remove(filepath.Join(dir, snapshotMemName))
		}, "memory file is missing or not 64 MiB"},
		{"memory file short", func(t *testing.T, dir string, _ snapshotRecord) {
			os.Truncate(filepath.Join(dir, snapshotMemName), 1<<20)
		}, "memory file is missing or not 64 MiB"},
		{"state truncated", func(t *testing.T, dir string, _ snapshotRecord) {
			os.Truncate(filepath.Join(dir, snapshotStateName), 4)
		}, "state file is missing or not the 10 bytes recorded"},
		{"state missing", func(t *testing.T, dir string, _ snapshotRecord) {
			os.Remove(filepath.Join(dir, snapshotStateName))
		}, "state file is missing"},
		{"record unreadable", func(t *testing.T, dir string, _ snapshotRecord) {
			os.WriteFile(filepath.Join(dir, snapshotRecordName), []byte("{"), 0o644)
		}, "read snapshot.json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := testRuntime(t)
			r.accel = vm.AccelTCG
			rec := fakeSnapshot(t, r, key, origin)
			tc.damage(t, r.snapshotDir(key), rec)
			snap, got, err := r.loadSnapshot(key, origin)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("got %v, want an error saying %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			dir := r.snapshotDir(key)
			if snap.Dir != dir || snap.MemFile != filepath.Join(dir, snapshotMemName) || snap.StateFile != filepath.Join(dir, snapshotStateName) || !reflect.DeepEqual(snap.VM, rec.VM) || got.ID != rec.ID {
				t.Errorf("loaded %+v (record %+v), want the snapshot in %s", snap, got, dir)
			}
		})
	}
}

func TestReplaceSnapshot(t *testing.T) {
	key := snapshotKey{digest: testDigest, vcpus: 1, memoryMiB: 64}
	for _, old := range []bool{false, true} {
		t.Run(map[bool]string{false: "none before", true: "over an old one"}[old], func(t *testing.T) {
			r := testRuntime(t)
			final := r.snapshotDir(key)
			if old {
				mkdir(t, final)
				os.WriteFile(filepath.Join(final, snapshotMemName), []byte("old"), 0o644)
			}
			build := filepath.Join(r.cfg.Dir.Snapshots(), snapshotBuildPrefix+key.short()+"-1")
			mkdir(t, build)
			os.WriteFile(filepath.Join(build, snapshotMemName), []byte("new"), 0o644)
			if err := r.replaceSnapshot(key, build, final); err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(final, snapshotMemName)); err != nil || string(b) != "new" {
				t.Errorf("the snapshot's memory file reads %q, %v; want the new one", b, err)
			}
			entries, _ := os.ReadDir(r.cfg.Dir.Snapshots())
			if len(entries) != 1 {
				t.Errorf("the snapshots directory holds %v, want only the snapshot", entries)
			}
		})
	}
}

func TestClearSnapshotLeftovers(t *testing.T) {
	r := testRuntime(t)
	key := snapshotKey{digest: testDigest, vcpus: 1, memoryMiB: 64}
	other := snapshotKey{digest: testDigest, vcpus: 2, memoryMiB: 64}
	root := r.cfg.Dir.Snapshots()
	for _, d := range []string{
		snapshotBuildPrefix + key.short() + "-1", snapshotOldPrefix + key.short() + "-2",
		snapshotBuildPrefix + other.short() + "-3", key.name(),
	} {
		mkdir(t, filepath.Join(root, d, "x"))
	}
	r.clearSnapshotLeftovers(key)
	var left []string
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		left = append(left, e.Name())
	}
	want := []string{snapshotBuildPrefix + other.short() + "-3", key.name()}
	if strings.Join(left, " ") != strings.Join(want, " ") {
		t.Errorf("left %v, want %v", left, want)
	}
}

func TestLockFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	ctx := t.Context()
	sh1, err := lockFile(ctx, path, unix.LOCK_SH)
	if err != nil {
		t.Fatal(err)
	}
	sh2, err := lockFile(ctx, path, unix.LOCK_SH)
	if err != nil {
		t.Fatalf("a second shared lock: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := lockFile(short, path, unix.LOCK_EX); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("an exclusive lock beside shared ones: got %v, want to wait until the context ends", err)
	}
	got := make(chan error, 1)
	go func() {
		ex, err := lockFile(ctx, path, unix.LOCK_EX)
		if err == nil {
			ex.Close()
		}
		got <- err
	}()
	sh1.Close()
	select {
	case err := <-got:
		t.Fatalf("an exclusive lock was taken while a shared one is held (%v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	sh2.Close()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the exclusive lock was not taken once the shared ones were released")
	}
}

func TestRecentBuildFailure(t *testing.T) {
	r := testRuntime(t)
	key := snapshotKey{digest: testDigest, vcpus: 1, memoryMiB: 64}
	if err := r.recentBuildFailure(key); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	r.failedBuilds = map[snapshotKey]failedBuild{key: {time.Now(), boom}}
	if err := r.recentBuildFailure(key); !errors.Is(err, boom) {
		t.Fatalf("right after a failure: got %v, want it", err)
	}
	r.failedBuilds[key] = failedBuild{time.Now().Add(-snapshotRetryAfter), boom}
	if err := r.recentBuildFailure(key); err != nil {
		t.Fatalf("after the wait: got %v, want another try", err)
	}
}

func TestSweepSnapshots(t *testing.T) {
	r := testRuntime(t)
	free := snapshotKey{digest: testDigest, vcpus: 1, memoryMiB: 64}
	held := snapshotKey{digest: testDigest, vcpus: 2, memoryMiB: 64}
	root := r.cfg.Dir.Snapshots()
	for _, d := range []string{
		snapshotBuildPrefix + free.short() + "-1", snapshotOldPrefix + free.short() + "-2", free.name(),
		snapshotBuildPrefix + held.short() + "-3",
	} {
		mkdir(t, filepath.Join(root, d, "x"))
	}
	for _, k := range []snapshotKey{free, held} {
		os.WriteFile(r.snapshotLock(k), nil, 0o600)
	}
	lock, err := lockFile(t.Context(), r.snapshotLock(held), unix.LOCK_SH)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	Sweep(r.cfg.Dir, testLog(t))
	var left []string
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if e.IsDir() {
			left = append(left, e.Name())
		}
	}
	want := []string{snapshotBuildPrefix + held.short() + "-3", free.name()}
	if strings.Join(left, " ") != strings.Join(want, " ") {
		t.Errorf("left %v, want %v", left, want)
	}
}

func TestPrepareSnapshotsRefuses(t *testing.T) {
	r := testRuntime(t)
	err := r.PrepareSnapshots(t.Context(), Spec{Template: "nope"}, Spec{Template: "Bad Ref"})
	if !errors.Is(err, errdefs.ErrNotFound) || !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("got %v, want not found and invalid", err)
	}
	if err := r.PrepareSnapshots(t.Context()); err != nil {
		t.Fatalf("no specs: %v", err)
	}
}

// A snapshot made through another path to the same directory (a data
// directory linking another's snapshots) is usable, and named by this
// runtime's path.
func TestLoadSnapshotThroughLink(t *testing.T) {
	r := testRuntime(t)
	r.accel = vm.AccelTCG
	key := snapshotKey{digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", vcpus: 1, memoryMiB: 64}
	const origin = "vmlinux:1:1 initramfs.cpio:1:1 qemu-system-x86_64:1:1"
	rec := fakeSnapshot(t, r, key, origin)
	link := filepath.Join(t.TempDir(), "other-home-snapshots")
	if err := os.Symlink(r.snapshotsRoot(), link); err != nil {
		t.Fatal(err)
	}
	rec.VM.MemoryFile = filepath.Join(link, key.name(), snapshotMemName)
	writeSnapshotRecord(t, r.snapshotDir(key), rec)
	snap, _, err := r.loadSnapshot(key, origin)
	if err != nil {
		t.Fatalf("a snapshot recorded through a link: %v", err)
	}
	rec.VM.MemoryFile = filepath.Join(t.TempDir(), snapshotMemName)
	os.WriteFile(rec.VM.MemoryFile, nil, 0o644)
	writeSnapshotRecord(t, r.snapshotDir(key), rec)
	if _, _, err := r.loadSnapshot(key, origin); err == nil || !strings.Contains(err.Error(), "names memory file") {
		t.Errorf("a record naming another file: %v", err)
	}
	if want := filepath.Join(r.snapshotDir(key), snapshotMemName); snap.VM.MemoryFile != want {
		t.Errorf("memory file %s, want this runtime's path %s", snap.VM.MemoryFile, want)
	}
}
