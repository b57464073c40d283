package template

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Suite is the Debian release the built-in templates are made from.
const Suite = "bookworm"

// basePackages are installed into the base template on top of minbase.
var basePackages = []string{"python3", "bash", "coreutils", "procps", "ca-certificates", "curl"}

// baseExtraPackages are installed into the base template with apt-get
// after debootstrap: what agents reach for first besides a shell and
// Python (pip and venv for Python packages, git, and a C toolchain for
// the packages that build native code).
var baseExtraPackages = []string{"python3-pip", "python3-venv", "git", "build-essential"}

// codeInterpreterPackages are installed into the code-interpreter
// template on top of basePackages: Jupyter's Python kernel and client,
// the data libraries E2B's code interpreter offers, Node.js and the
// TypeScript compiler for JavaScript and TypeScript, and R's Jupyter
// kernel (IRkernel). Bash is in the base already.
var codeInterpreterPackages = []string{
	"python3-ipykernel", "python3-jupyter-client", "python3-matplotlib-inline",
	"python3-numpy", "python3-pandas", "python3-matplotlib",
	"nodejs", "node-typescript", "r-cran-irkernel",
}

// codeInterpreterServer is the server of E2B's code interpreter protocol
// (port 49999: /execute, /contexts, /health) over Jupyter kernels, node
// and bash.
//
//go:embed codeinterpreter/server.py
var codeInterpreterServer []byte

// codeInterpreterNodeDriver runs the JavaScript and TypeScript cells of
// one code context in a node process; the server starts it from beside
// itself.
//
//go:embed codeinterpreter/node-driver.js
var codeInterpreterNodeDriver []byte

// Where the code-interpreter template holds its server and the node
// driver, and the port it serves on (E2B's).
const (
	CodeInterpreterServerPath     = "/opt/airlock/code-interpreter/server.py"
	CodeInterpreterNodeDriverPath = "/opt/airlock/code-interpreter/node-driver.js"
	CodeInterpreterPort           = 49999
)

// baseRecipe identifies what the base template is made of, so that setup
// rebuilds it when its packages change.
func baseRecipe() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n", Suite, strings.Join(basePackages, ","), strings.Join(baseExtraPackages, ","))
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// codeInterpreterRecipe identifies what the code-interpreter template is
// made of, so that setup rebuilds it when its packages, its server or the
// server's node driver change.
func codeInterpreterRecipe() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%s\n", Suite, strings.Join(basePackages, ","), strings.Join(baseExtraPackages, ","), strings.Join(codeInterpreterPackages, ","))
	for _, f := range codeInterpreterFiles() {
		// Each file's path and length first, so that moving bytes from
		// one file to the next changes the hash.
		fmt.Fprintf(h, "%s %d\n", f.path, len(f.data))
		h.Write(f.data)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// treeFile is a file airlock writes into a built-in template's tree: its
// path there, a constant, and its bytes, embedded in the binary.
type treeFile struct {
	path string
	data []byte
}

// codeInterpreterFiles are the files airlock writes into the
// code-interpreter template.
func codeInterpreterFiles() []treeFile {
	return []treeFile{
		{CodeInterpreterServerPath, codeInterpreterServer},
		{CodeInterpreterNodeDriverPath, codeInterpreterNodeDriver},
	}
}

// BuildConfig says where and how built-in templates are made.
type BuildConfig struct {
	// Cache is a directory for the temporary root tree and for downloads
	// that later builds reuse (debootstrap's package cache). Required;
	// normally datadir.Dir.Cache().
	Cache string
	// Mirror is the Debian archive URL for debootstrap. Default: the one
	// the host's apt configuration uses for Suite (see AptMirror).
	Mirror string
	// AptDir is the apt configuration directory Mirror is read from.
	// Default /etc/apt.
	AptDir string
	// Out receives progress lines. Nil discards them.
	Out io.Writer
}

// Builtin is a template airlock knows how to make from Debian packages.
type Builtin struct {
	// Name is the template name; it is stored with tag DefaultTag.
	Name string
	// Defaults are the sandbox settings it is stored with.
	Defaults Settings
	// Describe says in a few words what it holds.
	Describe string
	// build fills the empty directory root with the tree.
	build func(ctx context.Context, root string, cfg BuildConfig) error
}

// Builtins returns the built-in templates, smallest first.
func Builtins() []Builtin {
	return []Builtin{
		{
			Name:     "tiny",
			Defaults: Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 256},
			Describe: "busybox from Debian's busybox-static",
			build:    buildTiny,
		},
		{
			Name:     "base",
			Defaults: Settings{VCPUs: 1, MemoryMiB: 512, DiskMiB: 2048, Recipe: baseRecipe()},
			Describe: "Debian " + Suite + " minbase with " + strings.Join(append(slices.Clone(basePackages), baseExtraPackages...), ", "),
			build:    buildBase,
		},
		{
			Name: "code-interpreter",
			Defaults: Settings{
				VCPUs: 2, MemoryMiB: 1024, DiskMiB: 4096,
				StartCmd:  "exec /usr/bin/python3 " + CodeInterpreterServerPath,
				ReadyPort: CodeInterpreterPort, ReadyPath: "/health",
				Recipe: codeInterpreterRecipe(),
			},
			Describe: "base with Jupyter's Python kernel, numpy, pandas and matplotlib, Node.js with TypeScript, R's Jupyter kernel, and a server of E2B's code interpreter protocol on port 49999",
			build:    buildCodeInterpreter,
		},
	}
}

// LookupBuiltin returns the built-in template with the given name.
func LookupBuiltin(name string) (Builtin, bool) {
	i := slices.IndexFunc(Builtins(), func(b Builtin) bool { return b.Name == name })
	if i < 0 {
		return Builtin{}, false
	}
	return Builtins()[i], true
}

// BuildBuiltin makes the built-in template name in a temporary tree under
// cfg.Cache, imports it as name:latest and removes the tree, whether or not
// the build succeeded. It needs root, because the files of a root
// filesystem must be owned by root.
func (s *Store) BuildBuiltin(ctx context.Context, name string, cfg BuildConfig) (Template, error) {
	b, ok := LookupBuiltin(name)
	if !ok {
		var names []string
		for _, b := range Builtins() {
			names = append(names, b.Name)
		}
		return Template{}, fmt.Errorf("build template %q: no such built-in template (have %s): %w",
			name, strings.Join(names, ", "), errdefs.ErrInvalid)
	}
	if os.Geteuid() != 0 {
		return Template{}, fmt.Errorf("build template %s: needs root to give its files root ownership: run `sudo airlock setup`: %w",
			name, errdefs.ErrPrecondition)
	}
	if cfg.Cache == "" {
		return Template{}, fmt.Errorf("build template %s: no cache directory given: %w", name, errdefs.ErrInvalid)
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	cache, err := filepath.Abs(cfg.Cache)
	if err != nil {
		return Template{}, fmt.Errorf("build template %s: %w", name, err)
	}
	cfg.Cache = cache
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return Template{}, fmt.Errorf("build template %s: %w", name, err)
	}
	tmp, err := os.MkdirTemp(cache, "rootfs-"+name+"-")
	if err != nil {
		return Template{}, fmt.Errorf("build template %s: %w", name, err)
	}
	t, err := s.buildIn(ctx, b, tmp, cfg)
	if cerr := removeTree(tmp); cerr != nil {
		err = errors.Join(err, fmt.Errorf("build template %s: %w", name, cerr))
	}
	if err != nil {
		return Template{}, err
	}
	return t, nil
}

// buildIn builds b's tree in tmp/root and imports it.
func (s *Store) buildIn(ctx context.Context, b Builtin, tmp string, cfg BuildConfig) (Template, error) {
	root := filepath.Join(tmp, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		return Template{}, fmt.Errorf("build template %s: %w", b.Name, err)
	}
	if err := b.build(ctx, root, cfg); err != nil {
		return Template{}, fmt.Errorf("build template %s: %w", b.Name, err)
	}
	fmt.Fprintf(cfg.Out, "making the ext4 image\n")
	return s.Import(ctx, b.Name, DefaultTag, root, b.Defaults)
}

// removeTree removes a build tree, first detaching anything a failed build
// left mounted inside it, so that removal never reaches into /proc or /dev.
func removeTree(dir string) error {
	mounts, err := mountsUnder(dir)
	if err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	for _, m := range mounts {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("remove %s: unmount %s: %w", dir, m, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// mountsUnder returns the mount points inside dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	prefix := filepath.Clean(dir) + "/"
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		// Octal escapes (\040 for a space) do not occur in our temp paths.
		if mp := f[4]; strings.HasPrefix(mp, prefix) {
			out = append(out, mp)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out, nil
}

// buildTiny makes a busybox tree: the static busybox of Debian's
// busybox-static package with a symlink per applet, minimal passwd and
// group files and the usual empty directories.
func buildTiny(ctx context.Context, root string, cfg BuildConfig) error {
	bb, err := staticBusybox(ctx)
	if err != nil {
		return err
	}
	dirs := []struct {
		path string
		mode fs.FileMode
	}{
		{"bin", 0o755}, {"sbin", 0o755}, {"usr/bin", 0o755}, {"usr/sbin", 0o755},
		{"etc", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755},
		{"tmp", fs.ModeSticky | 0o777}, {"root", 0o700}, {"run", 0o755}, {"mnt", 0o755},
		{"var", 0o755}, {"var/tmp", fs.ModeSticky | 0o777}, {"home", 0o755},
	}
	for _, d := range dirs {
		p := filepath.Join(root, d.path)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil { // MkdirAll is subject to umask
			return err
		}
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		return fmt.Errorf("read busybox: %w", err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), data, 0o755); err != nil {
		return err
	}
	list, err := exec.CommandContext(ctx, bb, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("busybox --list-full: %w", err)
	}
	applets := 0
	for _, p := range strings.Fields(string(list)) {
		p = filepath.Clean(strings.TrimPrefix(p, "/"))
		if p == "bin/busybox" || strings.HasPrefix(p, "..") {
			continue
		}
		dst := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.Symlink("/bin/busybox", dst); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		applets++
	}
	if _, err := os.Lstat(filepath.Join(root, "bin", "sh")); err != nil {
		if err := os.Symlink("/bin/busybox", filepath.Join(root, "bin", "sh")); err != nil {
			return err
		}
	}
	files := map[string]string{
		"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":    "root:x:0:\nnogroup:x:65534:\n",
		"etc/hostname": "airlock\n",
		"etc/hosts":    "127.0.0.1\tlocalhost\n::1\tlocalhost\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(cfg.Out, "busybox with %d applets\n", applets)
	return nil
}

// staticBusybox finds the static busybox that Debian's busybox-static
// package installs and checks that it is statically linked.
func staticBusybox(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "dpkg-query", "-L", "busybox-static").Output()
	if err != nil {
		return "", fmt.Errorf("find busybox: package busybox-static is not installed (apt-get install busybox-static): %w", errdefs.ErrPrecondition)
	}
	for _, p := range strings.Fields(string(out)) {
		if !strings.HasSuffix(p, "/bin/busybox") {
			continue
		}
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		static := true
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				static = false
			}
		}
		f.Close()
		if static {
			return p, nil
		}
	}
	return "", fmt.Errorf("find busybox: busybox-static installs no static bin/busybox: %w", errdefs.ErrPrecondition)
}

// buildBase makes a Debian minbase tree with basePackages and
// baseExtraPackages.
func buildBase(ctx context.Context, root string, cfg BuildConfig) error {
	return debootstrapTree(ctx, root, cfg, basePackages, baseExtraPackages)
}

// buildCodeInterpreter makes the base tree with codeInterpreterPackages
// too, drops documentation, and adds the code interpreter's files and
// E2B's working directory /home/user.
func buildCodeInterpreter(ctx context.Context, root string, cfg BuildConfig) error {
	if err := debootstrapTree(ctx, root, cfg, basePackages, append(slices.Clone(baseExtraPackages), codeInterpreterPackages...)); err != nil {
		return err
	}
	for _, pattern := range []string{"usr/share/doc/*", "usr/share/man/*", "usr/share/info/*"} {
		matches, _ := filepath.Glob(filepath.Join(root, pattern))
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				return err
			}
		}
	}
	for _, f := range codeInterpreterFiles() {
		p := filepath.Join(root, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, f.data, 0o644); err != nil {
			return err
		}
	}
	return os.MkdirAll(filepath.Join(root, "home", "user"), 0o755)
}

// debootstrapTree makes a Debian minbase tree with the given packages
// with debootstrap, caching the packages under cfg.Cache, then installs
// extra with apt-get in the tree (debootstrap's own dependency resolver
// is too simple for large package sets such as Jupyter's), and strips
// apt's lists and caches.
func debootstrapTree(ctx context.Context, root string, cfg BuildConfig, packages, extra []string) error {
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return fmt.Errorf("debootstrap not found (apt-get install debootstrap): %w", errdefs.ErrPrecondition)
	}
	mirror := cfg.Mirror
	if mirror == "" {
		aptDir := cfg.AptDir
		if aptDir == "" {
			aptDir = "/etc/apt"
		}
		var err error
		if mirror, err = AptMirror(aptDir, Suite); err != nil {
			return err
		}
	}
	pkgCache := filepath.Join(cfg.Cache, "debootstrap")
	if err := os.MkdirAll(pkgCache, 0o755); err != nil {
		return err
	}
	fmt.Fprintf(cfg.Out, "debootstrap %s from %s\n", Suite, mirror)
	args := []string{
		"--variant=minbase", "--include=" + strings.Join(packages, ","),
		"--cache-dir=" + pkgCache, Suite, root, mirror,
	}
	if err := runStreaming(ctx, cfg.Out, "debootstrap", args...); err != nil {
		if log, rerr := os.ReadFile(filepath.Join(root, "debootstrap", "debootstrap.log")); rerr == nil {
			err = fmt.Errorf("debootstrap.log ends with:\n%s\n%w", tail(log, 20), err)
		}
		return err
	}
	if len(extra) > 0 {
		if err := aptInstall(ctx, root, cfg, extra); err != nil {
			return err
		}
	}
	for _, pattern := range []string{
		"var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb",
		"var/log/apt/*", "var/log/dpkg.log", "var/cache/debconf/*-old",
	} {
		matches, _ := filepath.Glob(filepath.Join(root, pattern))
		for _, m := range matches {
			if filepath.Base(m) == "partial" || filepath.Base(m) == "lock" {
				continue
			}
			if err := os.RemoveAll(m); err != nil {
				return err
			}
		}
	}
	return os.WriteFile(filepath.Join(root, "etc", "hostname"), []byte("airlock\n"), 0o644)
}

// runStreaming runs a command, forwarding to out each change of phase in
// its "I: <Phase> ..." lines and the elapsed time every ten seconds. On
// failure the error carries the last lines of its output.
func runStreaming(ctx context.Context, out io.Writer, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	start := time.Now()
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	pw.Close()

	lines := make(chan string)
	// The reader ends when the command and its children close the pipe.
	go func() {
		defer close(lines)
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	var last []string
	phase := ""
	for done := false; !done; {
		select {
		case line, ok := <-lines:
			if !ok {
				done = true
				break
			}
			last = append(last, line)
			if len(last) > 20 {
				last = last[1:]
			}
			msg, isInfo := strings.CutPrefix(line, "I: ")
			if !isInfo {
				if strings.HasPrefix(line, "W: ") || strings.HasPrefix(line, "E: ") {
					fmt.Fprintf(out, "%s: %s\n", name, line)
				}
				continue
			}
			p, _, _ := strings.Cut(msg, " ")
			if p == "Validating" {
				p = "Retrieving" // debootstrap alternates the two per package
			}
			if p != phase {
				phase = p
				fmt.Fprintf(out, "%s: %s (%ds)\n", name, msg, int(time.Since(start).Seconds()))
			}
		case <-tick.C:
			doing := "running"
			if phase != "" {
				doing = strings.ToLower(phase)
			}
			fmt.Fprintf(out, "%s: still %s (%ds)\n", name, doing, int(time.Since(start).Seconds()))
		}
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("%s failed; its output ended with:\n%s\n%w", name, strings.Join(last, "\n"), err)
	}
	return nil
}

// tail returns the last n lines of b.
func tail(b []byte, n int) string {
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// aptInstall installs packages into the debootstrapped tree at root with
// apt-get run chrooted into it, its package downloads kept in
// cfg.Cache/apt-archives for later builds. The tree borrows the host's
// resolv.conf while apt runs.
func aptInstall(ctx context.Context, root string, cfg BuildConfig, packages []string) error {
	archives := filepath.Join(cfg.Cache, "apt-archives")
	inTree := filepath.Join(root, "var", "cache", "apt", "archives")
	for _, d := range []string{filepath.Join(archives, "partial"), inTree} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount(archives, inTree, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s into the tree: %w", archives, err)
	}
	defer unix.Unmount(inTree, unix.MNT_DETACH)
	resolv := filepath.Join(root, "etc", "resolv.conf")
	if b, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		if err := os.WriteFile(resolv, b, 0o644); err != nil {
			return err
		}
		defer os.Remove(resolv)
	}
	env := []string{"DEBIAN_FRONTEND=noninteractive", "LC_ALL=C", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	fmt.Fprintf(cfg.Out, "apt-get install %s\n", strings.Join(packages, " "))
	for _, args := range [][]string{
		{"apt-get", "update", "-q"},
		append([]string{"apt-get", "install", "-q", "-y", "--no-install-recommends"}, packages...),
	} {
		cmd := exec.CommandContext(ctx, "chroot", append([]string{root}, args...)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("chroot %s: %v; its output ended with:\n%s", strings.Join(args, " "), err, tail(out, 20))
		}
		fmt.Fprintf(cfg.Out, "%s: done\n", strings.Join(args[:2], " "))
	}
	return nil
}
