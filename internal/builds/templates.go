package builds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/fields"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

// withBuild shows a template by its last build when that build is newer
// than the template (building, or failed since), else the template itself.
func (b *Service) withBuild(ctx context.Context, t *template.Template, name, tag string) (apiv1.Template, bool) {
	bld, err := b.st.LatestBuild(ctx, name, tag)
	if err != nil {
		if t == nil {
			return apiv1.Template{}, false
		}
		return TemplateView(*t), true
	}
	if t != nil && (bld.Status == apiv1.TemplateReady || bld.CreatedAt.Before(t.CreatedAt.Add(-time.Second))) {
		v := TemplateView(*t)
		v.BuildID = bld.ID
		return v, true
	}
	v := BuildView(bld, "", 0)
	if t != nil { // the tag still names the last good build's result
		v.Digest = t.Digest
	}
	if bld.Status == apiv1.TemplateBuilding && bld.Node != "" && b.role.NodeDown != nil {
		if why := b.role.NodeDown(bld.Node); why != "" {
			v.Unavailable = &apiv1.Status{Code: apiv1.CodeUnavailable,
				Message: why + "; the build goes on if the node was only cut off, and fails when its agent starts again"}
		}
	}
	return v, true
}

// ListTemplates lists the templates sandboxes can start from and those
// being built, a page at a time.
func (b *Service) ListTemplates(ctx context.Context, limit int, pageToken string) (apiv1.List[apiv1.Template], error) {
	ts, err := b.templates.List()
	if err != nil {
		return apiv1.List[apiv1.Template]{}, err
	}
	seen := map[string]bool{}
	all := []apiv1.Template{}
	for i := range ts {
		t := ts[i]
		seen[t.Ref()] = true
		v, _ := b.withBuild(ctx, &t, t.Name, t.Tag)
		all = append(all, v)
	}
	if b.role.clustered() {
		tags, err := b.st.ListTemplateTags(ctx)
		if err != nil {
			return apiv1.List[apiv1.Template]{}, err
		}
		for _, tag := range tags {
			t, err := describedTag(tag)
			if seen[t.Ref()] {
				continue // a template store's tag shadows the catalogue's
			}
			if err != nil {
				b.log.Warn("a catalogue entry that describes no template", "template", tag.Name+":"+tag.Tag, "err", err)
				continue
			}
			seen[t.Ref()] = true
			v, _ := b.withBuild(ctx, &t, t.Name, t.Tag)
			all = append(all, v)
		}
	}
	recs, err := b.st.ListBuilds(ctx, apiv1.TemplateBuilding, apiv1.TemplateFailed)
	if err != nil {
		return apiv1.List[apiv1.Template]{}, err
	}
	for _, bld := range recs {
		ref := bld.Name + ":" + bld.Tag
		if seen[ref] {
			continue
		}
		if v, ok := b.withBuild(ctx, nil, bld.Name, bld.Tag); ok && v.Status != apiv1.TemplateReady {
			seen[ref] = true
			all = append(all, v)
		}
	}
	SortTemplates(all)
	items, next, err := fields.Page(all, func(t apiv1.Template) string { return t.Name + ":" + t.Tag }, limit, pageToken)
	return apiv1.List[apiv1.Template]{Items: items, NextPageToken: next}, err
}

// GetTemplate resolves a name[:tag] or digest; a template being built, or
// whose last build failed, shows that build.
func (b *Service) GetTemplate(ctx context.Context, ref string) (apiv1.Template, error) {
	name, tag, err := template.ParseRef(ref)
	if err != nil {
		return apiv1.Template{}, err
	}
	t, _, err := b.findTemplate(ctx, ref)
	if name == "" { // a digest
		if err != nil {
			return apiv1.Template{}, err
		}
		return TemplateView(t), nil
	}
	var tp *template.Template
	if err == nil {
		tp = &t
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return apiv1.Template{}, err
	}
	// Without the tag, only a build in progress or a failed one shows: a
	// tag whose last build succeeded and that is gone was deleted.
	if v, ok := b.withBuild(ctx, tp, name, tag); ok && (tp != nil || v.Status != apiv1.TemplateReady) {
		return v, nil
	}
	return apiv1.Template{}, err
}

// buildOf returns the build that made, or is making, the template ref
// names: the last build of name:tag, or the build whose result is the
// digest.
func (b *Service) buildOf(ctx context.Context, ref string) (store.Build, error) {
	name, tag, err := template.ParseRef(ref)
	if err != nil {
		return store.Build{}, err
	}
	if name != "" {
		bld, err := b.st.LatestBuild(ctx, name, tag)
		if errors.Is(err, errdefs.ErrNotFound) {
			return bld, fmt.Errorf("template %s:%s was not built here (a built-in or imported template has no build log): %w", name, tag, errdefs.ErrNotFound)
		}
		return bld, err
	}
	recs, err := b.st.ListBuilds(ctx, apiv1.TemplateReady)
	if err != nil {
		return store.Build{}, err
	}
	for i := len(recs) - 1; i >= 0; i-- {
		if recs[i].Digest == tag {
			return recs[i], nil
		}
	}
	return store.Build{}, fmt.Errorf("no build made %s: %w", tag, errdefs.ErrNotFound)
}

// DeleteTemplate removes the tag name:tag, then reclaims what nothing
// refers to any more. Sandboxes made from it keep working. A user key may
// remove only tags it built; an admin key any.
func (b *Service) DeleteTemplate(ctx context.Context, p Principal, ref string) error {
	name, tag, err := template.ParseRef(ref)
	if err != nil {
		return err
	}
	if name == "" {
		return fmt.Errorf("template %s: a digest cannot be deleted, only a name:tag; its content goes once nothing refers to it: %w", ref, errdefs.ErrInvalid)
	}
	if !strings.Contains(ref, ":") {
		return fmt.Errorf("template %s: name the tag to delete (%s:%s): %w", ref, name, tag, errdefs.ErrInvalid)
	}
	t, catalogued, err := b.findTemplate(ctx, ref)
	if err != nil {
		return err
	}
	if b.role.clustered() && !catalogued {
		return fmt.Errorf("template %s is provisioned in this server's data directory, not built in the cluster: remove it from every server's and node's data directory: %w", t.Ref(), errdefs.ErrConflict)
	}
	if !p.Admin {
		bld, err := b.st.LatestBuild(ctx, name, tag)
		if err != nil || bld.Owner != p.KeyID {
			return fmt.Errorf("template %s was not built with this key: only an admin key may delete it: %w", t.Ref(), errdefs.ErrPermission)
		}
	}
	if catalogued {
		// The builds run on the nodes, and each keeps what its own build
		// reads (Reclaim).
		return b.st.DeleteTemplateTag(ctx, name, tag)
	}
	err = b.builds.Each(func(run *Run) error {
		if run.Base == t.Ref() || run.Rec.Name == name && run.Rec.Tag == tag {
			return fmt.Errorf("template %s is in use by build %s: wait for it to end and retry: %w", t.Ref(), run.Rec.ID, errdefs.ErrConflict)
		}
		return nil
	}, func() error { return b.templates.Untag(name, tag) })
	if err != nil {
		return err
	}
	if _, err := b.Reclaim(ctx); err != nil {
		b.log.Warn("reclaim template storage", "err", err)
	}
	return nil
}

// Reclaim removes the images, build cache entries and template snapshots
// that nothing can use any more: an image stays while a tag names it or
// one built from it (its parents), while a sandbox that is not deleted was
// made from it, or while a build in progress uses it. A snapshot stays
// while its image does and it is current, or while such a sandbox exists.
// It returns the bytes freed. An image a build is storing right now stays
// (Set.Store).
func (b *Service) Reclaim(ctx context.Context) (int64, error) {
	b.reclaimMu.Lock()
	defer b.reclaimMu.Unlock()
	ts := b.templates
	if ts == nil || b.cfg.NoReclaim {
		return 0, nil
	}
	inUse, err := b.st.TemplatesInUse(ctx)
	if err != nil {
		return 0, err
	}
	keep, err := b.catalogueDigests(ctx)
	if err != nil {
		return 0, err
	}
	for d := range inUse {
		keep[d] = true
	}
	storingSince := b.builds.Kept(keep) // the earliest store in progress
	tagged, err := ts.Tagged()
	if err != nil {
		return 0, err
	}
	images, err := ts.Images()
	if err != nil {
		return 0, err
	}
	byDigest := map[string]template.Template{}
	for _, t := range images {
		byDigest[t.Digest] = t
	}
	for d := range tagged {
		keep[d] = true
	}
	for d := range maps.Clone(keep) { // what a kept image was built through stays too
		for _, p := range byDigest[d].Parents {
			keep[p] = true
		}
	}
	var freed int64
	var errs []error
	for _, t := range images {
		// An image stored since a store in progress began may be that
		// store's, not pinned yet (records keep whole seconds).
		young := !storingSince.IsZero() && !t.CreatedAt.Before(storingSince.Truncate(time.Second))
		if keep[t.Digest] || young {
			continue
		}
		if err := ts.RemoveImage(t.Digest); err != nil {
			errs = append(errs, err)
			continue
		}
		freed += t.SizeBytes
		b.log.Info("removed a template image nothing refers to", "digest", t.Digest, "bytes", t.SizeBytes)
		delete(byDigest, t.Digest)
	}
	if entries, err := ts.CacheEntries(); err == nil {
		for k, d := range entries {
			if _, ok := byDigest[d]; !ok {
				if err := ts.Uncache(k); err != nil {
					b.log.Warn("forget a cached build step of a removed image", "key", k, "err", err)
				}
			}
		}
	}
	n, err := b.rt.ReclaimSnapshots(func(d string, current bool) bool {
		if inUse[d] {
			return true
		}
		_, stored := byDigest[d]
		return stored && current
	})
	freed += n
	if err != nil {
		errs = append(errs, err)
	}
	b.m.reclaimed()
	return freed, errors.Join(errs...)
}

// PutBuildContext stores an uploaded build context (a tar), up to limit
// bytes. A node records that it holds it, so that the builds that read it
// are sent here.
func (b *Service) PutBuildContext(ctx context.Context, r io.Reader, limit int64) (apiv1.BuildContext, error) {
	if err := b.noReplicaBuilds(); err != nil {
		return apiv1.BuildContext{}, err
	}
	id, dgst, err := b.contexts.Put(ctx, b.sandboxes.GuardSpace(r, b.cfg.Dir.Root), limit)
	if err != nil {
		return apiv1.BuildContext{}, err
	}
	if b.role.Node != "" {
		if err := b.st.PutBuildContextNode(ctx, id, b.role.Node); err != nil {
			return apiv1.BuildContext{}, err
		}
	}
	var size int64
	if p, _, err := b.contexts.Path(id); err == nil {
		if fi, err := os.Stat(p); err == nil {
			size = fi.Size()
		}
	}
	return apiv1.BuildContext{ID: id, Digest: dgst, Size: size}, nil
}

// noReplicaBuilds refuses to build on a cluster's API replica: its router
// sends builds and build contexts to a node, and saves to the sandbox's
// node.
func (b *Service) noReplicaBuilds() error {
	if !b.role.Front {
		return nil
	}
	return fmt.Errorf("an API replica does not build templates: its router sends builds, their contexts and saves to a node, and none took this one: retry shortly: %w", errdefs.ErrUnavailable)
}

// recoverBuilds fails the builds an earlier server, or this node, left
// unfinished, and removes their sandboxes.
func (b *Service) recoverBuilds(ctx context.Context) error {
	recs, err := b.st.ListBuilds(ctx, apiv1.TemplateBuilding)
	if err != nil {
		return err
	}
	for _, bld := range recs {
		if bld.Node != b.role.Node {
			continue // another node's
		}
		now := b.now()
		st := store.Error{Code: apiv1.CodeUnavailable, Message: "the server stopped during the build: build again"}
		bld.Status, bld.Error, bld.FinishedAt = apiv1.TemplateFailed, &st, &now
		ops, err := b.st.ListOperations(ctx, apiv1.OpPending, apiv1.OpRunning)
		if err != nil {
			return err
		}
		op := store.Operation{ID: "", Kind: apiv1.OpBuild, TargetID: bld.ID, Owner: bld.Owner, Status: apiv1.OpFailed, Error: &st, FinishedAt: &now}
		for _, o := range ops {
			if o.TargetID == bld.ID {
				op.ID, op.CreatedAt = o.ID, o.CreatedAt
			}
		}
		if op.ID == "" {
			continue
		}
		if err := b.st.FinishBuild(ctx, bld, op); err != nil {
			return err
		}
		// A build whose log is gone has nowhere to say it; the operation
		// says it all the same.
		if f, err := os.OpenFile(b.buildLogPath(bld.ID), os.O_APPEND|os.O_WRONLY, 0); err == nil {
			_, werr := fmt.Fprintf(f, "{\"step\":0,\"stream\":\"info\",\"text\":%q}\n", "build failed: "+st.Message)
			if err := errors.Join(werr, f.Close()); err != nil {
				b.log.Warn("note a build's failure in its log", "build", bld.ID, "err", err)
			}
		}
	}
	b.removeBuildSandboxes(ctx)
	b.pruneContexts()
	if ts := b.templates; ts != nil {
		return ts.RemoveLeftovers()
	}
	return nil
}

// SaveSandbox makes a new template, name:tag, of a running, paused or
// suspended sandbox's disk as it is now. The sandbox stays as it was: a
// running one is frozen only while its disk is copied. Other lifecycle
// requests wait (delete) or are refused until the copy ends.
func (b *Service) SaveSandbox(ctx context.Context, p Principal, id string, req apiv1.SaveTemplate) (apiv1.TemplateOperation, error) {
	if err := b.noReplicaBuilds(); err != nil {
		return apiv1.TemplateOperation{}, err
	}
	tag := req.Tag
	if tag == "" {
		tag = template.DefaultTag
	}
	if req.Name == "" {
		return apiv1.TemplateOperation{}, fmt.Errorf("name is required: the template is made as name:tag: %w", errdefs.ErrInvalid)
	}
	if n, _, err := template.ParseRef(req.Name + ":" + tag); err != nil || n == "" {
		if err == nil {
			err = fmt.Errorf("template name %q is not a name: %w", req.Name, errdefs.ErrInvalid)
		}
		return apiv1.TemplateOperation{}, err
	}
	ending, release, err := b.sandboxes.HoldForSave(ctx, p, id)
	if err != nil {
		return apiv1.TemplateOperation{}, err
	}
	pl := plan{name: req.Name, tag: tag, from: "sandbox:" + id, saveFrom: id, ending: ending, release: release}
	body, _ := json.Marshal(req)
	out, err := b.startBuild(p, pl, body)
	if err != nil {
		release()
	}
	return out, err
}

// saveSandbox copies the sandbox's disk into a new image with its
// template's settings and the sandbox's size.
func (b *Service) saveSandbox(ctx context.Context, run *Run, pl plan) (template.Template, error) {
	id := pl.saveFrom
	sb, err := b.st.GetSandbox(ctx, id)
	if err != nil {
		return template.Template{}, err
	}
	saveDisk, err := b.sandboxes.DiskSaver(id, sb.State)
	if err != nil {
		return template.Template{}, err
	}
	ts := b.templates
	dir, err := ts.TempDir("save")
	if err != nil {
		return template.Template{}, err
	}
	defer b.removeWorkDir(dir)
	img := filepath.Join(dir, "disk.ext4")
	start := time.Now()
	run.Log.Infof(0, "copying the disk of %s (%s)", id, sb.State)
	err = saveDisk(ctx, img)
	if err != nil {
		return template.Template{}, fmt.Errorf("copy the disk of %s: %w", id, err)
	}
	run.Log.Infof(0, "disk copied in %.1f s", time.Since(start).Seconds())
	settings := template.Settings{VCPUs: sb.VCPUs, MemoryMiB: sb.MemoryMiB, DiskMiB: sb.DiskMiB}
	if t, err := ts.Resolve(sb.TemplateDigest); err == nil {
		settings.StartCmd, settings.ReadyCmd, settings.ReadyPort, settings.ReadyPath = t.StartCmd, t.ReadyCmd, t.ReadyPort, t.ReadyPath
		settings.Config = t.Config
	}
	settings.Source = &template.Source{From: pl.from, Resolved: sb.TemplateDigest}
	return b.builds.Store(run, func() (template.Template, error) { return ts.PutImage(ctx, img, settings) })
}

// removeBuildSandboxes removes the directories of the build sandboxes
// (newBuilder) an earlier server, or this node's agent, left when it was
// killed: their VMs died with it (the parent-death signal), but their
// disks stay, and Sweep spares a directory younger than a minute, which
// a build killed just before this start is. A directory that has a
// sandbox row is a sandbox of the API whose ID merely starts alike, and
// stays.
func (b *Service) removeBuildSandboxes(ctx context.Context) {
	entries, err := os.ReadDir(b.cfg.Dir.Sandboxes())
	if err != nil {
		return
	}
	for _, e := range entries {
		id := e.Name()
		if !strings.HasPrefix(id, buildSandboxPrefix) {
			continue
		}
		if _, err := b.st.GetSandbox(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if err := b.rt.Remove(ctx, id); err != nil {
			b.log.Warn("remove a build sandbox an earlier run left", "sandbox", id, "err", err)
			continue
		}
		b.log.Info("removed a build sandbox an earlier run left", "sandbox", id)
	}
}
