package sandbox

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/testenv"
)

// requireE2fsprogs skips a test without e2fsprogs' tools.
func requireE2fsprogs(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"mkfs.ext4", "debugfs", "e2fsck", "resize2fs", "dumpe2fs"} {
		if _, err := toolPath(tool); err != nil {
			testenv.Lacking(t, "%v", err)
		}
	}
}

// makeImage makes an ext4 image of sizeMiB in dir from tree: path (relative)
// to content, "-> target" for a symlink, a trailing "/" on the path for an
// empty directory.
func makeImage(t *testing.T, dir, name string, sizeMiB int, tree map[string]string) string {
	t.Helper()
	root := filepath.Join(dir, name+".tree")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	for p, content := range tree {
		full := filepath.Join(root, p)
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		if target, ok := strings.CutPrefix(content, "-> "); ok {
			err = os.Symlink(target, full)
		} else {
			err = os.WriteFile(full, []byte(content), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	img := filepath.Join(dir, name+".ext4")
	mkfs, _ := toolPath("mkfs.ext4")
	if out, err := exec.Command(mkfs, "-q", "-F", "-t", "ext4", "-b", "4096", "-d", root, img, strconv.Itoa(sizeMiB)+"M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	return img
}

const (
	testCA    = "-----BEGIN CERTIFICATE-----\nTHESANDBOXCA\n-----END CERTIFICATE-----\n"
	otherCert = "-----BEGIN CERTIFICATE-----\nOTHER\n-----END CERTIFICATE-----\n"
	userCert  = "-----BEGIN CERTIFICATE-----\nUSERS\n-----END CERTIFICATE-----\n"
)

func TestRemoveGuestFiles(t *testing.T) {
	requireE2fsprogs(t)
	g := guestFiles{Hostname: "sbx1", Gateway: "10.0.2.2", CACert: []byte(strings.TrimSuffix(testCA, "\n"))}
	resolv := agentproto.ResolvConf(g.Gateway)
	line := agentproto.HostsLine(g.Hostname)
	tests := []struct {
		name     string
		template map[string]string
		sandbox  map[string]string // the template as init and the sandbox left it
		want     map[string]string // path to content, "-> target", "dir/", or "" for absent
	}{
		{
			name: "busybox template",
			template: map[string]string{
				"etc/hostname": "airlock\n",
				"etc/hosts":    "127.0.0.1\tlocalhost\n",
				"bin/sh":       "-> busybox",
			},
			sandbox: map[string]string{
				"etc/hostname":                      "sbx1\n",
				"etc/hosts":                         "127.0.0.1\tlocalhost\n" + line,
				"etc/resolv.conf":                   resolv,
				"etc/ssl/certs/ca-certificates.crt": testCA,
				// An older agent wrote this whatever the image.
				"usr/local/share/ca-certificates/airlock-gateway.crt": testCA,
				"bin/sh":   "-> busybox",
				"data.txt": "the sandbox's own\n",
			},
			want: map[string]string{
				"etc/hostname": "airlock\n", "etc/hosts": "127.0.0.1\tlocalhost\n",
				"etc/resolv.conf": "", "etc/ssl": "", "usr/local": "", "usr": "usr/",
				"data.txt": "the sandbox's own\n", "bin/sh": "-> busybox",
			},
		},
		{
			name: "debian template, changed by the sandbox",
			template: map[string]string{
				"etc/hostname":                      "debian\n",
				"etc/hosts":                         "127.0.0.1 localhost", // no final newline
				"etc/resolv.conf":                   "-> ../run/systemd/resolve/stub-resolv.conf",
				"etc/ssl/certs/ca-certificates.crt": otherCert,
				"usr/local/share/ca-certificates/":  "",
			},
			sandbox: map[string]string{
				"etc/hostname":                      "myhost\n", // the sandbox's choice
				"etc/hosts":                         "127.0.0.1 localhost\n" + line + "10.1.1.1 db\n",
				"etc/resolv.conf":                   resolv,
				"etc/ssl/certs/ca-certificates.crt": otherCert + testCA + userCert,
				"etc/ssl/certs/airlock-gateway.pem": "-> " + agentproto.CACertFile,
				agentproto.CACertFile[1:]:           testCA,
			},
			want: map[string]string{
				"etc/hostname":                      "myhost\n",
				"etc/hosts":                         "127.0.0.1 localhost\n10.1.1.1 db\n",
				"etc/resolv.conf":                   "-> ../run/systemd/resolve/stub-resolv.conf",
				"etc/ssl/certs/ca-certificates.crt": otherCert + userCert,
				"etc/ssl/certs/airlock-gateway.pem": "",
				agentproto.CACertFile[1:]:           "",
				"usr/local/share/ca-certificates":   "usr/local/share/ca-certificates/",
			},
		},
		{
			name: "fedora template",
			template: map[string]string{
				"etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem": otherCert,
				"etc/pki/tls/certs/ca-bundle.crt":                  "-> ../../ca-trust/extracted/pem/tls-ca-bundle.pem",
				"etc/ssl/certs":                                    "-> ../pki/tls/certs",
				"etc/hosts":                                        "127.0.0.1 localhost\n",
			},
			sandbox: map[string]string{
				"etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem": otherCert + testCA,
				"etc/pki/tls/certs/ca-bundle.crt":                  "-> ../../ca-trust/extracted/pem/tls-ca-bundle.pem",
				"etc/ssl/certs":                                    "-> ../pki/tls/certs",
				"etc/hosts":                                        "127.0.0.1 localhost\n" + line,
				"etc/hostname":                                     "sbx1\n",
			},
			want: map[string]string{
				"etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem": otherCert,
				"etc/pki/tls/certs/ca-bundle.crt":                  "-> ../../ca-trust/extracted/pem/tls-ca-bundle.pem",
				"etc/ssl/certs":                                    "-> ../pki/tls/certs",
				"etc/hosts":                                        "127.0.0.1 localhost\n",
				"etc/hostname":                                     "",
			},
		},
		{
			name: "arch template: the bundle elsewhere",
			template: map[string]string{
				"etc/ca-certificates/extracted/tls-ca-bundle.pem": otherCert,
				"etc/ssl/certs/ca-certificates.crt":               "-> ../../ca-certificates/extracted/tls-ca-bundle.pem",
			},
			sandbox: map[string]string{
				"etc/ca-certificates/extracted/tls-ca-bundle.pem": otherCert + testCA,
				"etc/ssl/certs/ca-certificates.crt":               "-> ../../ca-certificates/extracted/tls-ca-bundle.pem",
			},
			want: map[string]string{
				"etc/ca-certificates/extracted/tls-ca-bundle.pem": otherCert,
				"etc/ssl/certs/ca-certificates.crt":               "-> ../../ca-certificates/extracted/tls-ca-bundle.pem",
			},
		},
		{
			name:     "odd layout",
			template: map[string]string{"etc/ssl": "a file", "etc/pki": "-> pki"},
			sandbox:  map[string]string{"etc/ssl": "a file", "etc/pki": "-> pki", "etc/hostname": "sbx1\n"},
			want:     map[string]string{"etc/ssl": "a file", "etc/pki": "-> pki", "etc/hostname": ""},
		},
		{
			name:     "a tree of one binary",
			template: map[string]string{"hello": "ELF"},
			sandbox: map[string]string{
				"hello":                             "ELF",
				"etc/hostname":                      "sbx1\n",
				"etc/hosts":                         agentproto.HostsHeader + line,
				"etc/resolv.conf":                   resolv,
				"etc/ssl/certs/ca-certificates.crt": testCA,
				"tmp/":                              "", // a mount point init made stays
			},
			want: map[string]string{"hello": "ELF", "etc": "", "tmp": "tmp/"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			base := makeImage(t, dir, "template", 16, tc.template)
			img := makeImage(t, dir, "sandbox", 16, tc.sandbox)
			if err := removeGuestFiles(ctx, ImageTools{}, img, base, g); err != nil {
				t.Fatal(err)
			}
			checkImage(t, img, tc.want)
			if err := fsck(ctx, ImageTools{}, img); err != nil {
				t.Errorf("the edited image does not check clean: %v", err)
			}
		})
	}
}

// checkImage checks what img holds at each path of want (see
// TestRemoveGuestFiles).
func checkImage(t *testing.T, img string, want map[string]string) {
	t.Helper()
	ctx := context.Background()
	im := ext4Image{path: img}
	for p, w := range want {
		e, err := im.stat(ctx, "/"+p)
		if err != nil {
			t.Fatalf("stat %s: %v", p, err)
		}
		switch target, isLink := strings.CutPrefix(w, "-> "); {
		case w == "":
			if e.exists() {
				t.Errorf("%s is there (%s), want it gone", p, e.Type)
			}
		case strings.HasSuffix(w, "/"):
			if e.Type != "directory" {
				t.Errorf("%s is %q, want a directory", p, e.Type)
			}
		case isLink:
			if e.Type != "symlink" || e.Target != target {
				t.Errorf("%s is %q -> %q, want a symlink to %q", p, e.Type, e.Target, target)
			}
		default:
			if !e.regular() {
				t.Errorf("%s is %q, want a file", p, e.Type)
				continue
			}
			b, err := im.readFile(ctx, "/"+p)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != w {
				t.Errorf("%s holds %q, want %q", p, b, w)
			}
		}
	}
}

func TestRemovePEM(t *testing.T) {
	pem := []byte(testCA)
	tests := []struct{ name, in, want string }{
		{"alone", testCA, ""},
		{"appended", otherCert + testCA, otherCert},
		{"in the middle", otherCert + testCA + userCert, otherCert + userCert},
		{"no final newline", otherCert + strings.TrimSuffix(testCA, "\n"), otherCert},
		{"twice", testCA + otherCert + testCA, otherCert},
		{"absent", otherCert, otherCert},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(removePEM([]byte(tc.in), pem)); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRemoveLines(t *testing.T) {
	line := agentproto.HostsLine("sbx1")
	tests := []struct{ name, in, want string }{
		{"last", "a\n" + line, "a\n"},
		{"middle", "a\n" + line + "b\n", "a\nb\n"},
		{"without newline", "a\n" + strings.TrimSuffix(line, "\n"), "a\n"},
		{"a longer name stays", "127.0.1.1 sbx12\n", "127.0.1.1 sbx12\n"},
		{"only", line, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(removeLines([]byte(tc.in), line)); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// finishImage shrinks a copy to its filesystem's minimum and keeps its
// content.
func TestFinishImage(t *testing.T) {
	requireE2fsprogs(t)
	ctx := context.Background()
	dir := t.TempDir()
	tree := map[string]string{"etc/hostname": "sbx1\n", "data/file": strings.Repeat("x", 1<<20)}
	base := makeImage(t, dir, "template", 16, map[string]string{"etc/hostname": "tpl\n"})
	img := makeImage(t, dir, "copy", 256, tree)
	size, err := finishImage(ctx, ImageTools{}, img, base, guestFiles{Hostname: "sbx1"})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(img)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != size || size >= 64<<20 {
		t.Errorf("image of %d bytes (reported %d): want it shrunk well below its 256 MiB", fi.Size(), size)
	}
	t.Logf("a 256 MiB filesystem holding 1 MiB shrank to %d KiB", size>>10)
	checkImage(t, img, map[string]string{"etc/hostname": "tpl\n", "data/file": strings.Repeat("x", 1<<20)})
	if err := fsck(ctx, ImageTools{}, img); err != nil {
		t.Error(err)
	}
}
