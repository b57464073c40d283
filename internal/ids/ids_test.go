package ids

import (
	"regexp"
	"testing"
)

func TestShapes(t *testing.T) {
	id := regexp.MustCompile(`^sbx[a-z2-7]{20}$`)
	secret := regexp.MustCompile(`^[a-z2-7]{52}$`)
	seen := map[string]bool{}
	for range 1000 {
		n, s := New("sbx"), Secret()
		if !id.MatchString(n) || !secret.MatchString(s) {
			t.Fatalf("id %q or secret %q has the wrong shape", n, s)
		}
		if seen[n] || seen[s] {
			t.Fatalf("%q or %q came twice", n, s)
		}
		seen[n], seen[s] = true, true
	}
}
