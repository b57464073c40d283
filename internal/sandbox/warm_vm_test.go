package sandbox

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testenv"
)

// warmPort is the port of the warm test template's server.
const warmPort = 8080

// warmStartCmd starts the warm test template's server: it says so in the
// start log, records its PID (the shell's, which execs the server) and a
// token it draws at start, writes a file to the disk, and serves /www.
const warmStartCmd = `echo "server starting"
echo "$$ $(date +%s) $(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')" > /srv/started
echo from-the-warm-layer > /srv/layer.txt
sync
exec httpd -f -p 8080 -h /www`

// warmReadyCmd is its readiness check.
const warmReadyCmd = `wget -q -O - http://127.0.0.1:8080/ | grep -q warm-ok`

// otherCA is a certificate the warm test template's trust store has of
// its own.
const otherCA = "-----BEGIN CERTIFICATE-----\nTEMPLATE\n-----END CERTIFICATE-----\n"

// buildWarmTree makes a tree of static busybox with a page to serve, a
// trust store and update-ca-certificates' directory.
func buildWarmTree(t *testing.T, root string) {
	t.Helper()
	busybox, err := exec.LookPath("busybox")
	if err != nil || !staticELF(busybox) {
		testenv.Lacking(t, "no static busybox (apt-get install busybox-static): %v", err)
	}
	for _, d := range []string{"bin", "etc/ssl/certs", "usr/local/share/ca-certificates", "www", "srv", "tmp", "var/log", "data"} {
		mkdir(t, filepath.Join(root, d))
	}
	b, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, applet := range []string{"sh", "cat", "echo", "date", "head", "od", "tr", "sync", "httpd", "wget", "grep",
		"hostname", "stat", "touch", "mkdir", "sleep", "ls", "wc", "setsid", "tail"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	for p, content := range map[string]string{
		"www/index.html":                    "warm-ok\n",
		"etc/hostname":                      "warm-image\n",
		"etc/ssl/certs/ca-certificates.crt": otherCA,
	} {
		if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// httpGet gets path from the sandbox's guest port through its gateway.
func httpGet(ctx context.Context, sb *Sandbox, port uint16, path string) (int, string, error) {
	client := &http.Client{
		Transport: &http.Transport{
			DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return sb.DialGuest(ctx, port) },
			DisableKeepAlives: true,
		},
		Timeout: 5 * time.Second,
	}
	resp, err := client.Get("http://guest:" + strconv.Itoa(int(port)) + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// expectServed checks that the template's server answers at once.
func expectServed(ctx context.Context, t *testing.T, sb *Sandbox) {
	t.Helper()
	code, body, err := httpGet(ctx, sb, warmPort, "/")
	if err != nil || code != http.StatusOK || body != "warm-ok\n" {
		t.Errorf("GET / of %s: %d %q %v; want the template's page", sb.ID, code, body, err)
	}
}

// guestClockOff is how far the guest's clock is from the host's: a file's
// modification time, with the host's clock read before and after.
func guestClockOff(ctx context.Context, t *testing.T, sb *Sandbox) time.Duration {
	t.Helper()
	before := time.Now()
	out := shell(ctx, t, sb, "touch /tmp/now && stat -c %y /tmp/now")
	after := time.Now()
	guest, err := time.Parse("2006-01-02 15:04:05.999999999 -0700", out)
	if err != nil {
		t.Fatalf("the guest's time %q: %v", out, err)
	}
	switch {
	case guest.Before(before):
		return guest.Sub(before)
	case guest.After(after):
		return guest.Sub(after)
	}
	return 0
}

// layerFiles reads files out of a copy of a warm snapshot's disk layer,
// its journal replayed as a mount would.
func layerFiles(ctx context.Context, t *testing.T, layer string, paths ...string) map[string]string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "layer.ext4")
	if _, err := (ImageTools{}).output(ctx, "qemu-img", nil, nil, "convert", "-U", "-f", "qcow2", "-O", "raw", layer, img); err != nil {
		t.Fatal(err)
	}
	if err := fsck(ctx, ImageTools{}, img); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, p := range paths {
		b, err := ext4Image{path: img}.readFile(ctx, p)
		if err != nil {
			t.Fatalf("read %s of the snapshot's disk layer: %v", p, err)
		}
		files[p] = string(b)
	}
	return files
}

// TestWarmSnapshotVM creates sandboxes of a template whose start command
// starts a server, as clones of its warm snapshot, against real VMs with
// the agent of this tree: the server answers as soon as Create returns,
// the very process the snapshot started (no start ran in the clone);
// each clone has its own hostname, CA, random state, clock and disk size;
// a clone is adopted, suspended and woken, paused and resumed with its
// server up; a saved disk holds what the warm layer has. It reports how
// long a warm clone takes to create against a cold clone and its start.
func TestWarmSnapshotVM(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	rt := agentRuntime(t, ctx)
	rt.cfg.ColdBoot = false
	tree := t.TempDir()
	buildWarmTree(t, tree)
	tpl, err := rt.Templates().Import(ctx, "warm", "", tree, template.Settings{
		VCPUs: 1, MemoryMiB: 256, DiskMiB: 512,
		StartCmd: warmStartCmd, ReadyCmd: warmReadyCmd, ReadyPort: warmPort, ReadyPath: "/",
	})
	if err != nil {
		t.Fatal(err)
	}
	var live []*Sandbox
	t.Cleanup(func() {
		for _, sb := range live {
			sb.Destroy(context.Background())
		}
	})

	start := time.Now()
	snap, err := rt.TemplateSnapshot(ctx, Spec{Template: tpl.Ref()})
	if err != nil {
		t.Fatal(err)
	}
	madeIn := time.Since(start)
	if !snap.Warm || snap.DiskMiB != warmDiskMiB(tpl) {
		t.Fatalf("the template's snapshot is %+v, want a warm one with a disk of %d MiB", snap, warmDiskMiB(tpl))
	}
	if fi, err := os.Stat(snap.Disk); err != nil || fi.Mode().Perm()&0o222 != 0 {
		t.Fatalf("the snapshot's disk layer: %v, %v; want it read-only", fi, err)
	}
	for _, p := range []string{gatewayDirName, EgressLogName, snapshotDiskName} {
		if _, err := os.Stat(filepath.Join(snap.Dir, p)); err == nil {
			t.Errorf("the warm snapshot keeps %s", p)
		}
	}
	layer := layerFiles(ctx, t, snap.Disk, "/srv/started", template.StartLog, agentproto.CABundles()[0], agentproto.HostnameFile)
	t.Logf("warm snapshot made in %s; the server started as %q", madeIn.Round(time.Millisecond), layer["/srv/started"])
	if layer[agentproto.HostnameFile] != warmHostname+"\n" {
		t.Errorf("the template VM's hostname file holds %q", layer[agentproto.HostnameFile])
	}
	placeholderCA := strings.TrimPrefix(layer[agentproto.CABundles()[0]], otherCA)
	if !strings.Contains(placeholderCA, "BEGIN CERTIFICATE") {
		t.Fatalf("the template VM's trust store holds %q, want the template's and the placeholder's CA", layer[agentproto.CABundles()[0]])
	}
	pid, _, _ := strings.Cut(layer["/srv/started"], " ")

	create := func(t *testing.T, spec Spec) (*Sandbox, time.Duration) {
		t.Helper()
		spec.Template = tpl.Ref()
		start := time.Now()
		sb, err := rt.Create(ctx, spec)
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, sb)
		return sb, took
	}
	a, aTook := create(t, Spec{DiskMiB: 300, Detach: true})
	expectServed(ctx, t, a)
	b, bTook := create(t, Spec{})
	expectServed(ctx, t, b)
	t.Logf("warm clones created in %s and %s", aTook.Round(time.Millisecond), bTook.Round(time.Millisecond))

	random := map[string]bool{}
	for _, sb := range []*Sandbox{a, b} {
		if !sb.Warm || sb.Snapshot != snap.Dir {
			t.Fatalf("%s: warm %v, cloned from %q; want a clone of %s", sb.ID, sb.Warm, sb.Snapshot, snap.Dir)
		}
		if len(sb.Init.Warnings) > 0 {
			t.Errorf("%s: reinit warned: %q", sb.ID, sb.Init.Warnings)
		}
		// The snapshot's server, not one started in the clone.
		if got := shell(ctx, t, sb, "cat /srv/started"); got != strings.TrimSpace(layer["/srv/started"]) {
			t.Errorf("%s: the server's start record is %q, want the snapshot's %q", sb.ID, got, layer["/srv/started"])
		}
		if got := shell(ctx, t, sb, "cat /proc/"+pid+"/comm"); got != "httpd" {
			t.Errorf("%s: process %s is %q, want the snapshot's httpd", sb.ID, pid, got)
		}
		if got := shell(ctx, t, sb, "cat "+template.StartLog); got != strings.TrimSpace(layer[template.StartLog]) || strings.Count(got, "server starting") != 1 {
			t.Errorf("%s: the start log holds %q, want the snapshot's %q", sb.ID, got, layer[template.StartLog])
		}
		// Its own identity.
		if got, want := shell(ctx, t, sb, "hostname; cat /etc/hostname; grep 127.0.1.1 /etc/hosts"), sb.ID+"\n"+sb.ID+"\n127.0.1.1 "+sb.ID; got != want {
			t.Errorf("%s: hostname and hosts say %q, want %q", sb.ID, got, want)
		}
		if hosts := shell(ctx, t, sb, "cat /etc/hosts"); strings.Contains(hosts, warmHostname) {
			t.Errorf("%s: /etc/hosts still names the template VM: %q", sb.ID, hosts)
		}
		own := string(sb.ca.CertPEM())
		if got := shell(ctx, t, sb, "cat "+agentproto.CABundles()[0]); got != strings.TrimSpace(otherCA+own) {
			t.Errorf("%s: the trust store holds %q, want the template's CA and the sandbox's", sb.ID, got)
		}
		if got := shell(ctx, t, sb, "cat "+agentproto.CACertFile); got != strings.TrimSpace(own) {
			t.Errorf("%s: %s holds %q, want the sandbox's CA", sb.ID, agentproto.CACertFile, got)
		}
		if own == placeholderCA {
			t.Errorf("%s: the sandbox's CA is the placeholder's", sb.ID)
		}
		random[shell(ctx, t, sb, "head -c 16 /dev/urandom | od -An -tx1")] = true
		if off := guestClockOff(ctx, t, sb); off < -time.Second || off > time.Second {
			t.Errorf("%s: the guest's clock is %s off the host's", sb.ID, off)
		}
		// Its disk, grown.
		want := int64(sb.Spec.DiskMiB) << 20
		sectors, _ := strconv.ParseInt(shell(ctx, t, sb, "cat /sys/block/vda/size"), 10, 64)
		fs := strings.Fields(shell(ctx, t, sb, "stat -f -c '%b %S' /"))
		blocks, _ := strconv.ParseInt(fs[0], 10, 64)
		bsize, _ := strconv.ParseInt(fs[1], 10, 64)
		if sb.Init.DiskBytes != want || sectors*512 != want || blocks*bsize < want*9/10 {
			t.Errorf("%s: disk %d bytes (the guest: device %d, filesystem %d); want %d", sb.ID, sb.Init.DiskBytes, sectors*512, blocks*bsize, want)
		}
	}
	if len(random) != 2 {
		t.Errorf("two warm clones read the same random bytes: %v", random)
	}
	checkStart := time.Now()
	if err := rt.checkServer(ctx, b); err != nil {
		t.Fatal(err)
	}
	t.Logf("the readiness check of a warm clone's server (ready command and GET) took %s", time.Since(checkStart).Round(time.Millisecond))

	t.Run("adopt", func(t *testing.T) {
		id := a.ID
		a.Release()
		adopted, err := rt.Adopt(ctx, id, a.Spec)
		if err != nil {
			t.Fatal(err)
		}
		a = adopted
		live = append(live, a)
		if !a.Warm {
			t.Error("the adopted sandbox does not know it is a warm clone")
		}
		expectServed(ctx, t, a)
	})

	t.Run("suspend and wake", func(t *testing.T) {
		shell(ctx, t, a, "echo 'before the suspend' > /data/kept.txt")
		if err := a.Suspend(ctx); err != nil {
			t.Fatal(err)
		}
		woken, err := rt.Wake(ctx, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		a = woken
		live = append(live, a)
		if !a.Warm {
			t.Error("the woken sandbox does not know it is a warm clone")
		}
		expectServed(ctx, t, a)
		if got := shell(ctx, t, a, "cat /data/kept.txt; cat /proc/"+pid+"/comm; hostname"); got != "before the suspend\nhttpd\n"+a.ID {
			t.Errorf("after the wake: %q", got)
		}
	})

	t.Run("pause and resume", func(t *testing.T) {
		if err := b.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		if err := b.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		expectServed(ctx, t, b)
	})

	t.Run("save disk", func(t *testing.T) {
		shell(ctx, t, b, "echo 'the clone wrote it' > /data/clone.txt")
		img := filepath.Join(t.TempDir(), "saved.ext4")
		if err := b.SaveDisk(ctx, img); err != nil {
			t.Fatal(err)
		}
		// The files of the warm layer and the clone's, without what init
		// and reinit wrote: the template had no hosts file, resolver or
		// own CA file.
		checkImage(t, img, map[string]string{
			"srv/layer.txt":                                "from-the-warm-layer\n",
			"data/clone.txt":                               "the clone wrote it\n",
			"etc/hostname":                                 "warm-image\n",
			"etc/ssl/certs/ca-certificates.crt":            otherCA,
			"etc/hosts":                                    "",
			"etc/resolv.conf":                              "",
			"usr/local/share/ca-certificates/":             "/",
			strings.TrimPrefix(agentproto.CACertFile, "/"): "",
		})
	})

	t.Run("against a cold clone and its start", func(t *testing.T) {
		// Today's way for the same template: a clone of its cold snapshot,
		// then its start command and the wait for it. The first makes the
		// cold snapshot.
		create(t, Spec{NoStart: true})
		var cold time.Duration
		for range 2 {
			sb, took := create(t, Spec{NoStart: true})
			if sb.Warm {
				t.Fatal("a sandbox that skips the start command is a warm clone")
			}
			start := time.Now()
			if err := rt.startTemplate(ctx, sb, rt.startTimeout()); err != nil {
				t.Fatal(err)
			}
			took += time.Since(start)
			expectServed(ctx, t, sb)
			cold = max(cold, took)
		}
		var warm time.Duration
		for range 2 {
			_, took := create(t, Spec{})
			warm = max(warm, took)
		}
		t.Logf("create with the server up: warm clone %s; cold clone and start %s (slowest of two each)",
			warm.Round(time.Millisecond), cold.Round(time.Millisecond))
		// A sandbox with its own environment starts its own server.
		env, took := create(t, Spec{Env: map[string]string{"A": "b"}})
		if env.Warm {
			t.Error("a sandbox with its own environment is a warm clone")
		}
		expectServed(ctx, t, env)
		t.Logf("create of a sandbox with its own environment (cold clone and start): %s", took.Round(time.Millisecond))
	})
}

// TestWarmCodeInterpreterVM creates sandboxes of the host's
// code-interpreter template as warm clones, with the agent of this tree,
// and as cold clones that start the server: a warm clone's server runs
// code at once, each clone's kernel draws its own bytes from the OS, and
// a cold clone's server started after its create runs code too. How much
// faster a warm create is, and how much less memory it holds, is the
// bench's to say (warm_template_create), against baselines measured in
// the same run. It skips when the host has no code-interpreter template.
func TestWarmCodeInterpreterVM(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	rt := agentRuntime(t, ctx)
	rt.cfg.ColdBoot = false
	tpl := linkHostTemplate(t, requireVMHost(t), rt.cfg.Dir, "code-interpreter")
	if !warmTemplate(tpl) {
		t.Fatalf("the code-interpreter template (%+v) has no warm snapshot", tpl.Settings())
	}
	var live []*Sandbox
	t.Cleanup(func() {
		for _, sb := range live {
			sb.Destroy(context.Background())
		}
	})
	create := func(t *testing.T, spec Spec) (*Sandbox, time.Duration) {
		t.Helper()
		spec.Template = tpl.Ref()
		start := time.Now()
		sb, err := rt.Create(ctx, spec)
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, sb)
		return sb, took
	}
	// runCode runs code on the default context and returns the stream.
	runCode := func(t *testing.T, sb *Sandbox, code string) string {
		t.Helper()
		client := &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return sb.DialGuest(ctx, uint16(tpl.ReadyPort))
			},
		}, Timeout: time.Minute}
		body := strings.NewReader(`{"code": ` + strconv.Quote(code) + `}`)
		resp, err := client.Post("http://guest/execute", "application/json", body)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST /execute: %s: %s", resp.Status, b)
		}
		return string(b)
	}

	start := time.Now()
	if _, err := rt.TemplateSnapshot(ctx, Spec{Template: tpl.Ref()}); err != nil {
		t.Fatal(err)
	}
	t.Logf("warm snapshot made in %s", time.Since(start).Round(time.Millisecond))
	urandom := map[string]bool{}
	for range 2 {
		sb, took := create(t, Spec{})
		if !sb.Warm {
			t.Fatal("a sandbox of the code interpreter is not a warm clone")
		}
		ran := time.Now()
		out := runCode(t, sb, "import os, random\nprint(os.urandom(8).hex(), random.random())")
		t.Logf("%s: created in %s; first runCode in %s: %s", sb.ID, took.Round(time.Millisecond), time.Since(ran).Round(time.Millisecond), strings.Join(strings.Fields(out), " "))
		i := strings.Index(out, `"text": "`)
		if i < 0 {
			t.Fatalf("runCode printed nothing: %s", out)
		}
		drawn, _, _ := strings.Cut(out[i+len(`"text": "`):], " ")
		urandom[drawn] = true
	}
	if len(urandom) != 2 {
		t.Errorf("the kernels of two warm clones drew the same bytes from the OS: %v", urandom)
	}

	// A clone of the cold snapshot (made first), then the start command
	// and the wait for /health: its server runs code too.
	create(t, Spec{NoStart: true})
	sb, took := create(t, Spec{NoStart: true})
	if sb.Warm {
		t.Fatal("a sandbox that skips the start command is a warm clone")
	}
	start = time.Now()
	if err := rt.startTemplate(ctx, sb, rt.startTimeout()); err != nil {
		t.Fatal(err)
	}
	t.Logf("cold clone created in %s, its server started in %s", took.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	if out := runCode(t, sb, "print(6 * 7)"); !strings.Contains(out, `"text": "42`) {
		t.Errorf("the started server's runCode printed %s, want 42", out)
	}
}
