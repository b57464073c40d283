package builds

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/diskspace"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway/policy"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/imagebuild"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/template/oci"
)

// builder is a build's sandbox: a VM booted from the image the build has
// reached, in which RUN and COPY steps happen, and whose disk is saved as
// the next image after each.
type builder struct {
	b      *Service
	box    VM
	digest string // the image its disk equals
}

// buildSandboxPrefix begins the IDs of build sandboxes.
const buildSandboxPrefix = "sbxbuild"

// newBuilder boots a build sandbox from tpl with the build's egress. It is
// not a sandbox of the API: no row, no lease; its VM dies with this
// process, and its directory at the next start (removeBuildSandboxes) if
// this process is killed.
func (b *Service) newBuilder(ctx context.Context, tpl template.Template, st template.Settings, pol policy.Policy) (*builder, error) {
	box, err := b.sandboxes.BootBuildVM(ctx, sandbox.Spec{
		ID: ids.New(buildSandboxPrefix), Template: tpl.Digest, ColdBoot: true, NoStart: true,
		VCPUs: st.VCPUs, MemoryMiB: st.MemoryMiB, DiskMiB: max(st.DiskMiB, defaultBuildDiskMiB), Network: &pol,
	})
	if err != nil {
		return nil, err
	}
	return &builder{b: b, box: box, digest: tpl.Digest}, nil
}

// close destroys the build sandbox; a nil builder is fine.
func (v *builder) close() {
	if v == nil || v.box == nil {
		return
	}
	if err := v.box.Destroy(context.Background()); err != nil {
		v.b.log.Warn("destroy a build sandbox", "sandbox", v.box.SandboxID(), "err", err)
	}
	v.box = nil
}

// ensureDir makes the working directory of a step if the image lacks it,
// as Docker does.
func (v *builder) ensureDir(ctx context.Context, dir string) error {
	if dir == "" || dir == "/" {
		return nil
	}
	return v.box.Agent().Mkdir(ctx, dir)
}

// run runs a RUN step with /bin/sh -c, its output going to the log. A
// non-zero exit is the build's error, with the step's last lines.
func (v *builder) run(ctx context.Context, n int, step imagebuild.Step, st imagebuild.State, rlog *Log) error {
	cmd := step.Run
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	stdout, flushOut := rlog.Writer(n, "stdout")
	stderr, flushErr := rlog.Writer(n, "stderr")
	p, err := v.box.Exec(ctx, agentproto.ExecRequest{Cmd: cmd, Env: st.RunEnv(step), Cwd: st.Resolve("."), User: st.User},
		agentclient.Stdio{Stdout: stdout, Stderr: stderr})
	if err != nil {
		return fmt.Errorf("step %d (RUN %s): %w", n, Short(cmd), err)
	}
	exit, err := v.box.Wait(p)
	flushOut()
	flushErr()
	if err != nil {
		return fmt.Errorf("step %d (RUN %s): %w", n, Short(cmd), err)
	}
	if exit.ExitCode != 0 {
		return fmt.Errorf("step %d (RUN %s) exited with code %d; its last lines:\n%s: %w",
			n, Short(cmd), exit.ExitCode, LastLinesText(rlog.LastLines(n)), errdefs.ErrInvalid)
	}
	return nil
}

// copyIn extracts what a COPY step selected from the context at its
// destination, owned by root or by the step's chown, as Docker does.
func (v *builder) copyIn(ctx context.Context, n int, st imagebuild.Step, sel *imagebuild.Selection, state imagebuild.State) error {
	what := fmt.Sprintf("step %d (%s)", n, st.String())
	dest := state.Resolve(st.Copy.Dest)
	if !strings.HasSuffix(dest, "/") {
		if fi, err := v.box.Agent().Stat(ctx, dest); err == nil && fi.Type == "dir" {
			dest += "/" // an existing directory receives the source inside it
		}
	}
	root, r, err := sel.Extract(dest)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	err = v.box.Agent().TarIn(ctx, root, r)
	r.Close() // it only reads the build context: a close loses nothing
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if st.Copy.Chown == "" {
		return nil
	}
	targets, err := sel.Targets(dest)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	var out bytes.Buffer
	p, err := v.box.Exec(ctx, agentproto.ExecRequest{Argv: append([]string{"chown", "-R", "-h", st.Copy.Chown}, targets...)},
		agentclient.Stdio{Stdout: &out, Stderr: &out})
	if err != nil {
		return fmt.Errorf("%s: chown: %w", what, err)
	}
	exit, err := v.box.Wait(p)
	if err == nil && exit.ExitCode != 0 {
		err = fmt.Errorf("chown exited with code %d: %s: %w", exit.ExitCode, strings.TrimSpace(out.String()), errdefs.ErrInvalid)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// removeWorkDir removes a work directory of a build or a save (see
// template.Store.TempDir). One left behind holds a disk's worth of space,
// so a failure is logged.
func (b *Service) removeWorkDir(dir string) {
	if err := os.RemoveAll(dir); err != nil {
		b.log.Warn("remove a work directory", "dir", dir, "err", err)
	}
}

// save writes the build sandbox's disk as a new image.
func (v *builder) save(ctx context.Context, run *Run, st template.Settings) (template.Template, error) {
	store := v.b.templates
	dir, err := store.TempDir("save")
	if err != nil {
		return template.Template{}, err
	}
	defer v.b.removeWorkDir(dir)
	img := filepath.Join(dir, "disk.ext4")
	if err := v.box.SaveDisk(ctx, img); err != nil {
		return template.Template{}, err
	}
	return v.b.builds.Store(run, func() (template.Template, error) { return store.PutImage(ctx, img, st) })
}

// buildBase returns the image a build starts from: a stored template, or
// an OCI image pulled or uploaded and flattened into a new one (cached by
// its manifest or archive digest).
func (b *Service) buildBase(ctx context.Context, run *Run, pl plan) (template.Template, error) {
	store := b.templates
	var img oci.Image
	var key string
	switch {
	case strings.HasPrefix(pl.from, "docker://"):
		opts := oci.PullOptions{Trusted: b.cfg.TrustedRegistries, HostCredentials: b.cfg.RegistryHostCredentials}
		if pl.auth != nil {
			opts.Username, opts.Password = pl.auth.Username, pl.auth.Password
		}
		run.Log.Infof(0, "pulling %s", strings.TrimPrefix(pl.from, "docker://"))
		var mdigest string
		var err error
		if img, mdigest, err = oci.Pull(ctx, strings.TrimPrefix(pl.from, "docker://"), opts); err != nil {
			return template.Template{}, err
		}
		key = CacheKey("image", mdigest)
		run.Log.Infof(0, "resolved to %s", mdigest)
	case strings.HasPrefix(pl.from, "oci-archive:"):
		id := strings.TrimPrefix(pl.from, "oci-archive:")
		p, dgst, err := b.contexts.Path(id)
		if err != nil {
			return template.Template{}, err
		}
		if img, err = oci.OpenArchive(p); err != nil {
			return template.Template{}, err
		}
		key = CacheKey("archive", dgst)
	default:
		t, err := store.Resolve(pl.base.Digest)
		if err != nil {
			return template.Template{}, err
		}
		run.Log.Infof(0, "base template %s is %s", pl.base.Ref(), t.Digest)
		return t, nil
	}
	if t, ok := b.cached(run, key); ok {
		run.Log.Infof(0, "image cached as %s", t.Digest)
		return t, nil
	}
	cfg, err := oci.ImageConfig(img)
	if err != nil {
		return template.Template{}, err
	}
	dir, err := store.TempDir("flatten")
	if err != nil {
		return template.Template{}, err
	}
	defer b.removeWorkDir(dir)
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		return template.Template{}, err
	}
	limit, room, err := b.sandboxes.FlattenLimit(root)
	if err != nil {
		return template.Template{}, err
	}
	run.Log.Infof(0, "unpacking the image's layers")
	if err := oci.Flatten(ctx, img, root, limit); err != nil {
		if errors.Is(err, errdefs.ErrTooLarge) && room {
			return template.Template{}, fmt.Errorf("the image unpacks to more than the %s the data directory can take while keeping --min-free-disk free (its tree and then its filesystem image): free some space and retry: %w",
				diskspace.Size(limit), errdefs.ErrExhausted)
		}
		return template.Template{}, err
	}
	conf := &template.ImageConfig{Env: cfg.Env, WorkingDir: cfg.WorkingDir, User: cfg.User}
	if err := conf.Validate(); err != nil {
		return template.Template{}, err
	}
	settings := template.Settings{VCPUs: 1, MemoryMiB: 512, DiskMiB: defaultBuildDiskMiB, Config: conf,
		StartCmd: Entrypoint(cfg.Entrypoint, cfg.Cmd)}
	if err := WriteImageConfig(root, settings); err != nil {
		return template.Template{}, err
	}
	run.Log.Infof(0, "making the root filesystem")
	tools, release, err := b.rt.BuildTools(dir)
	if err != nil {
		return template.Template{}, err
	}
	defer release()
	t, err := b.builds.Store(run, func() (template.Template, error) {
		return store.PutTreeWith(ctx, root, settings, tools.TreeRunner())
	})
	if err != nil {
		return template.Template{}, err
	}
	if err := store.Cache(key, t.Digest); err != nil {
		return template.Template{}, err
	}
	return t, nil
}

// finalImage makes the template's image: the last step's image with the
// template's configuration written into it (template.ImageConfigPath) and
// its working directory made, cached by both.
func (b *Service) finalImage(ctx context.Context, run *Run, cur template.Template, st template.Settings) (template.Template, error) {
	if st.Config != nil {
		if err := st.Config.Validate(); err != nil {
			return template.Template{}, err
		}
	}
	store := b.templates
	conf := ImageConfigJSON(st)
	key := CacheKey("final", cur.Digest, string(conf))
	if t, ok := b.cached(run, key); ok {
		run.Log.Infof(0, "configuration cached (%s)", t.Digest)
		return t, nil
	}
	dir, err := store.TempDir("final")
	if err != nil {
		return template.Template{}, err
	}
	defer b.removeWorkDir(dir)
	img := filepath.Join(dir, "disk.ext4")
	if err := CopySparse(ctx, cur.Image, img); err != nil {
		return template.Template{}, err
	}
	run.Log.Infof(0, "writing the template's configuration")
	tools, release, err := b.rt.BuildTools(dir)
	if err != nil {
		return template.Template{}, err
	}
	defer release()
	if err := tools.Own(img); err != nil {
		return template.Template{}, err
	}
	workdir := ""
	if st.Config != nil {
		workdir = st.Config.WorkingDir
	}
	if err := sandbox.WriteImageConfig(ctx, tools, img, conf, workdir); err != nil {
		return template.Template{}, err
	}
	if err := tools.GiveBack(img); err != nil {
		return template.Template{}, err
	}
	t, err := b.builds.Store(run, func() (template.Template, error) { return store.PutImage(ctx, img, st) })
	if err != nil {
		return template.Template{}, err
	}
	return t, store.Cache(key, t.Digest)
}
