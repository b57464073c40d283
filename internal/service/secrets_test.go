package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/fields"
	"github.com/airlockhq/airlock/internal/secrets"
)

// secretService is a service with a store and a secrets box.
func secretService(t *testing.T) *Service {
	t.Helper()
	s := keyService(t)
	box, err := secrets.OpenBox(filepath.Join(t.TempDir(), "secrets.key"))
	if err != nil {
		t.Fatal(err)
	}
	s.cfg.Secrets = box
	return s
}

func TestSecrets(t *testing.T) {
	ctx := context.Background()
	s := secretService(t)
	alice := Principal{KeyID: "keyalice", Role: apiv1.RoleUser}
	bob := Principal{KeyID: "keybob", Role: apiv1.RoleUser}
	admin := Principal{KeyID: "keyadmin", Role: apiv1.RoleAdmin}

	sec, created, err := s.PutSecret(ctx, alice, apiv1.PutSecret{Name: "openai", Value: "sk-alice-1"})
	if err != nil || !created || sec.Name != "openai" || sec.CreatedAt.IsZero() || !sec.UpdatedAt.Equal(sec.CreatedAt) {
		t.Fatalf("first PutSecret = %+v, %v, %v", sec, created, err)
	}
	again, created, err := s.PutSecret(ctx, alice, apiv1.PutSecret{Name: "openai", Value: "sk-alice-2"})
	if err != nil || created || !again.CreatedAt.Equal(sec.CreatedAt) || again.UpdatedAt.Before(sec.UpdatedAt) {
		t.Fatalf("replacing PutSecret = %+v, %v, %v; want created_at %v kept", again, created, err, sec.CreatedAt)
	}
	if _, _, err := s.PutSecret(ctx, bob, apiv1.PutSecret{Name: "openai", Value: "sk-bob"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.PutSecret(ctx, alice, apiv1.PutSecret{Name: "gh.token-2_x", Value: "ghp"}); err != nil {
		t.Fatal(err)
	}

	// The value is sealed in the store, and opens only for its owner.
	row, err := s.st.GetSecret(ctx, alice.KeyID, "openai")
	if err != nil || bytes.Contains(row.Sealed, []byte("sk-alice")) {
		t.Fatalf("stored row %x, %v: want the value sealed", row.Sealed, err)
	}
	for _, tc := range []struct {
		owner, name, want string
	}{{alice.KeyID, "openai", "sk-alice-2"}, {bob.KeyID, "openai", "sk-bob"}, {alice.KeyID, "gh.token-2_x", "ghp"}} {
		if v, err := s.SecretValue(ctx, tc.owner, tc.name); err != nil || v != tc.want {
			t.Errorf("SecretValue(%s, %s) = %q, %v; want %q", tc.owner, tc.name, v, err, tc.want)
		}
	}
	_, err = s.SecretValue(ctx, bob.KeyID, "gh.token-2_x")
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "secret gh.token-2_x is not stored: create it with POST /v1/secrets") {
		t.Errorf("another tenant's secret: %v", err)
	}

	// Each key lists its own; an admin key is no exception.
	for _, tc := range []struct {
		p    Principal
		want []string
	}{{alice, []string{"gh.token-2_x", "openai"}}, {bob, []string{"openai"}}, {admin, nil}} {
		l, err := s.ListSecrets(ctx, tc.p, 0, "")
		if err != nil || l.NextPageToken != "" || l.Items == nil {
			t.Fatalf("ListSecrets(%s) = %+v, %v", tc.p.KeyID, l, err)
		}
		var names []string
		for _, it := range l.Items {
			names = append(names, it.Name)
		}
		if fmt.Sprint(names) != fmt.Sprint(tc.want) {
			t.Errorf("%s lists %q, want %q", tc.p.KeyID, names, tc.want)
		}
	}
	if _, err := s.SecretValue(ctx, admin.KeyID, "openai"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("an admin key reads another key's secret: %v", err)
	}

	if err := s.DeleteSecret(ctx, admin, "openai"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("an admin deleted another key's secret: %v", err)
	}
	if err := s.DeleteSecret(ctx, alice, "openai"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSecret(ctx, alice, "openai"); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "secret openai is not stored for this key") {
		t.Errorf("second delete: %v", err)
	}
	if v, err := s.SecretValue(ctx, bob.KeyID, "openai"); err != nil || v != "sk-bob" {
		t.Errorf("bob's secret after alice's delete: %q, %v", v, err)
	}
}

func TestSecretBadInput(t *testing.T) {
	ctx := context.Background()
	s := secretService(t)
	p := Principal{KeyID: "keyalice", Role: apiv1.RoleUser}
	if _, _, err := s.PutSecret(ctx, p, apiv1.PutSecret{Name: "keep", Value: "old"}); err != nil {
		t.Fatal(err)
	}
	const value = "hunter2-do-not-echo"
	tests := []struct {
		name string
		req  apiv1.PutSecret
		msg  string
	}{
		{"no name", apiv1.PutSecret{Value: value}, `secret name "" is not valid`},
		{"slash", apiv1.PutSecret{Name: "a/b", Value: value}, `secret name "a/b" is not valid`},
		{"dot dot", apiv1.PutSecret{Name: "..", Value: value}, `secret name ".." is not valid`},
		{"dot dot inside", apiv1.PutSecret{Name: "a..b", Value: value}, "is not valid"},
		{"dot", apiv1.PutSecret{Name: ".", Value: value}, "is not valid"},
		{"NUL", apiv1.PutSecret{Name: "a\x00b", Value: value}, `secret name "a\x00b" is not valid`},
		{"65 characters", apiv1.PutSecret{Name: strings.Repeat("n", 65), Value: value}, "use 1 to 64 letters"},
		{"space", apiv1.PutSecret{Name: "a b", Value: value}, "is not valid"},
		{"not ASCII", apiv1.PutSecret{Name: "clé", Value: value}, "is not valid"},
		{"no value", apiv1.PutSecret{Name: "keep"}, "secret keep: value is required"},
		{"value too long", apiv1.PutSecret{Name: "keep", Value: value + strings.Repeat("x", MaxSecretValue)}, "over the limit of 65536"},
		{"value not UTF-8", apiv1.PutSecret{Name: "keep", Value: value + "\xff"}, "value is not valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := s.PutSecret(ctx, p, tt.req)
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("PutSecret = %v, want invalid saying %q", err, tt.msg)
			}
			if strings.Contains(err.Error(), value) {
				t.Errorf("the error holds the value: %v", err)
			}
			if v, err := s.SecretValue(ctx, p.KeyID, "keep"); err != nil || v != "old" {
				t.Errorf("a refused put changed a secret: %q, %v", v, err)
			}
			if l, _ := s.ListSecrets(ctx, p, 0, ""); len(l.Items) != 1 {
				t.Errorf("a refused put stored something: %+v", l.Items)
			}
			if tt.req.Name != "keep" {
				if err := s.DeleteSecret(ctx, p, tt.req.Name); !errors.Is(err, errdefs.ErrInvalid) {
					t.Errorf("DeleteSecret(%q) = %v, want invalid", tt.req.Name, err)
				}
			}
		})
	}
	// The bounds themselves are fine.
	for _, req := range []apiv1.PutSecret{
		{Name: strings.Repeat("n", 64), Value: strings.Repeat("x", MaxSecretValue)},
		{Name: "a", Value: "\x00 any bytes that are UTF-8: é"},
	} {
		if _, _, err := s.PutSecret(ctx, p, req); err != nil {
			t.Errorf("PutSecret(%.20q) = %v", req.Name, err)
		}
	}
}

func TestCheckSecrets(t *testing.T) {
	ctx := context.Background()
	s := secretService(t)
	p := Principal{KeyID: "keyalice", Role: apiv1.RoleUser}
	for _, n := range []string{"openai", "github"} {
		if _, _, err := s.PutSecret(ctx, p, apiv1.PutSecret{Name: n, Value: "v"}); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		owner string
		names []string
		bad   string // the name the error must name; "" for none
	}{
		{p.KeyID, nil, ""},
		{p.KeyID, []string{"openai"}, ""},
		{p.KeyID, []string{"github", "openai"}, ""},
		{p.KeyID, []string{"openai", "missing", "other"}, "missing"},
		{"keybob", []string{"openai"}, "openai"},
	}
	for _, tt := range tests {
		err := s.CheckSecrets(ctx, tt.owner, tt.names)
		if tt.bad == "" {
			if err != nil {
				t.Errorf("CheckSecrets(%s, %q) = %v", tt.owner, tt.names, err)
			}
			continue
		}
		want := fmt.Sprintf("network.credentials: secret %q is not stored for this key: create it first with POST /v1/secrets or airlock secret set", tt.bad)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckSecrets(%s, %q) = %v, want invalid saying %q", tt.owner, tt.names, err, want)
		}
	}
}

func TestSecretPages(t *testing.T) {
	ctx := context.Background()
	s := secretService(t)
	p := Principal{KeyID: "keyalice", Role: apiv1.RoleUser}
	names := []string{"a", "b", "c", "d", "e", "f", "g"}
	for _, n := range names {
		if _, _, err := s.PutSecret(ctx, p, apiv1.PutSecret{Name: n, Value: "v"}); err != nil {
			t.Fatal(err)
		}
	}
	first, err := s.ListSecrets(ctx, p, 3, "")
	if err != nil || len(first.Items) != 3 || first.NextPageToken == "" {
		t.Fatalf("first page %+v, %v", first, err)
	}
	// The secret a token ends at is deleted: the next page still follows it.
	if err := s.DeleteSecret(ctx, p, "c"); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, it := range first.Items {
		got = append(got, it.Name)
	}
	token := first.NextPageToken
	for pages := 0; token != ""; pages++ {
		l, err := s.ListSecrets(ctx, p, 3, token)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range l.Items {
			got = append(got, it.Name)
		}
		token = l.NextPageToken
		if pages > 5 {
			t.Fatal("paging does not end")
		}
	}
	if want := "[a b c d e f g]"; fmt.Sprint(got) != want {
		t.Errorf("pages held %v, want %s", got, want)
	}
	for _, tok := range []string{"garbage!", "YWZ0ZXI6Li4"} { // the second is "after:.."
		if _, err := s.ListSecrets(ctx, p, 3, tok); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("page token %q: %v", tok, err)
		}
	}
	if _, err := s.ListSecrets(ctx, p, fields.MaxLimit+1, ""); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("limit over the maximum: %v", err)
	}
}

func TestSecretsWithoutBox(t *testing.T) {
	ctx := context.Background()
	s := keyService(t)
	p := Principal{KeyID: "keyalice", Role: apiv1.RoleUser}
	const want = "this server keeps no secrets"
	_, _, err := s.PutSecret(ctx, p, apiv1.PutSecret{Name: "a", Value: "v"})
	errs := map[string]error{"put": err}
	_, errs["list"] = s.ListSecrets(ctx, p, 0, "")
	errs["delete"] = s.DeleteSecret(ctx, p, "a")
	_, errs["value"] = s.SecretValue(ctx, p.KeyID, "a")
	errs["check"] = s.CheckSecrets(ctx, p.KeyID, []string{"a"})
	for what, err := range errs {
		if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s without a box: %v, want a precondition error saying %q", what, err, want)
		}
	}
	if err := s.CheckSecrets(ctx, p.KeyID, nil); err != nil {
		t.Errorf("a policy without credentials needs no box: %v", err)
	}
	// Bad input is still bad input.
	if _, _, err := s.PutSecret(ctx, p, apiv1.PutSecret{Name: "a/b", Value: "v"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a bad name without a box: %v", err)
	}
}
