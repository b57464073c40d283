package agent

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/agentproto"
)

func TestRenameHostsLine(t *testing.T) {
	tests := []struct {
		name, hosts, want string
	}{
		{"made by init", agentproto.HostsHeader + "127.0.1.1 tpl\n", agentproto.HostsHeader + "127.0.1.1 sbx1\n"},
		{"among others", "127.0.0.1 localhost\n127.0.1.1 tpl\n10.0.0.1 db\n", "127.0.0.1 localhost\n127.0.1.1 sbx1\n10.0.0.1 db\n"},
		{"no final newline", "127.0.0.1 localhost\n127.0.1.1 tpl", "127.0.0.1 localhost\n127.0.1.1 sbx1"},
		{"the old line is gone", "127.0.0.1 localhost\n", "127.0.0.1 localhost\n127.0.1.1 sbx1\n"},
		{"no file", "", agentproto.HostsHeader + "127.0.1.1 sbx1\n"},
		// Only the agent's own line: one the image has for the name,
		// with others on it, is the image's.
		{"the name on another line", "127.0.1.1 tpl tpl.local\n", "127.0.1.1 tpl tpl.local\n127.0.1.1 sbx1\n"},
		{"a longer name", "127.0.1.1 tpl2\n", "127.0.1.1 tpl2\n127.0.1.1 sbx1\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(renameHostsLine([]byte(tc.hosts), "tpl", "sbx1")); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRenameHost(t *testing.T) {
	root := t.TempDir()
	if err := writeHostname(root, "tpl"); err != nil {
		t.Fatal(err)
	}
	if err := renameHost(root, "tpl", "sbx1"); err != nil {
		t.Fatal(err)
	}
	if got := contentOf(t, filepath.Join(root, "etc/hostname")); got != "sbx1\n" {
		t.Errorf("hostname %q", got)
	}
	if got := contentOf(t, filepath.Join(root, "etc/hosts")); got != agentproto.HostsHeader+agentproto.HostsLine("sbx1") {
		t.Errorf("hosts %q", got)
	}
	// A reinit again (the same name) changes nothing.
	if err := renameHost(root, "sbx1", "sbx1"); err != nil {
		t.Fatal(err)
	}
	if got := contentOf(t, filepath.Join(root, "etc/hosts")); got != agentproto.HostsHeader+agentproto.HostsLine("sbx1") {
		t.Errorf("hosts after the same name again %q", got)
	}
}

func TestReplacePEM(t *testing.T) {
	const old = "-----BEGIN CERTIFICATE-----\nOLD\n-----END CERTIFICATE-----\n"
	const pem = "-----BEGIN CERTIFICATE-----\nNEW\n-----END CERTIFICATE-----\n"
	const other = "-----BEGIN CERTIFICATE-----\nOTHER\n-----END CERTIFICATE-----\n"
	tests := []struct {
		name, bundle, want string
		found              bool
	}{
		{"alone", old, pem, true},
		{"after others", other + old, other + pem, true},
		{"between others", other + old + other, other + pem + other, true},
		{"at the end without a newline", other + strings.TrimSuffix(old, "\n"), other + pem, true},
		{"absent", other, other, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, found := replacePEM([]byte(tc.bundle), []byte(old), []byte(pem))
			if string(got) != tc.want || found != tc.found {
				t.Errorf("got %q, %v; want %q, %v", got, found, tc.want, tc.found)
			}
		})
	}
}

func TestReplaceCA(t *testing.T) {
	const old = "-----BEGIN CERTIFICATE-----\nOLD\n-----END CERTIFICATE-----"
	const pem = "-----BEGIN CERTIFICATE-----\nNEW\n-----END CERTIFICATE-----"
	const other = "-----BEGIN CERTIFICATE-----\nOTHER\n-----END CERTIFICATE-----\n"
	tests := []struct {
		name    string
		tree    map[string]string
		bundle  string // where the CA must be
		ownFile bool   // CACertFile holds it
	}{
		{"no trust store", nil, "etc/ssl/certs/ca-certificates.crt", false},
		{"debian", map[string]string{
			"etc/ssl/certs/ca-certificates.crt":            other,
			"usr/local/share/ca-certificates/.placeholder": "",
		}, "etc/ssl/certs/ca-certificates.crt", true},
		{"alpine, a link to the bundle", map[string]string{
			"etc/ssl/certs/ca-certificates.crt": other,
			"etc/ssl/cert.pem":                  "-> certs/ca-certificates.crt",
		}, "etc/ssl/certs/ca-certificates.crt", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeTree(t, root, tc.tree)
			if err := trustCA(root, []byte(old)); err != nil { // the template VM's init
				t.Fatal(err)
			}
			before := contentOf(t, filepath.Join(root, tc.bundle))
			for range 2 { // the second time changes nothing
				if err := replaceCA(root, []byte(old), []byte(pem)); err != nil {
					t.Fatal(err)
				}
			}
			got := contentOf(t, filepath.Join(root, tc.bundle))
			if want := strings.Replace(before, old+"\n", pem+"\n", 1); got != want {
				t.Errorf("%s holds %q, want %q", tc.bundle, got, want)
			}
			if strings.Contains(got, "OLD") || strings.Count(got, "NEW") != 1 {
				t.Errorf("%s holds %q: the old CA, or the new one not once", tc.bundle, got)
			}
			if tc.ownFile {
				if got := contentOf(t, filepath.Join(root, agentproto.CACertFile)); got != pem+"\n" {
					t.Errorf("own CA file holds %q", got)
				}
			}
		})
	}
	t.Run("the old CA is nowhere", func(t *testing.T) {
		root := t.TempDir()
		writeTree(t, root, map[string]string{"etc/ssl/certs/ca-certificates.crt": other})
		if err := replaceCA(root, []byte(old), []byte(pem)); err != nil {
			t.Fatal(err)
		}
		if got := contentOf(t, filepath.Join(root, "etc/ssl/certs/ca-certificates.crt")); got != other+pem+"\n" {
			t.Errorf("bundle holds %q, want the new CA added", got)
		}
	})
}
