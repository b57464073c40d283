package agent

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// writeTree writes files (path relative to root: content) and symlinks
// (content "-> target") under root.
func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		if target, ok := strings.CutPrefix(content, "-> "); ok {
			err = os.Symlink(target, p)
		} else {
			err = os.WriteFile(p, []byte(content), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func contentOf(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestLookupUser(t *testing.T) {
	const passwd = "root:x:0:0:root:/root:/bin/sh\n" +
		"# a comment\n" +
		"broken line\n" +
		"app:x:1000:1000::/home/app:/bin/sh\n" +
		"nohome:x:1001:1001:::/bin/sh\n"
	const group = "root:x:0:\nwheel:x:10:app,other\napp:x:1000:\naudio:x:29:app\n"
	tests := []struct {
		name     string
		user     string
		noPasswd bool
		want     account
		wantErr  string
	}{
		{"root by default", "", false, account{cred: &syscall.Credential{}, home: "/root", name: "root"}, ""},
		{"root without passwd", "", true, account{cred: &syscall.Credential{}, home: rootHome(), name: "root"}, ""},
		{"name", "app", false, account{cred: &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{10, 29}}, home: "/home/app", name: "app"}, ""},
		{"listed uid", "1000", false, account{cred: &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{10, 29}}, home: "/home/app", name: "app"}, ""},
		{"listed uid with gid", "1000:29", false, account{cred: &syscall.Credential{Uid: 1000, Gid: 29, Groups: []uint32{10}}, home: "/home/app", name: "app"}, ""},
		{"empty home", "nohome", false, account{cred: &syscall.Credential{Uid: 1001, Gid: 1001}, home: "/", name: "nohome"}, ""},
		{"unlisted uid", "4242", false, account{cred: &syscall.Credential{Uid: 4242, Gid: 4242}, home: "/", name: "4242"}, ""},
		{"uid without passwd", "1000", true, account{cred: &syscall.Credential{Uid: 1000, Gid: 1000}, home: "/", name: "1000"}, ""},
		{"uid and gid without passwd", "1000:5", true, account{cred: &syscall.Credential{Uid: 1000, Gid: 5}, home: "/", name: "1000"}, ""},
		{"name without passwd", "app", true, account{}, "has no"},
		{"unknown name", "nobody", false, account{}, "does not exist"},
		{"bad gid", "1000:x", false, account{}, "not a name or uid[:gid]"},
		{"bad uid", ":5", false, account{}, "not a name or uid[:gid]"},
		{"uid out of range", "99999999999", false, account{}, "not a name or uid[:gid]"},
	}
	dir := t.TempDir()
	passwdPath, groupPath := filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	writeTree(t, dir, map[string]string{"passwd": passwd, "group": group})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pw, gr := passwdPath, groupPath
			if tc.noPasswd {
				pw, gr = filepath.Join(dir, "none"), filepath.Join(dir, "none")
			}
			got, err := lookupUser(tc.user, pw, gr)
			if tc.wantErr != "" {
				var pe *agentproto.Error
				if !errors.As(err, &pe) || pe.Code != agentproto.CodeInvalid || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %+v, %v; want an invalid error saying %q", got, err, tc.wantErr)
				}
				t.Log(err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.home != tc.want.home || got.name != tc.want.name || got.cred.Uid != tc.want.cred.Uid ||
				got.cred.Gid != tc.want.cred.Gid || !slices.Equal(got.cred.Groups, tc.want.cred.Groups) {
				t.Errorf("got %+v %+v, want %+v %+v", got, *got.cred, tc.want, *tc.want.cred)
			}
		})
	}
}

func TestAddHostsLine(t *testing.T) {
	tests := []struct {
		name, hosts, want string
	}{
		{"no file", "", agentproto.HostsHeader + "127.0.1.1 sbx1\n"},
		{"blank file", "\n \n", agentproto.HostsHeader + "127.0.1.1 sbx1\n"},
		{"appended", "127.0.0.1 localhost\n", "127.0.1.1 sbx1\n"},
		{"no final newline", "127.0.0.1 localhost", "\n127.0.1.1 sbx1\n"},
		{"already there", "127.0.0.1 localhost\n127.0.1.1 other sbx1\n", ""},
		{"in a comment only", "127.0.0.1 localhost\n# 127.0.1.1 sbx1\n", "127.0.1.1 sbx1\n"},
		{"a longer name", "127.0.1.1 sbx12\n", "127.0.1.1 sbx1\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := addHostsLine([]byte(tc.hosts), "sbx1"); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestWriteHostname(t *testing.T) {
	t.Run("no etc", func(t *testing.T) {
		root := t.TempDir()
		if err := writeHostname(root, "sbx1"); err != nil {
			t.Fatal(err)
		}
		if got := contentOf(t, filepath.Join(root, "etc/hostname")); got != "sbx1\n" {
			t.Errorf("hostname %q", got)
		}
		if got := contentOf(t, filepath.Join(root, "etc/hosts")); got != agentproto.HostsHeader+agentproto.HostsLine("sbx1") {
			t.Errorf("hosts %q", got)
		}
		// Twice (a clone's init after a template's) adds nothing.
		if err := writeHostname(root, "sbx1"); err != nil {
			t.Fatal(err)
		}
		if got := contentOf(t, filepath.Join(root, "etc/hosts")); strings.Count(got, "sbx1") != 1 {
			t.Errorf("hosts after a second write %q", got)
		}
	})
	t.Run("etc is a file", func(t *testing.T) {
		root := t.TempDir()
		writeTree(t, root, map[string]string{"etc": "not a directory"})
		if err := writeHostname(root, "sbx1"); err == nil {
			t.Fatal("no error with /etc a file")
		}
	})
}

func TestTrustCA(t *testing.T) {
	const pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
	const other = "-----BEGIN CERTIFICATE-----\nOTHER\n-----END CERTIFICATE-----"
	tests := []struct {
		name    string
		tree    map[string]string
		bundle  string // where the CA must land
		want    string // the bundle's content after
		ownFile bool   // CACertFile is written
		absent  []string
	}{
		{"no trust store", nil, "etc/ssl/certs/ca-certificates.crt", pem, false, []string{"usr/local/share"}},
		{"debian", map[string]string{
			"etc/ssl/certs/ca-certificates.crt":            other,
			"usr/local/share/ca-certificates/.placeholder": "",
		}, "etc/ssl/certs/ca-certificates.crt", other + "\n" + pem, true, nil},
		{"fedora", map[string]string{
			"etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem": other + "\n",
			"etc/pki/tls/certs/ca-bundle.crt":                  "-> ../../ca-trust/extracted/pem/tls-ca-bundle.pem",
			"etc/ssl/certs":                                    "-> ../pki/tls/certs",
		}, "etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", other + "\n" + pem, false, []string{"etc/pki/tls/certs/ca-certificates.crt"}},
		{"alpine", map[string]string{
			"etc/ssl/certs/ca-certificates.crt": other + "\n",
			"etc/ssl/cert.pem":                  "-> certs/ca-certificates.crt",
		}, "etc/ssl/certs/ca-certificates.crt", other + "\n" + pem, false, nil},
		{"dangling first bundle", map[string]string{
			"etc/ssl/certs/ca-certificates.crt": "-> /nowhere",
			"etc/ssl/ca-bundle.pem":             other + "\n",
		}, "etc/ssl/ca-bundle.pem", other + "\n" + pem, false, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeTree(t, root, tc.tree)
			for range 2 { // the second time adds nothing
				if err := trustCA(root, []byte(strings.TrimSuffix(pem, "\n"))); err != nil {
					t.Fatal(err)
				}
			}
			if got := contentOf(t, filepath.Join(root, tc.bundle)); got != tc.want {
				t.Errorf("%s holds %q, want %q", tc.bundle, got, tc.want)
			}
			_, err := os.Stat(filepath.Join(root, agentproto.CACertFile))
			if tc.ownFile != (err == nil) {
				t.Errorf("own CA file exists %v, want %v", err == nil, tc.ownFile)
			}
			for _, p := range tc.absent {
				if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
					t.Errorf("%s was made", p)
				}
			}
		})
	}
}

func TestWriteResolvConf(t *testing.T) {
	gw := netip.MustParseAddr("10.0.2.2")
	for name, tree := range map[string]map[string]string{
		"no etc":  nil,
		"symlink": {"etc/resolv.conf": "-> ../run/systemd/resolve/stub-resolv.conf"},
		"file":    {"etc/resolv.conf": "nameserver 192.0.2.1\n"},
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			writeTree(t, root, tree)
			if err := writeResolvConf(root, gw); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(root, "etc/resolv.conf")
			if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() {
				t.Fatalf("resolv.conf: %v, %v", fi, err)
			}
			if got := contentOf(t, p); got != agentproto.ResolvConf("10.0.2.2") {
				t.Errorf("resolv.conf %q", got)
			}
		})
	}
}
