package agent

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/airlockhq/airlock/internal/agentproto"
)

func TestReadImageConfig(t *testing.T) {
	dir := t.TempDir()
	if c, warn := readImageConfig(filepath.Join(dir, "missing.json")); warn != "" || len(c.Env) > 0 {
		t.Errorf("a missing file = %+v, %q; want nothing, no warning", c, warn)
	}
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte("{not json"), 0o644)
	if c, warn := readImageConfig(bad); warn == "" || len(c.Env) > 0 {
		t.Errorf("a broken file = %+v, %q; want nothing and a warning", c, warn)
	}
	good := filepath.Join(dir, "image.json")
	os.WriteFile(good, []byte(`{"env": ["PATH=/opt/bin:/bin", "A=1"], "working_dir": "/srv", "user": "1000:1000", "start_cmd": "ignored"}`), 0o644)
	c, warn := readImageConfig(good)
	if warn != "" || !slices.Equal(c.Env, []string{"PATH=/opt/bin:/bin", "A=1"}) || c.WorkingDir != "/srv" || c.User != "1000:1000" {
		t.Errorf("readImageConfig = %+v, %q", c, warn)
	}
}

// The template's defaults apply under the sandbox's environment and a
// command's own fields.
func TestPrepareImageDefaults(t *testing.T) {
	wd := t.TempDir()
	a := New(Config{})
	a.image = agentproto.ImageConfig{Env: []string{"PATH=/opt/bin:/bin", "FROM_IMAGE=image", "SHARED=image"}, WorkingDir: wd}
	a.defaultEnv = map[string]string{"SHARED": "sandbox"}
	spec, err := a.prepare(&agentproto.ExecRequest{Argv: []string{"/bin/true"}, Env: map[string]string{"OWN": "command"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"PATH=/opt/bin:/bin", "FROM_IMAGE=image", "SHARED=sandbox", "OWN=command"} {
		if !slices.Contains(spec.env, want) {
			t.Errorf("env %v lacks %s", spec.env, want)
		}
	}
	if spec.dir != wd {
		t.Errorf("dir = %s, want the image's working directory %s", spec.dir, wd)
	}
	spec, err = a.prepare(&agentproto.ExecRequest{Argv: []string{"/bin/true"}, Cwd: "/", Env: map[string]string{"PATH": "/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	if spec.dir != "/" || !slices.Contains(spec.env, "PATH=/bin") {
		t.Errorf("a command's own cwd and PATH: dir %s env %v", spec.dir, spec.env)
	}
	// A working directory the sandbox lacks falls back to the home.
	a.image.WorkingDir = filepath.Join(wd, "gone")
	if spec, err = a.prepare(&agentproto.ExecRequest{Argv: []string{"/bin/true"}}); err != nil || spec.dir == a.image.WorkingDir {
		t.Errorf("a missing image working directory: %v, dir %s", err, spec.dir)
	}
}
