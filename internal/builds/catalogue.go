package builds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

// In cluster mode a template built or saved on a node is not tagged in any
// data directory: the node records its name:tag in the store's catalogue
// (store.TemplateTag) with the image's settings, and keeps the image while
// the catalogue names it. An API replica resolves a ref through its own
// template store (the built-in templates, or what an operator put there)
// and then through the catalogue; a node that needs the image fetches it
// by digest from a peer (Role.FetchTemplate).

// findTemplate resolves ref (name[:tag] or digest) through the runtime's
// template store and, in cluster mode, then through the catalogue. It
// says whether the catalogue gave it; a template the catalogue gives has
// no image here (its Image is ""). A ref neither knows is the template
// store's errdefs.ErrNotFound error.
func (b *Service) findTemplate(ctx context.Context, ref string) (template.Template, bool, error) {
	t, err := b.templates.Resolve(ref)
	if err == nil || !errors.Is(err, errdefs.ErrNotFound) || !b.role.clustered() {
		return t, false, err
	}
	tag, cerr := b.catalogueTag(ctx, ref)
	if errors.Is(cerr, errdefs.ErrNotFound) {
		return t, false, err
	}
	if cerr != nil {
		return t, false, cerr
	}
	ct, cerr := describedTag(tag)
	return ct, cerr == nil, cerr
}

// catalogueTag returns the catalogue's entry for a name:tag, or the
// newest entry that names a digest.
func (b *Service) catalogueTag(ctx context.Context, ref string) (store.TemplateTag, error) {
	name, tag, err := template.ParseRef(ref)
	if err != nil {
		return store.TemplateTag{}, err
	}
	if name != "" {
		return b.st.GetTemplateTag(ctx, name, tag)
	}
	return b.st.TemplateTagByDigest(ctx, tag)
}

// describedTag is the template a catalogue entry describes.
func describedTag(t store.TemplateTag) (template.Template, error) {
	e := template.Export{Digest: t.Digest, SizeBytes: t.SizeBytes}
	if err := json.Unmarshal(t.Settings, &e.Settings); err != nil {
		return template.Template{}, fmt.Errorf("template %s:%s: the catalogue's settings: %v: %w", t.Name, t.Tag, err, errdefs.ErrInvalid)
	}
	return template.Described(t.Name, t.Tag, e, t.CreatedAt)
}

// resolveTemplate is findTemplate for a template this service is to use:
// on a node, a template from the catalogue resolves to its image here,
// fetched first if the node lacks it.
func (b *Service) resolveTemplate(ctx context.Context, ref string) (template.Template, error) {
	t, catalogued, err := b.findTemplate(ctx, ref)
	if err != nil || !catalogued || b.role.Node == "" {
		return t, err
	}
	local, err := b.templates.Resolve(t.Digest)
	if errors.Is(err, errdefs.ErrNotFound) && b.role.FetchTemplate != nil {
		local, err = b.role.FetchTemplate(ctx, t.Digest)
	}
	if err != nil {
		return template.Template{}, fmt.Errorf("template %s (%s) is not on node %s and could not be fetched: %w", t.Ref(), t.Digest, b.role.Node, err)
	}
	local.Name, local.Tag = t.Name, t.Tag
	return local, nil
}

// ResolveCatalogued resolves a template ref the host's template store
// lacks, for a sandbox to be made of it: in a cluster through the
// catalogue (on a node, to its image here, fetched first if the node
// lacks it). ok is false on a single host, which has no catalogue: the
// template store's answer stands.
func (b *Service) ResolveCatalogued(ctx context.Context, ref string) (t template.Template, ok bool, err error) {
	if !b.role.clustered() {
		return template.Template{}, false, nil
	}
	t, err = b.resolveTemplate(ctx, ref)
	return t, true, err
}

// tagBuilt points name:tag at the image a build or save made: in the
// template store on a single host; on a node, in the catalogue.
func (b *Service) tagBuilt(ctx context.Context, name, tag, dgst, owner string) (template.Template, error) {
	if b.role.Node == "" {
		return b.templates.Tag(name, tag, dgst)
	}
	t, err := b.templates.Resolve(dgst)
	if err != nil {
		return t, err
	}
	settings, err := json.Marshal(t.Settings())
	if err != nil {
		return t, err
	}
	err = b.st.PutTemplateTag(ctx, store.TemplateTag{Name: name, Tag: tag, Digest: dgst, SizeBytes: t.SizeBytes,
		Settings: settings, Owner: owner})
	t.Name, t.Tag = name, tag
	return t, err
}

// catalogueDigests returns the digests the catalogue names, none on a
// single host: a node keeps those images (Reclaim).
func (b *Service) catalogueDigests(ctx context.Context) (map[string]bool, error) {
	out := map[string]bool{}
	if !b.role.clustered() {
		return out, nil
	}
	tags, err := b.st.ListTemplateTags(ctx)
	if err != nil {
		return nil, err
	}
	for _, t := range tags {
		out[t.Digest] = true
	}
	return out, nil
}

// BuildNode names the node that ran, or runs, the build of a template ref
// ("" on a single host): for cluster.Router, which sends a build's log
// requests there.
func (b *Service) BuildNode(ctx context.Context, ref string) (string, error) {
	bld, err := b.buildOf(ctx, ref)
	return bld.Node, err
}
