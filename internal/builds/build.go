package builds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway/policy"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/imagebuild"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/template/oci"
)

// Build bounds.
const (
	// maxBuildSteps bounds the steps of one build.
	maxBuildSteps = 256
	// defaultBuildDiskMiB is the disk of a build's sandbox and of a
	// template made from an image when the request gives none.
	defaultBuildDiskMiB = 4096
	// stepTimeout bounds one RUN step.
	stepTimeout = time.Hour
)

// contextAge is how long an uploaded build context is kept for builds
// that name it.
const contextAge = 24 * time.Hour

// pruneContexts removes build contexts older than contextAge that no
// build in progress reads.
func (b *Service) pruneContexts() {
	if n, err := b.contexts.Prune(contextAge, b.builds.Contexts()); err != nil {
		b.log.Warn("prune build contexts", "err", err)
	} else if n > 0 {
		b.log.Info("removed old build contexts", "count", n)
	}
}

// plan is a build request checked and resolved as far as it can be
// without doing the work.
type plan struct {
	name, tag string
	from      string // as given
	steps     []imagebuild.Step
	context   string // build context ID, if any
	startCmd  string
	readyCmd  string
	vcpus     int
	memoryMiB int
	diskMiB   int
	auth      *apiv1.RegistryAuth
	network   policy.Policy
	// base is the template a build from one starts from, as checkBase
	// resolved it.
	base template.Template
	// warnings say what of a Dockerfile was ignored.
	warnings []string
	// saveFrom is the sandbox whose disk a save copies, empty for
	// builds; ending marks the save as ending just before its operation
	// is recorded finished (lifecycle calls then wait for release, not
	// refuse), and release lets other lifecycle work on it go on.
	saveFrom string
	ending   func()
	release  func()
}

// CreateTemplate checks a build request, records the build and its
// operation, and runs it in the background.
func (b *Service) CreateTemplate(ctx context.Context, p Principal, req apiv1.CreateTemplate) (apiv1.TemplateOperation, error) {
	if err := b.noReplicaBuilds(); err != nil {
		return apiv1.TemplateOperation{}, err
	}
	pl, err := b.planBuild(ctx, req)
	if err != nil {
		return apiv1.TemplateOperation{}, err
	}
	if err := b.sandboxes.AdmitBuild(ctx, p.KeyID); err != nil {
		return apiv1.TemplateOperation{}, err
	}
	body, _ := json.Marshal(RedactAuth(req))
	return b.startBuild(p, pl, body)
}

func (b *Service) planBuild(ctx context.Context, req apiv1.CreateTemplate) (plan, error) {
	pl := plan{name: req.Name, tag: req.Tag, context: req.Context, startCmd: req.StartCmd, readyCmd: req.ReadyCmd,
		vcpus: req.VCPUs, memoryMiB: req.MemoryMiB, diskMiB: req.DiskMiB, auth: req.RegistryAuth}
	if pl.tag == "" {
		pl.tag = template.DefaultTag
	}
	if req.Name == "" {
		return pl, fmt.Errorf("name is required: the template is made as name:tag: %w", errdefs.ErrInvalid)
	}
	if n, _, err := template.ParseRef(pl.name + ":" + pl.tag); err != nil || n == "" {
		if err == nil {
			err = fmt.Errorf("template name %q is not a name: %w", pl.name, errdefs.ErrInvalid)
		}
		return pl, err
	}
	switch {
	case req.Dockerfile != "" && (req.From != "" || len(req.Steps) > 0):
		return pl, fmt.Errorf("give either a dockerfile or from and steps, not both: %w", errdefs.ErrInvalid)
	case req.Dockerfile != "":
		rec, err := imagebuild.ParseDockerfile(req.Dockerfile, req.BuildArgs)
		if err != nil {
			return pl, err
		}
		pl.from, pl.steps, pl.warnings = rec.From, rec.Steps, rec.Warnings
		if pl.startCmd == "" {
			pl.startCmd = rec.StartCmd
		}
	case req.From == "":
		return pl, fmt.Errorf("from is required (a template such as \"base\", docker://IMAGE or oci-archive:CONTEXT), or a dockerfile: %w", errdefs.ErrInvalid)
	default:
		if len(req.BuildArgs) > 0 {
			return pl, fmt.Errorf("build_args apply to a dockerfile's ARGs: %w", errdefs.ErrInvalid)
		}
		pl.from = req.From
		for _, st := range req.Steps {
			pl.steps = append(pl.steps, StepFromAPI(st))
		}
	}
	if len(pl.steps) > maxBuildSteps {
		return pl, fmt.Errorf("%d steps is more than the %d a build may have: %w", len(pl.steps), maxBuildSteps, errdefs.ErrInvalid)
	}
	for i, st := range pl.steps {
		if err := st.Validate(); err != nil {
			return pl, fmt.Errorf("step %d: %w", i+1, err)
		}
		if st.Copy != nil && pl.context == "" {
			return pl, fmt.Errorf("step %d copies %q from the build context, but none is given: upload one with PUT /v1/build-contexts and name it in \"context\": %w", i+1, st.Copy.Src, errdefs.ErrInvalid)
		}
	}
	if pl.context != "" {
		if _, _, err := b.contexts.Path(pl.context); err != nil {
			return pl, err
		}
	}
	for _, c := range []string{pl.startCmd, pl.readyCmd} {
		if strings.ContainsRune(c, 0) {
			return pl, fmt.Errorf("start_cmd and ready_cmd must not contain NUL bytes: %w", errdefs.ErrInvalid)
		}
	}
	if pl.readyCmd != "" && pl.startCmd == "" {
		return pl, fmt.Errorf("ready_cmd checks that the start_cmd is up: give a start_cmd too: %w", errdefs.ErrInvalid)
	}
	if err := b.checkBase(ctx, &pl); err != nil {
		return pl, err
	}
	if req.RegistryAuth != nil && !strings.HasPrefix(pl.from, "docker://") {
		return pl, fmt.Errorf("registry_auth is for a docker:// base, and this build starts from %q: %w", pl.from, errdefs.ErrInvalid)
	}
	l := sandbox.HostLimits()
	if pl.vcpus < 0 || pl.vcpus > l.MaxVCPUs {
		return pl, fmt.Errorf("vcpus %d is out of bounds: use 1 to %d: %w", pl.vcpus, l.MaxVCPUs, errdefs.ErrInvalid)
	}
	if pl.memoryMiB != 0 && (pl.memoryMiB < l.MinMemoryMiB || pl.memoryMiB > l.MaxMemoryMiB) {
		return pl, fmt.Errorf("memory %d MiB is out of bounds: use %d to %d: %w", pl.memoryMiB, l.MinMemoryMiB, l.MaxMemoryMiB, errdefs.ErrInvalid)
	}
	if pl.diskMiB < 0 || pl.diskMiB > l.MaxDiskMiB {
		return pl, fmt.Errorf("disk %d MiB is out of bounds: use up to %d: %w", pl.diskMiB, l.MaxDiskMiB, errdefs.ErrInvalid)
	}
	pol := policy.Policy{Egress: b.cfg.DefaultEgress}
	if len(req.Network) > 0 && string(req.Network) != "null" {
		var err error
		if pol, err = policy.Parse(req.Network); err != nil {
			return pl, err
		}
		if len(pol.Secrets()) > 0 {
			return pl, fmt.Errorf("a build's network may not inject credentials: give RUN steps what they need through the build context: %w", errdefs.ErrInvalid)
		}
	}
	pl.network = pol.Normalized()
	if err := b.sandboxes.EgressBounds().Check(pl.network, "network"); err != nil {
		return pl, err
	}
	return pl, nil
}

// checkBase checks the build's base before anything is recorded: a
// template that exists, a trusted registry, an uploaded archive.
func (b *Service) checkBase(ctx context.Context, pl *plan) error {
	switch {
	case strings.HasPrefix(pl.from, "docker://"):
		ref := strings.TrimPrefix(pl.from, "docker://")
		return oci.CheckRef(ref, b.cfg.TrustedRegistries)
	case strings.HasPrefix(pl.from, "oci-archive:"):
		_, _, err := b.contexts.Path(strings.TrimPrefix(pl.from, "oci-archive:"))
		return err
	default:
		t, err := b.resolveTemplate(ctx, pl.from)
		pl.base = t
		return err
	}
}

// mayWrite checks that p may point name:tag at a new build: an admin key
// any tag, a user key a new one or one it built itself, so that a tenant
// cannot replace a template others start from (a built-in above all).
func (b *Service) mayWrite(ctx context.Context, p Principal, name, tag string) error {
	if b.role.clustered() {
		if t, err := b.templates.Resolve(name + ":" + tag); err == nil {
			return fmt.Errorf("template %s is provisioned in the data directories, which a build in a cluster does not change: pick another name or tag: %w", t.Ref(), errdefs.ErrConflict)
		}
	}
	if p.Admin {
		return nil
	}
	bld, err := b.st.LatestBuild(ctx, name, tag)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		if _, rerr := b.templates.Resolve(name + ":" + tag); rerr != nil {
			return nil // a new name:tag
		}
	case err != nil:
		return err
	case bld.Owner == p.KeyID:
		return nil
	}
	return fmt.Errorf("template %s:%s was not built with this key: only an admin key may replace it; pick another name or tag: %w", name, tag, errdefs.ErrPermission)
}

// startBuild records the build and its operation and starts it.
func (b *Service) startBuild(p Principal, pl plan, body []byte) (apiv1.TemplateOperation, error) {
	if err := b.mayWrite(b.ctx, p, pl.name, pl.tag); err != nil {
		return apiv1.TemplateOperation{}, err
	}
	if err := b.sandboxes.CheckFreeDisk(b.cfg.Dir.Templates()); err != nil {
		return apiv1.TemplateOperation{}, err
	}
	now := b.now()
	rec := store.Build{ID: ids.New("bld"), Owner: p.KeyID, Name: pl.name, Tag: pl.tag, Status: apiv1.TemplateBuilding,
		Request: body, CreatedAt: now, Node: b.role.Node}
	op := store.Operation{ID: ids.New("op"), Kind: apiv1.OpBuild, TargetID: rec.ID, Owner: p.KeyID, Status: apiv1.OpPending, CreatedAt: now}
	bctx, cancel := context.WithCancel(b.ctx)
	run := &Run{Rec: rec, Op: op, Cancel: cancel, Done: make(chan struct{})}
	if pl.base.Digest != "" {
		run.Base = pl.base.Ref()
		b.builds.Pin(run, pl.base.Digest)
	}
	if pl.context != "" {
		run.Contexts = append(run.Contexts, pl.context)
	}
	if id, ok := strings.CutPrefix(pl.from, "oci-archive:"); ok {
		run.Contexts = append(run.Contexts, id)
	}
	var err error
	if run.Log, err = NewLog(b.buildLogPath(rec.ID)); err != nil {
		cancel()
		return apiv1.TemplateOperation{}, fmt.Errorf("start the build log: %w", err)
	}

	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		cancel()
		_ = run.Log.Close() // refused before it began: nothing was written
		return apiv1.TemplateOperation{}, fmt.Errorf("the server is shutting down: retry shortly: %w", errdefs.ErrUnavailable)
	}
	b.work.Add(1)
	b.mu.Unlock()
	if err := b.builds.Add(run); err != nil {
		b.work.Done()
		cancel()
		_ = run.Log.Close() // refused before it began: nothing was written
		return apiv1.TemplateOperation{}, err
	}

	if err := b.st.InsertBuild(b.ctx, rec, op); err != nil {
		b.builds.Remove(rec.ID)
		cancel()
		_ = run.Log.Close() // removed next: nothing in it to lose
		if err := os.Remove(b.buildLogPath(rec.ID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			b.log.Warn("remove the log of a build not recorded", "build", rec.ID, "err", err)
		}
		b.work.Done()
		return apiv1.TemplateOperation{}, fmt.Errorf("record build: %w", err)
	}
	b.sandboxes.OperationStarted(op)
	go b.runBuild(bctx, run, pl)
	return apiv1.TemplateOperation{Template: BuildView(rec, pl.from, len(pl.steps)), Operation: op.View()}, nil
}

// runBuild waits for the build slot, builds, tags the result and records
// how it ended.
func (b *Service) runBuild(ctx context.Context, run *Run, pl plan) {
	defer b.work.Done()
	defer run.Cancel()
	if pl.release != nil {
		defer pl.release()
	}
	start := time.Now()
	log := b.log.With("build", run.Rec.ID, "template", pl.name+":"+pl.tag)
	var tpl template.Template
	err := func() error {
		if pl.saveFrom == "" { // a save boots nothing and waits for no slot
			release, err := b.builds.Slot(ctx)
			if err != nil {
				return err
			}
			defer release()
		}
		run.Op.Status = apiv1.OpRunning
		if err := b.st.UpdateOperation(b.ctx, run.Op); err != nil {
			return err
		}
		var err error
		if pl.saveFrom != "" {
			tpl, err = b.saveSandbox(ctx, run, pl)
		} else {
			tpl, err = b.build(ctx, run, pl)
		}
		if err != nil {
			return err
		}
		tpl, err = b.tagBuilt(b.ctx, pl.name, pl.tag, tpl.Digest, run.Rec.Owner)
		return err
	}()
	if b.ctx.Err() != nil {
		// Shutting down: the next start fails the build with a reason.
		run.Log.Infof(0, "the server is shutting down; the build is cut short")
		if err := run.Log.Close(); err != nil {
			log.Warn("the build's log may have lost lines", "err", err)
		}
		b.builds.Remove(run.Rec.ID)
		close(run.Done)
		return
	}
	now := b.now()
	run.Rec.FinishedAt, run.Op.FinishedAt = &now, &now
	if err != nil {
		st := store.ErrorOf(err)
		if errors.Is(err, context.Canceled) {
			st = store.Error{Code: apiv1.CodeConflict, Message: "the build was cancelled"}
		}
		run.Rec.Status, run.Rec.Error = apiv1.TemplateFailed, &st
		run.Op.Status, run.Op.Error = apiv1.OpFailed, &st
		run.Log.Add(0, "info", "build failed: "+st.Message)
		log.Warn("template build failed", "err", err)
	} else {
		run.Rec.Status, run.Rec.Digest = apiv1.TemplateReady, tpl.Digest
		run.Op.Status = apiv1.OpSucceeded
		run.Log.Infof(0, "built %s:%s as %s in %.1f s", pl.name, pl.tag, tpl.Digest, time.Since(start).Seconds())
		log.Info("template built", "digest", tpl.Digest, "ms", time.Since(start).Milliseconds())
	}
	if err := run.Log.Close(); err != nil {
		log.Warn("the build's log may have lost lines", "err", err)
	}
	if pl.ending != nil {
		pl.ending()
	}
	if err := b.st.FinishBuild(b.ctx, run.Rec, run.Op); err != nil {
		log.Error("record the end of a build", "err", err)
	}
	b.builds.Remove(run.Rec.ID)
	close(run.Done)
	b.sandboxes.OperationFinished(run.Op, time.Since(start))
	if _, err := b.Reclaim(b.ctx); err != nil {
		log.Warn("reclaim template storage", "err", err)
	}
	b.pruneContexts()
}

// cached returns and pins the image a step with the given key made, if it
// is stored: under reclaimMu, so that Reclaim cannot remove it in between.
func (b *Service) cached(run *Run, key string) (template.Template, bool) {
	b.reclaimMu.RLock()
	defer b.reclaimMu.RUnlock()
	t, ok := b.templates.Cached(key)
	if ok {
		b.builds.Pin(run, t.Digest)
	}
	return t, ok
}

// build runs a build's steps from its base and returns the final image,
// stored but not yet tagged.
func (b *Service) build(ctx context.Context, run *Run, pl plan) (template.Template, error) {
	rlog := run.Log
	store := b.templates
	rlog.Infof(0, "build %s:%s from %s, %d steps", pl.name, pl.tag, pl.from, len(pl.steps))
	for _, w := range pl.warnings {
		rlog.Infof(0, "warning: %s", w)
	}
	cur, err := b.buildBase(ctx, run, pl)
	if err != nil {
		return template.Template{}, fmt.Errorf("base %s: %w", pl.from, err)
	}
	b.builds.Pin(run, cur.Digest)
	base := cur
	parents := []string{cur.Digest}
	state := StateOf(cur.Config)
	settings := template.Settings{VCPUs: cur.VCPUs, MemoryMiB: cur.MemoryMiB, DiskMiB: cur.DiskMiB}
	if pl.vcpus > 0 {
		settings.VCPUs = pl.vcpus
	}
	if pl.memoryMiB > 0 {
		settings.MemoryMiB = pl.memoryMiB
	}
	if pl.diskMiB > 0 {
		settings.DiskMiB = pl.diskMiB
	}
	if min := int((cur.SizeBytes + 1<<20 - 1) >> 20); settings.DiskMiB < min {
		settings.DiskMiB = min
	}

	var vm *builder
	defer func() { vm.close() }()
	for i, st := range pl.steps {
		n := i + 1
		rlog.Infof(n, "step %d/%d: %s", n, len(pl.steps), st.String())
		if st.Run == "" && st.Copy == nil { // env, workdir, user: only the state changes
			state = state.Apply(st)
			continue
		}
		var copyDigest string
		var sel *imagebuild.Selection
		if st.Copy != nil {
			sel, err = b.contexts.Select(pl.context, st.Copy.Src)
			if err != nil {
				return template.Template{}, fmt.Errorf("step %d (%s): %w", n, st.String(), err)
			}
			copyDigest = sel.Digest
		}
		key := strings.TrimPrefix(imagebuild.CacheKey(cur.Digest, st, state, copyDigest), "sha256:")
		if t, ok := b.cached(run, key); ok {
			rlog.Infof(n, "step %d: cached (%s)", n, t.Digest)
			cur = t
			parents = append(parents, cur.Digest)
			continue
		}
		if vm == nil || vm.digest != cur.Digest {
			vm.close()
			rlog.Infof(n, "starting a build sandbox from %s", cur.Digest)
			if vm, err = b.newBuilder(ctx, cur, settings, pl.network); err != nil {
				return template.Template{}, fmt.Errorf("step %d: start a build sandbox: %w", n, err)
			}
		}
		if err := vm.ensureDir(ctx, state.Resolve(".")); err != nil {
			return template.Template{}, fmt.Errorf("step %d: workdir %s: %w", n, state.Resolve("."), err)
		}
		if st.Run != "" {
			if err := vm.run(ctx, n, st, state, rlog); err != nil {
				return template.Template{}, err
			}
		} else if err := vm.copyIn(ctx, n, st, sel, state); err != nil {
			return template.Template{}, err
		}
		rlog.Infof(n, "saving the result of step %d", n)
		t, err := vm.save(ctx, run, template.Settings{VCPUs: settings.VCPUs, MemoryMiB: settings.MemoryMiB, DiskMiB: settings.DiskMiB,
			Config: ImageConfig(state), Parents: slices.Clone(parents)})
		if err != nil {
			return template.Template{}, fmt.Errorf("step %d: save the result: %w", n, err)
		}
		if err := store.Cache(key, t.Digest); err != nil {
			return template.Template{}, fmt.Errorf("step %d: %w", n, err)
		}
		cur = t
		vm.digest = t.Digest
		parents = append(parents, cur.Digest)
	}
	vm.close()
	vm = nil

	settings.StartCmd, settings.ReadyCmd = pl.startCmd, pl.readyCmd
	if pl.startCmd == "" {
		// The base's start command (an image's entrypoint, a template's
		// server) and how it is known to be up.
		settings.StartCmd, settings.ReadyCmd = base.StartCmd, base.ReadyCmd
		settings.ReadyPort, settings.ReadyPath = base.ReadyPort, base.ReadyPath
	}
	settings.Config = ImageConfig(state)
	settings.Source = &template.Source{From: pl.from, Resolved: parents[0], Steps: len(pl.steps)}
	settings.Parents = parents
	return b.finalImage(ctx, run, cur, settings)
}
