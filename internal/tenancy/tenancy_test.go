package tenancy

import (
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
)

func TestOwns(t *testing.T) {
	for _, tc := range []struct {
		name  string
		p     Principal
		owner string
		want  bool
	}{
		{"its own", Principal{KeyID: "keya", Role: apiv1.RoleUser}, "keya", true},
		{"another key's", Principal{KeyID: "keya", Role: apiv1.RoleUser}, "keyb", false},
		{"an admin, another key's", Principal{KeyID: "keyadmin", Role: apiv1.RoleAdmin}, "keyb", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.Owns(tc.owner); got != tc.want {
				t.Fatalf("Owns(%q) = %v, want %v", tc.owner, got, tc.want)
			}
		})
	}
}
