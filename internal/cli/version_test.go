package cli

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestReadBuildInfo(t *testing.T) {
	vcs := func(kv ...string) []debug.BuildSetting {
		var out []debug.BuildSetting
		for i := 0; i+1 < len(kv); i += 2 {
			out = append(out, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	const rev = "7d7bec3b4730c0639b157db1002446e9a60540de"
	tests := []struct {
		name    string
		bi      *debug.BuildInfo
		linked  string
		want    buildInfo
		wantOut []string
		wantVer string
	}{
		{
			name: "go build in a git checkout",
			bi: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261205072621-7d7bec3b4730"},
				Settings: vcs("-trimpath", "true", "vcs", "git", "vcs.revision", rev, "vcs.time", "2026-12-05T07:26:21Z", "vcs.modified", "false")},
			want: buildInfo{version: "v0.0.0-20261205072621-7d7bec3b4730", revision: rev, time: "2026-12-05T07:26:21Z", goVer: "go1.26.8"},
			wantOut: []string{"airlock v0.0.0-20261205072621-7d7bec3b4730\n", "revision " + rev + ", committed 2026-12-05T07:26:21Z\n",
				"built with go1.26.8 for " + runtime.GOOS + "/" + runtime.GOARCH + "\n"},
			wantVer: "v0.0.0-20261205072621-7d7bec3b4730",
		},
		{
			name: "a tagged release with changes",
			bi: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.0+dirty"},
				Settings: vcs("vcs.revision", rev, "vcs.modified", "true")},
			linked:  "0000000000000000000000000000000000000000",
			want:    buildInfo{version: "v1.2.0+dirty", revision: rev, modified: true, goVer: "go1.26.8"},
			wantOut: []string{"airlock v1.2.0+dirty\n", "revision " + rev + ", with uncommitted changes\n"},
			wantVer: "v1.2.0+dirty",
		},
		{
			name:    "make build without VCS stamping: the linker's revision",
			bi:      &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: vcs("-trimpath", "true")},
			linked:  rev + "-modified",
			want:    buildInfo{version: "(devel)", revision: rev, modified: true, goVer: "go1.26.8"},
			wantOut: []string{"airlock (devel)\n", "revision " + rev + ", with uncommitted changes\n"},
			wantVer: "7d7bec3b4730-modified",
		},
		{
			name:    "nothing known",
			bi:      &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			want:    buildInfo{version: "(devel)", goVer: "go1.26.8"},
			wantOut: []string{"airlock (devel)\n", "revision unknown ("},
			wantVer: "(devel)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := readBuildInfo(tt.bi, tt.linked)
			if got != tt.want {
				t.Fatalf("readBuildInfo = %+v, want %+v", got, tt.want)
			}
			out := got.String()
			for _, w := range tt.wantOut {
				if !strings.Contains(out, w) {
					t.Errorf("output %q lacks %q", out, w)
				}
			}
			if v := got.word(); v != tt.wantVer {
				t.Errorf("word = %q, want %q", v, tt.wantVer)
			}
		})
	}
}
