package builds

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlockhq/airlock/internal/template"
)

// TestWriteImageConfigSymlinks: a flattened image's symlinks cannot send
// the configuration file, written as root, anywhere outside the image's
// tree; links that stay inside are followed as the guest would.
func TestWriteImageConfigSymlinks(t *testing.T) {
	st := template.Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 64, Config: &template.ImageConfig{WorkingDir: "/app"}}
	for _, tc := range []struct {
		name  string
		links map[string]string // path in the tree -> target; "HOST" is replaced by the host directory
		ok    bool
		at    string // where the file must be, in the tree, when ok
	}{
		{"plain", nil, true, "etc/airlock/image.json"},
		{"etc to a host directory", map[string]string{"etc": "HOST"}, false, ""},
		{"etc/airlock to a host directory", map[string]string{"etc/airlock": "HOST"}, false, ""},
		{"etc/airlock climbing out", map[string]string{"etc/airlock": "../../../../../../HOST"}, false, ""},
		{"the file to a host file", map[string]string{"etc/airlock/image.json": "HOST/image.json"}, true, "etc/airlock/image.json"},
		{"etc inside the tree", map[string]string{"etc": "usr/etc"}, true, "usr/etc/airlock/image.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := t.TempDir()
			victim := filepath.Join(host, "image.json")
			os.WriteFile(victim, []byte("the host's own"), 0o644)
			root := filepath.Join(t.TempDir(), "root")
			os.MkdirAll(filepath.Join(root, "usr/etc"), 0o755)
			for p, target := range tc.links {
				if target == "HOST" {
					target = host
				} else if filepath.Base(target) == "HOST" {
					target = filepath.Join(filepath.Dir(target), host)
				} else if filepath.Dir(target) == "HOST" {
					target = filepath.Join(host, filepath.Base(target))
				}
				os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
				if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
					t.Fatal(err)
				}
			}
			err := WriteImageConfig(root, st)
			if (err == nil) != tc.ok {
				t.Fatalf("WriteImageConfig: %v, want ok %v", err, tc.ok)
			}
			if b, _ := os.ReadFile(victim); string(b) != "the host's own" {
				t.Errorf("the host's file now holds %q", b)
			}
			entries, _ := os.ReadDir(host)
			if len(entries) != 1 {
				t.Errorf("the host directory holds %d entries", len(entries))
			}
			if tc.ok {
				fi, err := os.Lstat(filepath.Join(root, tc.at))
				if err != nil || !fi.Mode().IsRegular() {
					t.Errorf("the configuration is not a file at %s: %v", tc.at, err)
				}
			}
		})
	}
}
