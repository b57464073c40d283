package template

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestAptMirror(t *testing.T) {
	const deb822 = `Types: deb
# a comment
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
`
	tests := []struct {
		name    string
		files   map[string]string
		want    string
		wantErr bool
	}{
		{
			name:  "deb822",
			files: map[string]string{"sources.list.d/debian.sources": deb822},
			want:  "http://mirror.example/debian",
		},
		{
			name: "deb822 disabled and deb-src skipped",
			files: map[string]string{"sources.list.d/a.sources": "Types: deb\nEnabled: no\nURIs: http://off.example/debian\nSuites: bookworm\n\n" +
				"Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n\n" +
				"Types: deb deb-src\nURIs: http://on.example/debian/\nSuites: bookworm\n"},
			want: "http://on.example/debian",
		},
		{
			name:  "one-line sources.list",
			files: map[string]string{"sources.list": "# deb http://old.example/debian bookworm main\ndeb http://security.example/debian-security bookworm-security main\ndeb [arch=amd64 signed-by=/k.gpg] http://one.example/debian bookworm main contrib\n"},
			want:  "http://one.example/debian",
		},
		{
			name:  "deb822 wins over sources.list",
			files: map[string]string{"sources.list.d/debian.sources": deb822, "sources.list": "deb http://one.example/debian bookworm main\n"},
			want:  "http://mirror.example/debian",
		},
		{
			name:    "only other suites",
			files:   map[string]string{"sources.list": "deb http://one.example/debian trixie main\n"},
			wantErr: true,
		},
		{name: "nothing", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range tt.files {
				p := filepath.Join(dir, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := AptMirror(dir, "bookworm")
			if tt.wantErr {
				if !errors.Is(err, errdefs.ErrPrecondition) {
					t.Fatalf("AptMirror = %q, %v, want ErrPrecondition", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("AptMirror = %q, %v, want %q", got, err, tt.want)
			}
		})
	}
}
