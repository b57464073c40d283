package sandbox

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cavaliergopher/cpio"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway"
	"github.com/airlockhq/airlock/internal/guest"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testenv"
)

// agentRuntime returns a runtime over a data directory of its own whose
// guests run the agent built from this tree (the host's initramfs holds
// the one `airlock setup` installed, which may be older): the host's
// initramfs with a newer /init appended, which the kernel unpacks over
// the first. It shares the host's kernel, accelerator verdict and tiny
// template; its sandboxes boot cold, and its store takes the templates
// a test imports. It skips as hostRuntime does.
func agentRuntime(t *testing.T, ctx context.Context) *Runtime {
	t.Helper()
	host := requireVMHost(t)
	if _, err := template.Open(host).Resolve("tiny"); err != nil {
		testenv.Lacking(t, "template tiny is missing: %v", err)
	}
	// Not t.TempDir: sockets live under it, and their paths must be short.
	root, err := os.MkdirTemp("", "al-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	dd := datadir.Dir{Root: root}
	mkdir(t, dd.Boot())
	for _, p := range []string{host.Kernel(), guest.ManifestPath(host)} {
		if err := os.Symlink(p, filepath.Join(dd.Boot(), filepath.Base(p))); err != nil {
			t.Fatal(err)
		}
	}
	agent := filepath.Join(root, "airlock-agent")
	goBuild(t, agent, "", "github.com/airlockhq/airlock/cmd/airlock-agent")
	writeInitramfs(t, host.Initramfs(), agent, dd.Initramfs())

	linkHostTemplate(t, host, dd, "tiny")
	if b, err := os.ReadFile(host.AccelVerdict()); err == nil {
		os.WriteFile(dd.AccelVerdict(), b, 0o644)
	}
	// The boot timeout is the default's threefold: make test runs these
	// beside other packages' tests under -race on two CPUs, and a 2-vCPU
	// template VM's emulated boot was seen to pass the minute there.
	rt, err := New(ctx, Config{Dir: dd, Log: testLog(t), ColdBoot: true, BootTimeout: 3 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// linkHostTemplate makes the host's template name one of dd's, by
// reference: its image is a symlink to the host's, its settings and ref
// copies. It skips the test when the host has no such template.
func linkHostTemplate(t *testing.T, host, dd datadir.Dir, name string) template.Template {
	t.Helper()
	tpl, err := template.Open(dd).Link(template.Open(host), name)
	if errors.Is(err, errdefs.ErrNotFound) {
		testenv.Lacking(t, "template %s is missing: %v", name, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}

// goTool finds the go command, which builds test programs.
func goTool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	//lint:ignore SA1019 the test runs where it was built, so the build's GOROOT is there
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err != nil {
		testenv.Lacking(t, "no go command to build the guest's programs with")
	}
	return p
}

// goBuild builds a static program: the package pkg of this module, or
// the single file src when pkg is empty.
func goBuild(t *testing.T, out, src, pkg string) {
	t.Helper()
	args := []string{"build", "-trimpath", "-o", out}
	cmd := exec.Command(goTool(t), append(args, pkg)...)
	if pkg == "" {
		cmd = exec.Command(goTool(t), append(args, filepath.Base(src))...)
		cmd.Dir = filepath.Dir(src)
	}
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s%s: %v: %s", pkg, src, err, b)
	}
}

// writeInitramfs writes to dst the initramfs base with a second archive
// appended that holds agent as /init.
func writeInitramfs(t *testing.T, base, agent, dst string) {
	t.Helper()
	b, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	if len(b)%4 != 0 {
		t.Fatalf("%s is %d bytes, not a whole cpio archive", base, len(b))
	}
	bin, err := os.ReadFile(agent)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	buf.Write(b)
	w := cpio.NewWriter(&buf)
	if err := w.WriteHeader(&cpio.Header{Name: strings.TrimPrefix(guest.InitPath, "/"), Mode: cpio.TypeReg | 0o755, Size: int64(len(bin)), Links: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(bin); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// exec runs req in sb and returns its stdout, stderr and exit; the exec
// itself must start.
func execIn(ctx context.Context, t *testing.T, sb *Sandbox, req agentproto.ExecRequest) (string, string, agentproto.Exit) {
	t.Helper()
	var out, errb bytes.Buffer
	p, err := sb.Exec(ctx, req, agentclient.Stdio{Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("exec %+v: %v", req, err)
	}
	exit, err := sb.Wait(p)
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), exit
}

// expectOutput runs req in sb and checks it exits 0 with stdout matching
// want (a regular expression).
func expectOutput(ctx context.Context, t *testing.T, sb *Sandbox, req agentproto.ExecRequest, want string) string {
	t.Helper()
	out, errOut, exit := execIn(ctx, t, sb, req)
	if exit.ExitCode != 0 || !regexp.MustCompile(want).MatchString(out) {
		t.Errorf("%+v: exit %d, stdout %q, stderr %q; want stdout matching %q", req, exit.ExitCode, out, errOut, want)
	}
	return out
}

// helloGo is the one program of the shell-less tree: it reports who runs
// it and reads and writes files, with nothing else in the image.
const helloGo = `package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

func main() {
	switch os.Args[1] {
	case "id":
		wd, _ := os.Getwd()
		fmt.Printf("uid=%d gid=%d home=%s user=%s cwd=%s\n", os.Getuid(), os.Getgid(), os.Getenv("HOME"), os.Getenv("USER"), wd)
	case "cat":
		b, err := os.ReadFile(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Stdout.Write(b)
	case "write":
		if err := os.WriteFile(os.Args[2], []byte(strings.Join(os.Args[3:], " ")), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case "fstype":
		var st syscall.Statfs_t
		if err := syscall.Statfs(os.Args[2], &st); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("%x\n", st.Type)
	}
}
`

// helloC is the musl tree's program, linked against musl's libc.so.
const helloC = `#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
	printf("hello from musl: uid=%d gid=%d args=%d\n", (int)getuid(), (int)getgid(), argc);
	return 0;
}
`

// muslCompiler returns a C compiler command that links against Debian's
// musl, and the libc.so of that musl: musl-gcc and the installed packages
// (apt-get install musl-tools), or else gcc with the specs of musl-dev
// and the libc.so of musl as apt-get downloads and unpacks them into dir,
// the specs rewritten to point there. It skips the test when neither can
// be had.
func muslCompiler(t *testing.T, dir string) (cc []string, libc string) {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		testenv.Lacking(t, "no gcc to link a musl program with")
	}
	if out, err := exec.Command("dpkg-query", "-L", "musl", "musl-dev").Output(); err == nil {
		var specs string
		for _, p := range strings.Fields(string(out)) {
			switch {
			case strings.HasSuffix(p, "/musl-gcc.specs"):
				specs = p
			case strings.HasSuffix(p, "/libc.so") && strings.Contains(p, "musl"):
				libc = p
			}
		}
		if musl, err := exec.LookPath("musl-gcc"); err == nil && libc != "" {
			return []string{musl}, libc
		}
		if specs != "" && libc != "" {
			return []string{gcc, "-specs", specs}, libc
		}
	}
	dl := exec.Command("apt-get", "download", "musl", "musl-dev")
	dl.Dir = dir
	if out, err := dl.CombinedOutput(); err != nil {
		testenv.Lacking(t, "musl is not installed (apt-get install musl-tools) and apt-get download musl musl-dev failed: %v: %s", err, lastLine(string(out)))
	}
	debs, _ := filepath.Glob(filepath.Join(dir, "*.deb"))
	tree := filepath.Join(dir, "musl")
	for _, d := range debs {
		if out, err := exec.Command("dpkg-deb", "-x", d, tree).CombinedOutput(); err != nil {
			t.Fatalf("dpkg-deb -x %s: %v: %s", d, err, out)
		}
	}
	found, _ := filepath.Glob(filepath.Join(tree, "usr/lib/*/musl-gcc.specs"))
	libs, _ := filepath.Glob(filepath.Join(tree, "lib/*musl*/libc.so"))
	if len(found) != 1 || len(libs) != 1 {
		t.Fatalf("Debian's musl packages hold specs %q and libc %q", found, libs)
	}
	b, err := os.ReadFile(found[0])
	if err != nil {
		t.Fatal(err)
	}
	// The specs name the packages' directories by absolute path.
	b = regexp.MustCompile(`/usr/(include|lib)/[^ /]*musl[^ /]*`).ReplaceAllFunc(b, func(p []byte) []byte {
		return append([]byte(tree), p...)
	})
	specs := filepath.Join(dir, "musl-gcc.specs")
	if err := os.WriteFile(specs, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{gcc, "-specs", specs}, libs[0]
}

// buildMuslTree makes an Alpine-like tree at root: merged /usr (/bin,
// /sbin and /lib are symlinks into it), musl's dynamic loader, a program
// dynamically linked against musl, busybox as /bin/sh with a few applets,
// and no /etc/passwd, /etc/group, /tmp or /run.
func buildMuslTree(t *testing.T, root string) {
	t.Helper()
	busybox, err := exec.LookPath("busybox")
	if err != nil || !staticELF(busybox) {
		testenv.Lacking(t, "no static busybox (apt-get install busybox-static): %v", err)
	}
	work := t.TempDir()
	cc, libc := muslCompiler(t, work)
	src := filepath.Join(work, "hello.c")
	if err := os.WriteFile(src, []byte(helloC), 0o644); err != nil {
		t.Fatal(err)
	}
	prog := filepath.Join(work, "hello-musl")
	// -L first: musl-dev has only libc.a, and would link it in; musl's
	// libc.so is beside the loader.
	args := append(cc[1:], "-L", filepath.Dir(libc), "-O2", "-o", prog, src)
	if out, err := exec.Command(cc[0], args...).CombinedOutput(); err != nil {
		t.Fatalf("link a musl program: %v: %s", err, out)
	}
	checkMuslLinked(t, prog)

	for _, d := range []string{"usr/bin", "usr/sbin", "usr/lib", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib"} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	copyTo := func(src, dst string, mode os.FileMode) {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, dst), b, mode); err != nil {
			t.Fatal(err)
		}
	}
	copyTo(libc, "usr/lib/ld-musl-x86_64.so.1", 0o755)
	copyTo(prog, "usr/bin/hello-musl", 0o755)
	copyTo(busybox, "usr/bin/busybox", 0o755)
	for _, applet := range []string{"sh", "cat", "echo", "id", "ls", "stat", "mkdir", "touch", "sleep", "sync"} {
		if err := os.Symlink("busybox", filepath.Join(root, "usr/bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "etc/alpine-release"), []byte("3.20.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// staticELF reports whether p is an ELF program without an interpreter.
func staticELF(p string) bool {
	f, err := elf.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

// checkMuslLinked fails the test unless p is run by musl's loader and
// needs musl's libc.so.
func checkMuslLinked(t *testing.T, p string) {
	t.Helper()
	f, err := elf.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var interp string
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b, _ := io.ReadAll(prog.Open())
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	libs, _ := f.ImportedLibraries()
	if interp != "/lib/ld-musl-x86_64.so.1" || len(libs) != 1 || libs[0] != "libc.so" {
		t.Fatalf("%s has interpreter %q and needs %q: want musl's loader and libc.so", p, interp, libs)
	}
}

// tmpfsMagic is TMPFS_MAGIC, statfs's type of a tmpfs, in hexadecimal.
const tmpfsMagic = "1021994"

// TestMinimalImagesVM boots two images airlock did not build, against
// real VMs with the agent of this tree: an Alpine-like one (merged /usr,
// musl, busybox as the only shell, no /etc/passwd, /tmp or /run) and one
// that is a single static binary (no /etc, no shell, nothing else).
// Commands given as argv run in both, as root and as a numeric user; a
// shell command in the one without /bin/sh is a clear error, as is a user
// name without /etc/passwd; init makes /tmp, /run and the sandbox's own
// files.
func TestMinimalImagesVM(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	rt := agentRuntime(t, ctx)
	settings := template.Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 128}

	boot := func(t *testing.T, name, tree string) *Sandbox {
		t.Helper()
		tpl, err := rt.Templates().Import(ctx, name, "", tree, settings)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		sb, err := rt.Create(ctx, Spec{Template: tpl.Ref()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sb.Destroy(context.Background()) })
		t.Logf("%s booted in %s; init warnings: %q", name, time.Since(start).Round(time.Millisecond), sb.Init.Warnings)
		if len(sb.Init.Warnings) > 0 {
			t.Errorf("init of %s warned: %q", name, sb.Init.Warnings)
		}
		return sb
	}
	userErr := func(t *testing.T, sb *Sandbox, argv []string) {
		t.Helper()
		_, err := sb.Exec(ctx, agentproto.ExecRequest{Argv: argv, User: "nobody"}, agentclient.Stdio{})
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "no /etc/passwd") {
			t.Errorf("exec as a user name without /etc/passwd: got %v, want a clear invalid error", err)
		}
	}

	t.Run("musl and busybox", func(t *testing.T) {
		tree := t.TempDir()
		buildMuslTree(t, tree)
		sb := boot(t, "musl-usrmerge", tree)
		expectOutput(ctx, t, sb, agentproto.ExecRequest{Argv: []string{"hello-musl", "a", "b"}},
			`^hello from musl: uid=0 gid=0 args=3\n$`)
		expectOutput(ctx, t, sb, agentproto.ExecRequest{Argv: []string{"/usr/bin/hello-musl"}, User: "1000:1000"},
			`^hello from musl: uid=1000 gid=1000 args=1\n$`)
		expectOutput(ctx, t, sb, agentproto.ExecRequest{Argv: []string{"hello-musl"}, User: "4242"},
			`^hello from musl: uid=4242 gid=4242 args=1\n$`)
		// A shell command, through /bin -> usr/bin, with /tmp and /run made.
		expectOutput(ctx, t, sb, agentproto.ExecRequest{Cmd: `cat /etc/alpine-release && echo x > /tmp/f && cat /tmp/f && stat -f -c %t /tmp /run && echo $HOME $USER`},
			`^3\.20\.0\nx\n`+tmpfsMagic+`\n`+tmpfsMagic+`\n/ root\n$`)
		expectOutput(ctx, t, sb, agentproto.ExecRequest{Cmd: "id -u; id -g; touch /tmp/mine && stat -c %u /tmp/mine", User: "65534:65534"},
			`^65534\n65534\n65534\n$`)
		expectOutput(ctx, t, sb, agentproto.ExecRequest{Argv: []string{"cat", agentproto.HostnameFile}}, `^`+sb.ID+`\n$`)
		userErr(t, sb, []string{"id"})
	})

	t.Run("one static binary", func(t *testing.T) {
		work, tree := t.TempDir(), t.TempDir()
		src := filepath.Join(work, "hello.go")
		if err := os.WriteFile(src, []byte(helloGo), 0o644); err != nil {
			t.Fatal(err)
		}
		goBuild(t, filepath.Join(tree, "hello"), src, "")
		sb := boot(t, "one-binary", tree)
		expectOutput(ctx, t, sb, agentproto.ExecRequest{Argv: []string{"/hello", "id"}}, `^uid=0 gid=0 home=/ user=root cwd=/\n$`)
		expectOutput(ctx, t, sb, agentproto.ExecRequest{Argv: []string{"/hello", "id"}, User: "1000:1000", Cwd: "/tmp"},
			`^uid=1000 gid=1000 home=/ user=1000 cwd=/tmp\n$`)
		expectOutput(ctx, t, sb, agentproto.ExecRequest{Argv: []string{"/hello", "write", "/tmp/by-user", "ok"}, User: "1000"}, `^$`)
		expectOutput(ctx, t, sb, agentproto.ExecRequest{Argv: []string{"/hello", "cat", "/tmp/by-user"}}, `^ok$`)
		expectOutput(ctx, t, sb, agentproto.ExecRequest{Argv: []string{"/hello", "fstype", "/tmp"}}, `^`+tmpfsMagic+`\n$`)
		expectOutput(ctx, t, sb, agentproto.ExecRequest{Argv: []string{"/hello", "fstype", "/run"}}, `^`+tmpfsMagic+`\n$`)
		// The sandbox's own files, in an image that had no /etc.
		expectOutput(ctx, t, sb, agentproto.ExecRequest{Argv: []string{"/hello", "cat", agentproto.HostnameFile}}, `^`+sb.ID+`\n$`)
		expectOutput(ctx, t, sb, agentproto.ExecRequest{Argv: []string{"/hello", "cat", agentproto.ResolvConfFile}},
			`^`+regexp.QuoteMeta(agentproto.ResolvConf(gateway.GatewayIP))+`$`)
		expectOutput(ctx, t, sb, agentproto.ExecRequest{Argv: []string{"/hello", "cat", agentproto.HostsFile}},
			`^`+regexp.QuoteMeta(agentproto.HostsHeader+agentproto.HostsLine(sb.ID))+`$`)
		bundle := expectOutput(ctx, t, sb, agentproto.ExecRequest{Argv: []string{"/hello", "cat", agentproto.CABundles()[0]}}, `BEGIN CERTIFICATE`)
		if ca := sb.ca; ca == nil || bundle != string(ca.CertPEM()) {
			t.Errorf("the trust store made for the image holds %q, want the sandbox's CA alone", bundle)
		}

		_, err := sb.Exec(ctx, agentproto.ExecRequest{Cmd: "echo hi"}, agentclient.Stdio{})
		if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "this template has no /bin/sh; pass argv instead") {
			t.Errorf("a shell command without /bin/sh: got %v, want the clear error", err)
		} else {
			t.Log(err)
		}
		userErr(t, sb, []string{"/hello", "id"})
		if _, err := sb.Exec(ctx, agentproto.ExecRequest{Argv: []string{"ls"}}, agentclient.Stdio{}); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("a program the image lacks: got %v, want not found", err)
		}
	})
}
