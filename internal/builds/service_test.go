package builds

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

// noRuntime is a Runtime that Validate only checks is there.
type noRuntime struct{}

func (noRuntime) BuildTools(string) (sandbox.ImageTools, func(), error) {
	return sandbox.ImageTools{}, nil, errors.New("no image tools here")
}
func (noRuntime) Remove(context.Context, string) error { return nil }
func (noRuntime) ReclaimSnapshots(func(string, bool) bool) (int64, error) {
	return 0, nil
}

func TestConfigValidate(t *testing.T) {
	base := func() Config {
		return Config{Store: &store.Store{}, Templates: &template.Store{}, Runtime: noRuntime{}}
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		err  bool
	}{
		{"defaults", func(*Config) {}, false},
		{"no store", func(c *Config) { c.Store = nil }, true},
		{"no runtime", func(c *Config) { c.Runtime = nil }, true},
		{"node and replica", func(c *Config) { c.Role = Role{Node: "n1", Front: true} }, true},
		{"bad egress", func(c *Config) { c.DefaultEgress = "some" }, true},
		{"no build slots", func(c *Config) { c.MaxBuilds = -1 }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.edit(&c)
			err := c.Validate()
			if (err != nil) != tc.err {
				t.Fatalf("Validate() = %v, want an error: %v", err, tc.err)
			}
			if err != nil || tc.name != "defaults" {
				return
			}
			if c.MaxBuilds != 1 || c.MaxContextBytes != 1<<30 || c.DefaultEgress != "deny" ||
				c.ShutdownGrace != 10*time.Second || c.Role.ReclaimEvery != 5*time.Minute || c.Clock == nil || c.Log == nil {
				t.Errorf("defaults not filled in: %+v", c)
			}
		})
	}
	c := base()
	c.DefaultEgress = "some"
	if err := c.Validate(); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a bad egress: %v, want errdefs.ErrInvalid", err)
	}
}

func TestRoleClustered(t *testing.T) {
	for _, tc := range []struct {
		role Role
		want bool
	}{
		{Role{}, false},
		{Role{Node: "n1"}, true},
		{Role{Front: true}, true},
	} {
		if got := tc.role.clustered(); got != tc.want {
			t.Errorf("%+v.clustered() = %v, want %v", tc.role, got, tc.want)
		}
	}
}
