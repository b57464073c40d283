package e2e

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/vm"
)

// The host side of a sandbox, attacked (docs/hardening.md, "The attack
// suite"): a tenant's strings must not reach an interpreter on the host,
// an image's symlinks must not redirect a host write, the image tools
// must run jailed, and a disk's qcow2 header must not choose what the
// host reads.

// userKey makes a key of role user on s, deleted at the test's end.
func userKey(t *testing.T, s *server, name string) string {
	t.Helper()
	var k apiv1.KeyCreated
	s.must(t, 201, "POST", "/v1/keys", s.key, apiv1.CreateKey{Name: name, Role: apiv1.RoleUser}, &k)
	t.Cleanup(func() { s.call(t, "DELETE", "/v1/keys/"+k.ID, s.key, nil) })
	return k.Key
}

// imageWith is a busybox image with the extra layer's entries and cfg
// changing its configuration.
func imageWith(t *testing.T, extra []tarEntry, cfg func(*v1.Config)) v1.Image {
	t.Helper()
	layers := []v1.Layer{layer(t, busyboxLayer(t))}
	if len(extra) > 0 {
		layers = append(layers, layer(t, makeTar(t, extra...)))
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/bin"}
	if cfg != nil {
		cfg(&cf.Config)
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// buildAs starts a build with key and returns the finished operation, or
// the refusal's status and body when the request is refused.
func buildAs(t *testing.T, s *server, key string, body any) (int, []byte, apiv1.Operation) {
	t.Helper()
	status, b := s.call(t, "POST", "/v1/templates", key, body)
	if status != 202 {
		return status, b, apiv1.Operation{}
	}
	var res apiv1.TemplateOperation
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	return status, b, s.waitOp(t, key, res.Operation.ID)
}

// TestAttackBuildInjection: a user key tries the three ways a working
// directory with a newline once reached debugfs's script as root (a build
// step, a Dockerfile WORKDIR with a build arg, an image's WorkingDir),
// and the same with the other fields a tenant names: each is refused
// with the field named, and the marker command never runs.
func TestAttackBuildInjection(t *testing.T) {
	s := buildServer(t)
	key := userKey(t, s, "injector")
	marker := filepath.Join(t.TempDir(), "ran")
	payload := "\n!touch " + marker + " #"
	long := "/" + strings.Repeat("a", 64<<10)
	for _, tc := range []struct {
		name string
		body any
		want string
	}{
		{"workdir step", apiv1.CreateTemplate{Name: "inj", From: "tiny", Steps: []apiv1.BuildStep{{Workdir: "/x" + payload}}}, "workdir"},
		{"workdir step, carriage return", apiv1.CreateTemplate{Name: "inj", From: "tiny", Steps: []apiv1.BuildStep{{Workdir: "/x\r!id"}}}, "workdir"},
		{"workdir step, 64 KiB", apiv1.CreateTemplate{Name: "inj", From: "tiny", Steps: []apiv1.BuildStep{{Workdir: long}}}, "workdir"},
		{"dockerfile WORKDIR with a build arg", apiv1.CreateTemplate{Name: "inj",
			Dockerfile: "FROM tiny\nARG W\nWORKDIR /x$W\n", BuildArgs: map[string]string{"W": payload}}, "workdir"},
		{"copy destination", apiv1.CreateTemplate{Name: "inj", From: "tiny",
			Steps: []apiv1.BuildStep{{Copy: &apiv1.BuildCopy{Src: "a", Dest: "/x" + payload}}}}, "copy destination"},
		{"env name", apiv1.CreateTemplate{Name: "inj", From: "tiny", Steps: []apiv1.BuildStep{{Env: map[string]string{"A\nB": "x"}}}}, "env"},
		{"user", apiv1.CreateTemplate{Name: "inj", From: "tiny", Steps: []apiv1.BuildStep{{User: "root\n!id"}}}, "user"},
		{"template name", apiv1.CreateTemplate{Name: "inj\n!id", From: "tiny"}, "name"},
	} {
		status, body, _ := buildAs(t, s, key, tc.body)
		if status != 400 || !strings.Contains(string(body), tc.want) || !strings.Contains(string(body), "invalid_argument") {
			t.Errorf("%s: %d %s, want 400 invalid_argument naming %q", tc.name, status, body, tc.want)
		}
	}

	// An image's configuration is the tenant's too: a build from it fails,
	// naming the field.
	reg := newTestRegistry(t, "", "")
	for _, tc := range []struct {
		name string
		cfg  func(*v1.Config)
		want string
	}{
		{"WorkingDir", func(c *v1.Config) { c.WorkingDir = "/x" + payload }, "WorkingDir"},
		{"User", func(c *v1.Config) { c.User = "root" + payload }, "User"},
		{"Env name", func(c *v1.Config) { c.Env = append(c.Env, "A"+payload+"=1") }, "Env"},
	} {
		ref := reg.push(t, "hostile/"+strings.ToLower(strings.ReplaceAll(tc.name, " ", "-"))+":v1", imageWith(t, nil, tc.cfg))
		status, body, op := buildAs(t, s, key, apiv1.CreateTemplate{Name: "inj-image", From: "docker://" + ref})
		if status != 202 {
			t.Errorf("image %s: %d %s", tc.name, status, body)
			continue
		}
		if op.Status != apiv1.OpFailed || op.Error == nil || !strings.Contains(op.Error.Message, tc.want) || op.Error.Code != "invalid_argument" {
			t.Errorf("image %s: build %s %+v, want a failure naming %s", tc.name, op.Status, op.Error, tc.want)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a tenant's string ran a command on the host")
	}

	// The same strings at the sandbox's edge: paths, cwd, user and env
	// names with control characters are refused before anything is sent.
	sb := s.createSandbox(t, key, apiv1.CreateSandbox{Template: "tiny"})
	for _, tc := range []struct {
		name, method, path string
		body               any
	}{
		{"exec cwd", "POST", "/v1/sandboxes/" + sb.ID + "/exec", apiv1.CommandRequest{Argv: []string{"true"}, Cwd: "/tmp\n!id"}},
		{"exec user", "POST", "/v1/sandboxes/" + sb.ID + "/exec", apiv1.CommandRequest{Argv: []string{"true"}, User: "root\x1b[2J"}},
		{"exec env name", "POST", "/v1/sandboxes/" + sb.ID + "/exec", apiv1.CommandRequest{Argv: []string{"true"}, Env: map[string]string{"A\nB": "1"}}},
		{"file path", "GET", "/v1/sandboxes/" + sb.ID + "/files?path=" + "%2Fetc%0Apasswd", nil},
	} {
		status, body := s.call(t, tc.method, tc.path, key, tc.body)
		if status != 400 || !strings.Contains(string(body), "invalid_argument") {
			t.Errorf("%s: %d %s, want 400 invalid_argument", tc.name, status, body)
		}
	}
}

// TestAttackImageSymlinks: images whose etc, or etc/airlock, is a symlink
// to a directory on the host, or whose COPY destination is one. The
// build writes nothing there (a link that leaves the image's tree fails
// the build, saying so); a COPY lands inside the guest.
func TestAttackImageSymlinks(t *testing.T) {
	s := buildServer(t)
	key := userKey(t, s, "linker")
	reg := newTestRegistry(t, "", "")
	hostDir := t.TempDir()
	victim := filepath.Join(hostDir, "image.json")
	os.WriteFile(victim, []byte("the host's own\n"), 0o644)
	check := func(what string) {
		t.Helper()
		if b, _ := os.ReadFile(victim); string(b) != "the host's own\n" {
			t.Errorf("%s: the host's file now holds %q", what, b)
		}
		if ents, _ := os.ReadDir(hostDir); len(ents) != 1 {
			t.Errorf("%s: the host directory holds %d entries", what, len(ents))
		}
	}
	for _, tc := range []struct {
		name  string
		extra []tarEntry
	}{
		{"etc", []tarEntry{{name: "etc", typ: tar.TypeSymlink, link: hostDir}}},
		{"etc-airlock", []tarEntry{{name: "etc/", typ: tar.TypeDir}, {name: "etc/airlock", typ: tar.TypeSymlink, link: hostDir}}},
		{"etc-airlock-climbing", []tarEntry{{name: "etc/", typ: tar.TypeDir},
			{name: "etc/airlock", typ: tar.TypeSymlink, link: "../../../../../../../../" + hostDir}}},
	} {
		ref := reg.push(t, "links/"+tc.name+":v1", imageWith(t, tc.extra, nil))
		status, body, op := buildAs(t, s, key, apiv1.CreateTemplate{Name: "links-" + tc.name, From: "docker://" + ref})
		if status != 202 {
			t.Fatalf("%s: %d %s", tc.name, status, body)
		}
		if op.Status != apiv1.OpFailed || op.Error == nil || !strings.Contains(op.Error.Message, "image configuration") {
			t.Errorf("%s: build %s %+v, want a failure writing the image configuration", tc.name, op.Status, op.Error)
		}
		check(tc.name)
	}

	// A COPY through a symlink to a host path happens in the build's VM.
	ref := reg.push(t, "links/copy:v1", imageWith(t, []tarEntry{{name: "dst", typ: tar.TypeSymlink, link: hostDir}}, nil))
	var bc apiv1.BuildContext
	s.must(t, 201, "PUT", "/v1/build-contexts", key, makeTar(t, tarEntry{name: "image.json", body: "from the context\n"}), &bc)
	status, body, op := buildAs(t, s, key, apiv1.CreateTemplate{Name: "links-copy", From: "docker://" + ref, Context: bc.ID,
		Steps: []apiv1.BuildStep{{Copy: &apiv1.BuildCopy{Src: "image.json", Dest: "/dst/"}}}})
	if status != 202 {
		t.Fatalf("COPY through a symlink: %d %s", status, body)
	}
	check("COPY")
	if op.Status != apiv1.OpSucceeded {
		// The guest's agent refuses to extract over a symlink: what
		// matters here is that the host was not touched.
		if op.Error == nil || !strings.Contains(op.Error.Message, "/dst") {
			t.Errorf("COPY through a symlink failed without saying where: %+v", op.Error)
		}
		return
	}
	sb := s.createSandbox(t, key, apiv1.CreateSandbox{Template: "links-copy"})
	status, b := s.call(t, "POST", "/v1/sandboxes/"+sb.ID+"/exec", key, apiv1.CommandRequest{Argv: []string{"/bin/cat", hostDir + "/image.json"}})
	var res apiv1.ExecResult
	json.Unmarshal(b, &res)
	if status != 200 || res.Stdout != "from the context\n" {
		t.Errorf("the COPY did not land in the guest: %d %s", status, b)
	}
}

// toolNames are the image tools a build and a save run.
var toolNames = []string{"qemu-img", "e2fsck", "resize2fs", "debugfs", "dumpe2fs", "mkfs.ext4"}

// toolSeen is one image tool process seen in /proc.
type toolSeen struct {
	name, cmdline, uid, capEff, seccomp, noNewPrivs, netns string
}

// watchTools polls /proc for the image tools working under the data
// directory home (their command lines name files there) until stop is
// closed.
func watchTools(stop <-chan struct{}, home string) func() map[int]toolSeen {
	var mu sync.Mutex
	seen := map[int]toolSeen{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			ents, _ := os.ReadDir("/proc")
			for _, e := range ents {
				pid, err := strconv.Atoi(e.Name())
				if err != nil {
					continue
				}
				comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
				name := strings.TrimSpace(string(comm))
				if !slices.Contains(toolNames, name) {
					continue
				}
				mu.Lock()
				_, had := seen[pid]
				mu.Unlock()
				if had {
					continue
				}
				st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
				if err != nil {
					continue
				}
				cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
				if !strings.Contains(string(cmd), home) {
					continue // another server's, or a test's of its own
				}
				netns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
				ts := toolSeen{name: name, cmdline: strings.ReplaceAll(string(cmd), "\x00", " "), netns: netns}
				for _, line := range strings.Split(string(st), "\n") {
					k, v, _ := strings.Cut(line, ":")
					f := strings.Fields(v)
					if len(f) == 0 {
						continue
					}
					switch k {
					case "Uid":
						ts.uid = f[0]
					case "CapEff":
						ts.capEff = f[0]
					case "Seccomp":
						ts.seccomp = f[0]
					case "NoNewPrivs":
						ts.noNewPrivs = f[0]
					}
				}
				mu.Lock()
				seen[pid] = ts
				mu.Unlock()
			}
		}
	}()
	return func() map[int]toolSeen {
		<-done
		return seen
	}
}

// TestAttackImageToolsJailed watches every image tool a build with a RUN
// step, a build from an image and two saves run, one of them of a disk whose guest wrote garbage
// over its filesystem's superblock: each runs as an unprivileged user
// with no capabilities, no_new_privs, a seccomp filter and a network
// namespace of its own. (qemu-img create makes an overlay with -u, so it
// opens no image, and is the one tool that runs as root.) Each tool is
// wrapped in a script that waits a moment before it executes the real
// one, so that the watcher sees it; the script's process has the same
// user, capabilities, filter and namespaces as the tool it becomes.
func TestAttackImageToolsJailed(t *testing.T) {
	wrap := t.TempDir()
	os.Chmod(wrap, 0o755)
	for _, name := range toolNames {
		real, err := exec.LookPath(name)
		if err != nil {
			for _, d := range []string{"/usr/sbin", "/sbin"} {
				if _, err := os.Stat(filepath.Join(d, name)); err == nil {
					real = filepath.Join(d, name)
				}
			}
		}
		if real == "" {
			t.Fatalf("%s is not installed", name)
		}
		script := "#!/bin/sh\nsleep 0.2\nexec " + real + " \"$@\"\n"
		if err := os.WriteFile(filepath.Join(wrap, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	home, err := privateTemplatesHome("tiny")
	if err != nil {
		t.Fatal(err)
	}
	reg := newTestRegistryOn(t, loopbackListener(t), "", "")
	s, err := launchServerAt(home, []string{"PATH=" + wrap + ":" + os.Getenv("PATH")}, "--trusted-registries", reg.host)
	if err != nil {
		t.Fatalf("start a server: %v", err)
	}
	t.Cleanup(func() { s.stop(syscall.SIGTERM) }) // after the sandboxes' own clean-ups
	stop := make(chan struct{})
	seen := watchTools(stop, home)

	status, body, op := buildAs(t, s, s.key, apiv1.CreateTemplate{Name: "watched", From: "tiny",
		Steps: []apiv1.BuildStep{{Run: "echo built > /built.txt"}, {Workdir: "/srv/app"}}})
	if status != 202 || op.Status != apiv1.OpSucceeded {
		t.Fatalf("build: %d %s %+v", status, body, op.Error)
	}
	// An image's tree, with a file only root may read, made into an
	// image by mkfs.ext4.
	ref := reg.push(t, "watched/image:v1", imageWith(t, []tarEntry{{name: "etc/", typ: tar.TypeDir},
		{name: "etc/shadow", body: "root:x:1::\n", mode: 0o600}}, nil))
	status, body, op = buildAs(t, s, s.key, apiv1.CreateTemplate{Name: "watched-image", From: "docker://" + ref})
	if status != 202 || op.Status != apiv1.OpSucceeded {
		t.Fatalf("build from an image: %d %s %+v", status, body, op.Error)
	}
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "watched"})
	var res apiv1.TemplateOperation
	s.must(t, 202, "POST", "/v1/sandboxes/"+sb.ID+"/template", s.key, apiv1.SaveTemplate{Name: "watched-save"}, &res)
	if op := s.waitOp(t, s.key, res.Operation.ID); op.Status != apiv1.OpSucceeded {
		t.Fatalf("save: %+v", op.Error)
	}
	// A guest as root writes garbage over its root filesystem's
	// superblock; the save that parses it runs jailed, and ends (it may
	// repair from a backup superblock, or fail saying why).
	bad := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny"})
	if r := s.exec(t, bad.ID, apiv1.CommandRequest{Cmd: "dd if=/dev/urandom of=/dev/vda bs=1024 seek=1 count=1 conv=notrunc 2>&1; sync"}); r.ExitCode != 0 {
		t.Fatalf("corrupt the superblock: %+v", r)
	}
	s.must(t, 202, "POST", "/v1/sandboxes/"+bad.ID+"/template", s.key, apiv1.SaveTemplate{Name: "watched-bad"}, &res)
	badOp := s.waitOp(t, s.key, res.Operation.ID)
	t.Logf("the save of a corrupted disk: %s %+v", badOp.Status, badOp.Error)
	if badOp.Status == apiv1.OpFailed && (badOp.Error == nil || badOp.Error.Code != apiv1.CodeConflict || !strings.Contains(badOp.Error.Message, "damaged")) {
		t.Errorf("the failed save of a damaged filesystem: %+v, want a conflict saying it is damaged", badOp.Error)
	}
	if st, _ := s.call(t, "GET", "/v1/sandboxes/"+sb.ID, s.key, nil); st != 200 {
		t.Errorf("the server after the saves: %d", st)
	}
	close(stop)
	hostNet, _ := os.Readlink("/proc/self/ns/net")
	kinds := map[string]int{}
	for pid, ts := range seen() {
		kinds[ts.name]++
		if ts.name == "qemu-img" && strings.Contains(ts.cmdline, " create ") {
			if !strings.Contains(ts.cmdline, " -u ") {
				t.Errorf("pid %d: qemu-img create opens the backing image: %s", pid, ts.cmdline)
			}
			continue
		}
		caps := "0000000000000000"
		if ts.name == "mkfs.ext4" {
			caps = "0000000000000004" // CAP_DAC_READ_SEARCH alone, to read the image's tree
		}
		if ts.uid == "0" || ts.capEff != caps || ts.seccomp != "2" || ts.noNewPrivs != "1" || ts.netns == hostNet {
			t.Errorf("pid %d (%s) runs unconfined: uid %s, CapEff %s, Seccomp %s, NoNewPrivs %s, netns %s (host %s): %s",
				pid, ts.name, ts.uid, ts.capEff, ts.seccomp, ts.noNewPrivs, ts.netns, hostNet, ts.cmdline)
		}
	}
	t.Logf("image tools seen: %v", kinds)
	for _, name := range toolNames {
		if kinds[name] == 0 {
			t.Errorf("no %s was seen: the watcher missed it, or the build and saves no longer run it", name)
		}
	}
}

// TestAttackQcow2Header: a compromised QEMU owns its sandbox's disk and
// can rewrite the qcow2 header to name another sandbox's disk as its
// backing file. A save of the suspended sandbox and the QEMU of its wake
// both open the chain the server recorded, not the header's (and their
// jails do not hold the other disk): the other sandbox's bytes reach
// neither.
func TestAttackQcow2Header(t *testing.T) {
	s := buildServer(t)
	victim := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny"})
	if r := s.exec(t, victim.ID, apiv1.CommandRequest{Cmd: "echo victims-secret-bytes > /secret.txt; sync"}); r.ExitCode != 0 {
		t.Fatalf("write: %+v", r)
	}
	att := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny"})
	var lop apiv1.SandboxOperation
	s.must(t, 202, "POST", "/v1/sandboxes/"+att.ID+"/suspend", s.key, nil, &lop)
	if op := s.waitOp(t, s.key, lop.Operation.ID); op.Status != apiv1.OpSucceeded {
		t.Fatalf("suspend: %+v", op.Error)
	}
	disk := filepath.Join(s.home, "sandboxes", att.ID, "disk.qcow2")
	other := filepath.Join(s.home, "sandboxes", victim.ID, "disk.qcow2")
	fi, err := os.Stat(disk)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("the disk's mode is %o, want 600", fi.Mode().Perm())
	}
	// The disk is the VM's user's, so an escape into QEMU could rewrite
	// it; root does it here in its place.
	if rec := readRecordVM(t, filepath.Join(s.home, "sandboxes", att.ID)); rec.Jail == nil || int(fileUID(fi)) != rec.Jail.UID {
		t.Errorf("the disk is owned by %d, the VM's user is %+v", fileUID(fi), rec.Jail)
	}
	if out, err := exec.Command("qemu-img", "rebase", "-u", "-F", "qcow2", "-b", other, disk).CombinedOutput(); err != nil {
		t.Fatalf("rewrite the header: %v %s", err, out)
	}
	var res apiv1.TemplateOperation
	s.must(t, 202, "POST", "/v1/sandboxes/"+att.ID+"/template", s.key, apiv1.SaveTemplate{Name: "header-attack"}, &res)
	if op := s.waitOp(t, s.key, res.Operation.ID); op.Status != apiv1.OpSucceeded {
		t.Fatalf("save of the suspended sandbox: %+v", op.Error)
	}
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "header-attack"})
	// grep -F: a fixed string scans the device in seconds under TCG,
	// where busybox's regular expression takes a minute.
	if r := s.exec(t, sb.ID, apiv1.CommandRequest{Cmd: "cat /secret.txt; grep -F -c victims-secret /dev/vda || true"}); strings.Contains(r.Stdout, "victims-secret-bytes") || strings.TrimSpace(r.Stdout) != "0" {
		t.Errorf("the saved template holds the other sandbox's bytes: %q", r.Stdout)
	}
	s.must(t, 202, "POST", "/v1/sandboxes/"+att.ID+"/wake", s.key, nil, &lop)
	if op := s.waitOp(t, s.key, lop.Operation.ID); op.Status != apiv1.OpSucceeded {
		t.Fatalf("wake with a rewritten header: %+v (QEMU is to open the recorded chain)", op.Error)
	}
	if r := s.exec(t, att.ID, apiv1.CommandRequest{Cmd: "cat /secret.txt; grep -F -c victims-secret /dev/vda || true"}); strings.Contains(r.Stdout, "victims-secret-bytes") || strings.TrimSpace(r.Stdout) != "0" {
		t.Errorf("the woken sandbox reads the other sandbox's disk: %q", r.Stdout)
	}
	if r := s.exec(t, victim.ID, apiv1.CommandRequest{Cmd: "cat /secret.txt"}); r.Stdout != "victims-secret-bytes\n" {
		t.Errorf("the victim's disk after the attack: %+v", r)
	}
}

// readRecordVM reads the VM configuration a sandbox's record holds.
func readRecordVM(t *testing.T, dir string) vm.Config {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "vm.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		VM vm.Config `json:"vm"`
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	return rec.VM
}

// fileUID is the owner of the file fi describes.
func fileUID(fi os.FileInfo) uint32 { return fi.Sys().(*syscall.Stat_t).Uid }
