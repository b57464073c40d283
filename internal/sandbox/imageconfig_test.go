package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/agentproto"
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
