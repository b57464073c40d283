package service

import (
	"context"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/template"
)

func templateView(t template.Template) apiv1.Template {
	return apiv1.Template{Name: t.Name, Tag: t.Tag, Digest: t.Digest, VCPUs: t.VCPUs, MemoryMiB: t.MemoryMiB,
		DiskMiB: t.DiskMiB, SizeBytes: t.SizeBytes, CreatedAt: t.CreatedAt.UTC(), Status: "ready"}
}

// ListTemplates lists the templates sandboxes can start from, a page at a
// time.
func (s *Service) ListTemplates(ctx context.Context, limit int, pageToken string) (apiv1.List[apiv1.Template], error) {
	ts, err := s.rt.Templates().List()
	if err != nil {
		return apiv1.List[apiv1.Template]{}, err
	}
	all := []apiv1.Template{}
	for _, t := range ts {
		all = append(all, templateView(t))
	}
	items, next, err := page(all, func(t apiv1.Template) string { return t.Name + ":" + t.Tag }, limit, pageToken)
	return apiv1.List[apiv1.Template]{Items: items, NextPageToken: next}, err
}

// GetTemplate resolves a name[:tag] or digest.
func (s *Service) GetTemplate(ctx context.Context, ref string) (apiv1.Template, error) {
	t, err := s.rt.Templates().Resolve(ref)
	if err != nil {
		return apiv1.Template{}, err
	}
	return templateView(t), nil
}
