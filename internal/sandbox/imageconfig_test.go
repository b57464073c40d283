package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testenv"
)

// TestWriteImageConfig writes a template's configuration and working
// directory into an image, and tries what a tenant would: a working
// directory whose newline starts a debugfs shell escape ("!") or a
// host-file copy ("dump"), and a double quote that would end the quoting.
// None may run, unjailed or jailed; the refusal names the field.
func TestWriteImageConfig(t *testing.T) {
	requireE2fsprogs(t)
	ctx := context.Background()
	tools := []ImageTools{{}}
	if os.Geteuid() == 0 {
		tools = append(tools, ImageTools{uid: 1999999004})
	}
	for _, tt := range tools {
		dir := t.TempDir()
		os.Chmod(dir, 0o755)
		img := makeImage(t, dir, "img", 16, map[string]string{"bin/": "", "etc/hostname": "x\n"})
		if err := tt.Own(img); err != nil {
			t.Fatal(err)
		}
		conf := []byte(`{"working_dir": "/srv/my app"}` + "\n")
		if err := WriteImageConfig(ctx, tt, img, conf, "/srv/my app"); err != nil {
			t.Fatalf("uid %d: %v", tt.uid, err)
		}
		im := ext4Image{path: img, tools: tt}
		if got, err := im.readFile(ctx, agentproto.ImageConfigFile); err != nil || string(got) != string(conf) {
			t.Errorf("uid %d: config reads back %q, %v", tt.uid, got, err)
		}
		if e, err := im.stat(ctx, "/srv/my app"); err != nil || e.Type != "directory" {
			t.Errorf("uid %d: workdir is %+v, %v", tt.uid, e, err)
		}
		if e, err := im.stat(ctx, agentproto.ImageConfigFile); err != nil || e.UID != 0 || e.GID != 0 {
			t.Errorf("uid %d: config file %+v, %v: want root's", tt.uid, e, err)
		}

		marker := filepath.Join(dir, "ran")
		secret := filepath.Join(dir, "host-secret")
		os.WriteFile(secret, []byte("host secret"), 0o644)
		for _, wd := range []string{
			"/x\n!touch " + marker,
			"/x\n!touch " + marker + " #",
			"/x\n!/bin/sh -c 'echo pwned > " + marker + "'",
			"/x\nwrite " + secret + " /stolen",
			"/x\rdump /etc/hostname " + marker,
			`/x" "/y`,
			"/x\x00y",
		} {
			err := WriteImageConfig(ctx, tt, img, conf, wd)
			if err == nil || !strings.Contains(err.Error(), "working directory") {
				t.Errorf("uid %d: workdir %q: %v, want a refusal naming the working directory", tt.uid, wd, err)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Fatalf("uid %d: workdir %q ran a command on the host", tt.uid, wd)
			}
			if e, _ := im.stat(ctx, "/stolen"); e.exists() {
				t.Fatalf("uid %d: workdir %q copied a host file into the image", tt.uid, wd)
			}
		}
	}
}

// TestDebugfsArg: every path reaches debugfs quoted, and one that could
// end its line or its quoting is refused.
func TestDebugfsArg(t *testing.T) {
	for in, want := range map[string]string{
		"/etc/hosts": `"/etc/hosts"`, "/a b": `"/a b"`, "!x": `"!x"`, "/it's": `"/it's"`, `/a\b`: `"/a\b"`,
	} {
		if got, err := debugfsArg(in); err != nil || got != want {
			t.Errorf("debugfsArg(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"/a\nb", "/a\rb", `/a"b`, "/a\x00", "/a\x1bb", "/a\x85b"} {
		if got, err := debugfsArg(in); err == nil {
			t.Errorf("debugfsArg(%q) = %q, want an error", in, got)
		}
	}
}

// TestTreeRunner makes an image of a tree whose files keep an image's
// owners and modes (one root's alone) with mkfs.ext4 jailed, and checks
// that it is the image the same tree makes unjailed, byte for byte.
func TestTreeRunner(t *testing.T) {
	requireE2fsprogs(t)
	if os.Geteuid() != 0 {
		testenv.Lacking(t, "the tool jail needs root")
	}
	ctx := context.Background()
	tree := filepath.Join(t.TempDir(), "tree")
	os.MkdirAll(filepath.Join(tree, "etc/private"), 0o700)
	os.WriteFile(filepath.Join(tree, "etc/private/shadow"), []byte("root:x:1::\n"), 0o600)
	os.WriteFile(filepath.Join(tree, "etc/owned"), []byte("someone's\n"), 0o640)
	os.Chown(filepath.Join(tree, "etc/owned"), 1234, 5678)
	settings := template.Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 64}
	jailed, err := template.Open(datadir.Dir{Root: t.TempDir()}).PutTreeWith(ctx, tree, settings, ImageTools{uid: 1999999005}.TreeRunner())
	if err != nil {
		t.Fatal(err)
	}
	plain, err := template.Open(datadir.Dir{Root: t.TempDir()}).PutTree(ctx, tree, settings)
	if err != nil {
		t.Fatal(err)
	}
	if jailed.Digest != plain.Digest {
		t.Errorf("jailed mkfs made %s, unjailed %s", jailed.Digest, plain.Digest)
	}
	im := ext4Image{path: jailed.Image}
	if b, err := im.readFile(ctx, "/etc/private/shadow"); err != nil || string(b) != "root:x:1::\n" {
		t.Errorf("the root-only file in the jailed image: %q, %v", b, err)
	}
	if e, err := im.stat(ctx, "/etc/owned"); err != nil || e.UID != 1234 || e.GID != 5678 || e.Perm != 0o640 {
		t.Errorf("the owned file in the jailed image: %+v, %v", e, err)
	}
	if fi, err := os.Stat(jailed.Image); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("the jailed image is not root's: %v", err)
	}
}
