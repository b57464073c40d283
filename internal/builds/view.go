package builds

import (
	"slices"
	"strings"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

// TemplateView is a template as the API shows it.
func TemplateView(t template.Template) apiv1.Template {
	v := apiv1.Template{Name: t.Name, Tag: t.Tag, Digest: t.Digest, VCPUs: t.VCPUs, MemoryMiB: t.MemoryMiB,
		DiskMiB: t.DiskMiB, SizeBytes: t.SizeBytes, CreatedAt: t.CreatedAt.UTC(), Status: apiv1.TemplateReady,
		StartCmd: t.StartCmd, ReadyCmd: t.ReadyCmd}
	if t.Source != nil {
		v.Source = &apiv1.TemplateSource{From: t.Source.From, Steps: t.Source.Steps}
	}
	if t.Config != nil {
		v.Env, v.WorkingDir, v.User = t.Config.Env, t.Config.WorkingDir, t.Config.User
	}
	return v
}

// BuildView is a template as its build in progress, or its failed build,
// shows it.
func BuildView(b store.Build, from string, steps int) apiv1.Template {
	v := apiv1.Template{Name: b.Name, Tag: b.Tag, Digest: b.Digest, CreatedAt: b.CreatedAt.UTC(), Status: b.Status, BuildID: b.ID}
	if from != "" {
		v.Source = &apiv1.TemplateSource{From: from, Steps: steps}
	}
	if b.Error != nil {
		v.Error = &apiv1.Status{Code: b.Error.Code, Message: b.Error.Message}
	}
	return v
}

// SortTemplates sorts templates by name:tag.
func SortTemplates(ts []apiv1.Template) {
	slices.SortFunc(ts, func(a, b apiv1.Template) int { return strings.Compare(a.Name+":"+a.Tag, b.Name+":"+b.Tag) })
}
