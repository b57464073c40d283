package builds

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/imagebuild"
	"github.com/airlockhq/airlock/internal/template"
)

// Short cuts a command for an error message.
func Short(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}

// Entrypoint is the shell command an image's Entrypoint and Cmd make.
func Entrypoint(ep, cmd []string) string {
	argv := append(append([]string(nil), ep...), cmd...)
	if len(argv) == 0 {
		return ""
	}
	return imagebuild.ShellJoin(argv)
}

// imageConfigFile is what template.ImageConfigPath holds: the defaults the
// guest agent gives every command, and the settings that make the image
// what it is (so that two templates differing only in them differ in
// content, and so in digest).
type imageConfigFile struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	StartCmd   string   `json:"start_cmd,omitempty"`
	ReadyCmd   string   `json:"ready_cmd,omitempty"`
	VCPUs      int      `json:"vcpus,omitempty"`
	MemoryMiB  int      `json:"memory_mib,omitempty"`
	DiskMiB    int      `json:"disk_mib,omitempty"`
}

// ImageConfigJSON is the content of template.ImageConfigPath for st.
func ImageConfigJSON(st template.Settings) []byte {
	f := imageConfigFile{StartCmd: st.StartCmd, ReadyCmd: st.ReadyCmd, VCPUs: st.VCPUs, MemoryMiB: st.MemoryMiB, DiskMiB: st.DiskMiB}
	if st.Config != nil {
		f.Env, f.WorkingDir, f.User = st.Config.Env, st.Config.WorkingDir, st.Config.User
	}
	b, _ := json.MarshalIndent(f, "", "  ")
	return append(b, '\n')
}

// WriteImageConfig writes template.ImageConfigPath into the tree at
// root, a flattened image, through an os.Root: a symlink of the image's
// on the way (etc, etc/airlock) is followed only while it stays inside
// the tree, so no link can send this write, made as root, anywhere else
// on the host; one that leaves fails the build. A symlink at the file
// itself is replaced, never followed.
func WriteImageConfig(root string, st template.Settings) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return fmt.Errorf("write the image configuration: %w", err)
	}
	defer r.Close()
	rel := strings.TrimPrefix(template.ImageConfigPath, "/")
	if err := r.MkdirAll(filepath.Dir(rel), 0o755); err != nil {
		return fmt.Errorf("write the image configuration: %w", err)
	}
	if err := r.Remove(rel); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("write the image configuration: %w", err)
	}
	if err := r.WriteFile(rel, ImageConfigJSON(st), 0o644); err != nil {
		return fmt.Errorf("write the image configuration: %w", err)
	}
	return nil
}

// CopySparse copies an image file, keeping it sparse.
func CopySparse(ctx context.Context, src, dst string) error {
	out, err := exec.CommandContext(ctx, "cp", "--sparse=always", "--reflink=auto", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy %s: %s: %w", filepath.Base(src), strings.TrimSpace(string(out)), err)
	}
	return os.Chmod(dst, 0o644)
}

// ImageConfig is the template configuration a build state ends in; the
// environment in name order.
func ImageConfig(st imagebuild.State) *template.ImageConfig {
	c := &template.ImageConfig{WorkingDir: st.Workdir, User: st.User}
	for _, k := range slices.Sorted(maps.Keys(st.Env)) {
		c.Env = append(c.Env, k+"="+st.Env[k])
	}
	return c
}

// StateOf is the state an image's configuration starts a build in.
func StateOf(c *template.ImageConfig) imagebuild.State {
	if c == nil {
		return imagebuild.State{}
	}
	st := imagebuild.State{Env: map[string]string{}, Workdir: c.WorkingDir, User: c.User}
	for _, kv := range c.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			st.Env[k] = v
		}
	}
	return st
}

// CacheKey names the result of applying what to the image parent: the
// same key means the same result, so a rebuild reuses it.
func CacheKey(parts ...any) string {
	b, _ := json.Marshal(parts)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// RedactAuth drops the registry password from what is recorded.
func RedactAuth(req apiv1.CreateTemplate) apiv1.CreateTemplate {
	if req.RegistryAuth != nil {
		req.RegistryAuth = &apiv1.RegistryAuth{Username: req.RegistryAuth.Username, Password: "(redacted)"}
	}
	return req
}

// StepFromAPI is a JSON build step as a recipe step.
func StepFromAPI(st apiv1.BuildStep) imagebuild.Step {
	out := imagebuild.Step{Run: st.Run, Env: st.Env, Workdir: st.Workdir, User: st.User}
	if st.Copy != nil {
		out.Copy = &imagebuild.Copy{Src: st.Copy.Src, Dest: st.Copy.Dest, Chown: st.Copy.Chown}
	}
	return out
}
