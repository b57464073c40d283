package sandbox

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/vm"
)

// warmTpl is a template with a start command and a readiness check, an
// image of 10 MiB and a default disk of 1 GiB.
func warmTpl() template.Template {
	return template.Template{
		Name: "srv", Tag: "latest", Digest: testDigest, SizeBytes: 10 << 20,
		VCPUs: 1, MemoryMiB: 256, DiskMiB: 1024,
		StartCmd: "exec server", ReadyCmd: "check",
	}
}

func TestStartsWarm(t *testing.T) {
	tpl := warmTpl()
	if got, want := warmDiskMiB(tpl), 10+warmDiskHeadroomMiB; got != want {
		t.Fatalf("warm disk %d MiB, want %d", got, want)
	}
	spec := Spec{VCPUs: 1, MemoryMiB: 256, DiskMiB: 1024}
	tests := []struct {
		name string
		tpl  func(*template.Template)
		spec func(*Spec)
		want bool
	}{
		{"start and ready command", nil, nil, true},
		{"start and ready port", func(t *template.Template) { t.ReadyCmd, t.ReadyPort = "", 8080 }, nil, true},
		{"no readiness check", func(t *template.Template) { t.ReadyCmd = "" }, nil, false},
		{"ready port without a start command", func(t *template.Template) { t.StartCmd, t.ReadyCmd, t.ReadyPort = "", "", 8080 }, nil, true},
		{"no server", func(t *template.Template) { t.StartCmd, t.ReadyCmd = "", "" }, nil, true},
		{"no server, own environment", func(t *template.Template) { t.StartCmd, t.ReadyCmd = "", "" }, func(s *Spec) { s.Env = map[string]string{"A": "b"} }, true},
		{"no server, no start asked", func(t *template.Template) { t.StartCmd, t.ReadyCmd = "", "" }, func(s *Spec) { s.NoStart = true }, true},
		{"no server, disk smaller than the snapshot's", func(t *template.Template) { t.StartCmd, t.ReadyCmd = "", "" }, func(s *Spec) { s.DiskMiB = 10 + warmDiskHeadroomMiB - 1 }, false},
		{"no start asked", nil, func(s *Spec) { s.NoStart = true }, false},
		{"own environment", nil, func(s *Spec) { s.Env = map[string]string{"A": "b"} }, false},
		{"disk as large as the snapshot's", nil, func(s *Spec) { s.DiskMiB = 10 + warmDiskHeadroomMiB }, true},
		{"disk smaller than the snapshot's", nil, func(s *Spec) { s.DiskMiB = 10 + warmDiskHeadroomMiB - 1 }, false},
		{"small default disk", func(t *template.Template) { t.DiskMiB = 64 }, func(s *Spec) { s.DiskMiB = 64 }, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tp, sp := warmTpl(), spec
			if tc.tpl != nil {
				tc.tpl(&tp)
			}
			if tc.spec != nil {
				tc.spec(&sp)
			}
			if got := startsWarm(sp, tp); got != tc.want {
				t.Errorf("startsWarm %v, want %v", got, tc.want)
			}
			k, err := newSnapshotKey(tp, sp)
			if err != nil {
				t.Fatal(err)
			}
			if (k.warm != "") != tc.want {
				t.Errorf("snapshot key %q: warm %q", k.name(), k.warm)
			}
		})
	}
}

func TestWarmSnapshotKey(t *testing.T) {
	tpl := warmTpl()
	spec := Spec{VCPUs: 2, MemoryMiB: 512, DiskMiB: 1024}
	warm, err := newSnapshotKey(tpl, spec)
	if err != nil {
		t.Fatal(err)
	}
	spec.NoStart = true
	cold, err := newSnapshotKey(tpl, spec)
	if err != nil {
		t.Fatal(err)
	}
	hexDigest := strings.TrimPrefix(testDigest, "sha256:")
	if got, want := cold.name(), hexDigest+"-2c-512m"; got != want {
		t.Errorf("cold name %q, want %q", got, want)
	}
	if got, want := warm.name(), hexDigest+"-2c-512m-w"+warmStartID(tpl); got != want || len(warmStartID(tpl)) != 8 {
		t.Errorf("warm name %q, want %q", got, want)
	}
	// Sweep finds a snapshot's short name from its lock's name.
	for _, k := range []snapshotKey{warm, cold} {
		if n := k.name(); n[:16]+n[64:] != k.short() {
			t.Errorf("short %q is not what sweepSnapshots derives from %q", k.short(), n)
		}
	}
	// Other start settings are another warm snapshot; the same ones the
	// same.
	if warmStartID(tpl) != warmStartID(warmTpl()) {
		t.Error("the start ID is not stable")
	}
	for name, change := range map[string]func(*template.Template){
		"start command": func(t *template.Template) { t.StartCmd += " --flag" },
		"ready command": func(t *template.Template) { t.ReadyCmd = "check2" },
		"ready port":    func(t *template.Template) { t.ReadyPort = 1 },
		"ready path":    func(t *template.Template) { t.ReadyPath = "/health" },
		"disk":          func(t *template.Template) { t.DiskMiB = 100 },
	} {
		other := warmTpl()
		change(&other)
		if warmStartID(other) == warmStartID(tpl) {
			t.Errorf("another %s has the same start ID", name)
		}
	}
}

// TestClearWarmLeftovers checks that clearing a cold snapshot's leftovers
// leaves the build of the warm snapshot of the same template, vCPUs and
// memory alone, and the other way round.
func TestClearWarmLeftovers(t *testing.T) {
	r := testRuntime(t)
	cold := snapshotKey{digest: testDigest, vcpus: 1, memoryMiB: 64}
	warm := cold
	warm.warm = "0123abcd"
	root := r.cfg.Dir.Snapshots()
	coldBuild, warmBuild := snapshotBuildPrefix+cold.short()+"-1", snapshotBuildPrefix+warm.short()+"-2"
	for _, d := range []string{coldBuild, warmBuild} {
		mkdir(t, filepath.Join(root, d))
	}
	r.clearSnapshotLeftovers(cold)
	if _, err := os.Stat(filepath.Join(root, warmBuild)); err != nil {
		t.Fatalf("the warm build went with the cold one's leftovers: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, coldBuild)); err == nil {
		t.Fatal("the cold build's leftovers stayed")
	}
	r.clearSnapshotLeftovers(warm)
	if _, err := os.Stat(filepath.Join(root, warmBuild)); err == nil {
		t.Fatal("the warm build's leftovers stayed")
	}
}

func TestLoadWarmSnapshot(t *testing.T) {
	const origin = "vmlinux:1:2 initramfs.cpio:3:4 qemu:5:6"
	key := snapshotKey{digest: testDigest, vcpus: 1, memoryMiB: 64, warm: "0123abcd"}
	layer := layerName("made-once")
	tests := []struct {
		name   string
		damage func(t *testing.T, dir string, rec snapshotRecord)
		want   string // in the error; "" for a usable snapshot
	}{
		{"whole", func(*testing.T, string, snapshotRecord) {}, ""},
		{"layer missing", func(t *testing.T, dir string, _ snapshotRecord) {
			os.Remove(filepath.Join(dir, layer))
		}, "disk layer " + layer + " is missing"},
		{"a cold record", func(t *testing.T, dir string, rec snapshotRecord) {
			rec.Warm, rec.Start, rec.Disk, rec.DiskMiB = false, "", "", 0
			writeSnapshotRecord(t, dir, rec)
		}, "warm false"},
		{"other start settings", func(t *testing.T, dir string, rec snapshotRecord) {
			rec.Start = "ffffffff"
			writeSnapshotRecord(t, dir, rec)
		}, `start "ffffffff"`},
		{"layer outside", func(t *testing.T, dir string, rec snapshotRecord) {
			rec.Disk = "../" + layer
			writeSnapshotRecord(t, dir, rec)
		}, "names disk layer"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := testRuntime(t)
			r.accel = vm.AccelTCG
			rec := fakeSnapshot(t, r, key, origin)
			dir := r.snapshotDir(key)
			rec.Warm, rec.Start, rec.Disk, rec.DiskMiB = true, key.warm, layer, 266
			writeSnapshotRecord(t, dir, rec)
			if err := os.WriteFile(filepath.Join(dir, layer), []byte("qcow2"), 0o444); err != nil {
				t.Fatal(err)
			}
			tc.damage(t, dir, rec)
			snap, _, err := r.loadSnapshot(key, origin)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("got %v, want an error saying %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !snap.Warm || snap.Disk != filepath.Join(dir, layer) || snap.DiskMiB != 266 {
				t.Errorf("loaded %+v, want warm with disk layer %s of 266 MiB", snap, layer)
			}
		})
	}
	// A cold snapshot under the cold key is not warm.
	r := testRuntime(t)
	r.accel = vm.AccelTCG
	cold := key
	cold.warm = ""
	fakeSnapshot(t, r, cold, origin)
	if snap, _, err := r.loadSnapshot(cold, origin); err != nil || snap.Warm || snap.Disk != "" {
		t.Errorf("a cold snapshot loads as %+v, %v", snap, err)
	}
}

// TestReplaceWarmSnapshot checks that a warm snapshot made again keeps the
// disk layers of its earlier makings that sandboxes' disks stand on, at
// the same path and with the same content, and drops the others.
func TestReplaceWarmSnapshot(t *testing.T) {
	r := testRuntime(t)
	key := snapshotKey{digest: testDigest, vcpus: 1, memoryMiB: 64, warm: "0123abcd"}
	final := r.snapshotDir(key)
	mkdir(t, final)
	used, unused := filepath.Join(final, layerName("a")), filepath.Join(final, layerName("b"))
	for _, p := range []string{used, unused} {
		if err := os.WriteFile(p, []byte(filepath.Base(p)), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	// A suspended clone of the first making, and a sandbox of no snapshot.
	for id, layer := range map[string]string{"sbxa": used, "sbxboot": ""} {
		dir := r.cfg.Dir.Sandbox(id)
		mkdir(t, dir)
		if err := writeRecord(dir, record{Spec: Spec{ID: id}, VM: vm.Config{Dir: dir}, Layer: layer}); err != nil {
			t.Fatal(err)
		}
	}
	var before unix.Stat_t
	if err := unix.Stat(used, &before); err != nil {
		t.Fatal(err)
	}
	build := filepath.Join(r.cfg.Dir.Snapshots(), snapshotBuildPrefix+key.short()+"-1")
	mkdir(t, build)
	os.WriteFile(filepath.Join(build, layerName("c")), []byte("new"), 0o444)
	if err := r.replaceSnapshot(key, build, final); err != nil {
		t.Fatal(err)
	}
	var names []string
	entries, _ := os.ReadDir(final)
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if got, want := strings.Join(names, " "), layerName("a")+" "+layerName("c"); got != want {
		t.Errorf("the snapshot holds %s, want %s", got, want)
	}
	var after unix.Stat_t
	if err := unix.Stat(used, &after); err != nil || after.Ino != before.Ino {
		t.Errorf("the layer in use is not the same file after the replacement (%v)", err)
	}
	if b, _ := os.ReadFile(used); string(b) != layerName("a") {
		t.Errorf("the layer in use holds %q", b)
	}
}

// TestDiskChainFromRecord: the disk of a warm clone, an overlay of an
// overlay of the template image, is copied down to the image by the chain
// its record names, not by the one its qcow2 header names: a VM that
// rewrote its header to point at another image (another sandbox's disk,
// a host file) gets the bytes of its own chain, and the tools, jailed as
// its user, are not shown the other image at all.
func TestDiskChainFromRecord(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		testenv.Lacking(t, "qemu-img is not installed")
	}
	ctx := t.Context()
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	image := func(name, marker string) string {
		p := filepath.Join(dir, name)
		b := make([]byte, 4<<20)
		copy(b[1<<20:], marker)
		if err := os.WriteFile(p, b, 0o444); err != nil {
			t.Fatal(err)
		}
		return p
	}
	base := image("tpl.ext4", "the-template-image")
	victim := image("victim.raw", "another-tenants-bytes")
	layer, overlay := filepath.Join(dir, layerName("x")), filepath.Join(dir, diskName)
	if err := createOverlay(ctx, base, layer, 8); err != nil {
		t.Fatal(err)
	}
	if err := createLayeredOverlay(ctx, layer, overlay, 8); err != nil {
		t.Fatal(err)
	}
	os.Chmod(layer, 0o444) // as a saved snapshot's layer is, for its clones' users
	if out, err := exec.Command("qemu-img", "info", "-U", "--output=json", overlay).Output(); err != nil || !strings.Contains(string(out), `"virtual-size": 8388608`) {
		t.Errorf("the clone's disk is not the layer's size: %s %v", out, err)
	}
	// What a compromised QEMU can do to the disk it owns.
	if out, err := exec.Command("qemu-img", "rebase", "-u", "-F", "raw", "-b", victim, overlay).CombinedOutput(); err != nil {
		t.Fatalf("rewrite the header: %v %s", err, out)
	}
	rec := record{VM: vm.Config{Disk: overlay, Backing: []string{layer, base}}}
	uids := []int{0}
	if os.Geteuid() == 0 {
		uids = append(uids, 1999999003) // jailed as the VM's user, who owns the disk
		os.Chown(overlay, 1999999003, 1999999003)
	}
	for _, uid := range uids {
		if uid != 0 {
			rec.VM.Jail = &vm.Jail{UID: uid, GID: uid}
		}
		tools, info, err := diskTools(rec)
		if err != nil {
			t.Fatal(err)
		}
		if tools.uid != uid || info.base() != base || info.baseSize != 4<<20 || info.allocated <= 0 {
			t.Errorf("tools %+v, info %+v, want the template image %s of 4 MiB at the bottom", tools, info, base)
		}
		out, err := tools.tempBeside(filepath.Join(dir, "saved.raw"))
		if err != nil {
			t.Fatal(err)
		}
		if err := copyOverlay(ctx, tools, info, out); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte("the-template-image")) || bytes.Contains(b, []byte("another-tenants-bytes")) {
			t.Errorf("uid %d: the copy followed the rewritten header (template image's bytes: %v)", uid, bytes.Contains(b, []byte("the-template-image")))
		}
	}
}
