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

// ListTemplates lists the templates sandboxes can start from.
func (s *Service) ListTemplates(ctx context.Context) (apiv1.List[apiv1.Template], error) {
	ts, err := s.rt.Templates().List()
	if err != nil {
		return apiv1.List[apiv1.Template]{}, err
	}
	out := apiv1.List[apiv1.Template]{Items: []apiv1.Template{}}
	for _, t := range ts {
		out.Items = append(out.Items, templateView(t))
	}
	return out, nil
}

// GetTemplate resolves a name[:tag] or digest.
func (s *Service) GetTemplate(ctx context.Context, ref string) (apiv1.Template, error) {
	t, err := s.rt.Templates().Resolve(ref)
	if err != nil {
		return apiv1.Template{}, err
	}
	return templateView(t), nil
}
