package service

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
)

// keyService is a service with only a store: enough for keys and tokens.
func keyService(t *testing.T) *Service {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &Service{role: localRole{}, st: st}
}

func TestKeys(t *testing.T) {
	ctx := context.Background()
	s := keyService(t)
	path := filepath.Join(t.TempDir(), "admin.key")
	key, err := s.EnsureAdminKey(ctx, path)
	if err != nil || !strings.HasPrefix(key, "alk_") {
		t.Fatalf("first admin key %q, %v", key, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin key file: %v %v", fi, err)
	}
	if b, _ := os.ReadFile(path); strings.TrimSpace(string(b)) != key {
		t.Fatalf("admin key file holds %q", b)
	}
	if again, err := s.EnsureAdminKey(ctx, path); err != nil || again != "" {
		t.Fatalf("a second start made another admin key: %q %v", again, err)
	}
	admin, err := s.Authenticate(ctx, key)
	if err != nil || !admin.Admin() {
		t.Fatalf("admin key: %+v %v", admin, err)
	}
	user, err := s.CreateKey(ctx, admin, apiv1.CreateKey{Name: "ci"})
	if err != nil || user.Role != "user" {
		t.Fatalf("create user key: %+v %v", user, err)
	}
	up, err := s.Authenticate(ctx, user.Key)
	if err != nil || up.Admin() || up.KeyID != user.ID {
		t.Fatalf("user key: %+v %v", up, err)
	}

	bad := []string{"", "alk_", "alk__", "nope", key + "x", strings.Replace(key, "alk_", "alk_x", 1),
		user.Key[:len(user.Key)-1] + "0", "alk_" + strings.Repeat("a", 20) + "_" + strings.Repeat("b", 40)}
	for _, k := range bad {
		if _, err := s.Authenticate(ctx, k); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("Authenticate(%q) = %v, want unauthenticated", k, err)
		}
	}
	if _, err := s.CreateKey(ctx, up, apiv1.CreateKey{Name: "x"}); !errors.Is(err, errdefs.ErrPermission) {
		t.Errorf("a user key created a key: %v", err)
	}
	for _, req := range []apiv1.CreateKey{{}, {Name: "a\nb"}, {Name: "x", Role: "root"}, {Name: strings.Repeat("n", 129)}} {
		if _, err := s.CreateKey(ctx, admin, req); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("CreateKey(%+v) = %v, want invalid", req, err)
		}
	}
	list, err := s.ListKeys(ctx, up, 0, "")
	if err != nil || len(list.Items) != 1 || list.Items[0].ID != user.ID {
		t.Errorf("a user lists %+v, want only itself", list.Items)
	}
	if err := s.DeleteKey(ctx, admin, admin.KeyID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("deleting the last admin key: %v", err)
	}
	if err := s.DeleteKey(ctx, admin, user.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, user.Key); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("a deleted key still works: %v", err)
	}
}

func TestKeyListPages(t *testing.T) {
	ctx := context.Background()
	s := keyService(t)
	admin := Principal{Role: apiv1.RoleAdmin}
	for i := 0; i < 7; i++ {
		if _, err := s.CreateKey(ctx, admin, apiv1.CreateKey{Name: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	token := ""
	for pages := 0; ; pages++ {
		l, err := s.ListKeys(ctx, admin, 3, token)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range l.Items {
			if seen[k.ID] {
				t.Fatalf("key %s on two pages", k.ID)
			}
			seen[k.ID] = true
		}
		if token = l.NextPageToken; token == "" {
			break
		}
		if pages > 5 {
			t.Fatal("paging does not end")
		}
	}
	if len(seen) != 7 {
		t.Errorf("pages held %d keys, want 7", len(seen))
	}
	if _, err := s.ListKeys(ctx, admin, 3, "garbage!"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a garbage page token: %v", err)
	}
}
