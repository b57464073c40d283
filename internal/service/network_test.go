package service

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/store"
)

func TestParseNetwork(t *testing.T) {
	ctx := context.Background()
	s := secretService(t)
	s.cfg.DefaultEgress = "deny"
	alice := Principal{KeyID: "keyalice", Role: apiv1.RoleUser}
	if _, _, err := s.PutSecret(ctx, alice, apiv1.PutSecret{Name: "openai", Value: "sk-alice"}); err != nil {
		t.Fatal(err)
	}
	cred := `"credentials":[{"host":"api.openai.com","header":"Authorization","secret":"openai","format":"Bearer {}"}]`
	tests := []struct {
		name, raw  string
		stored     string // the policy as stored; "" when it is refused
		wantInErr  string
		defaultOut string // the server's default egress, when not deny
		private    string // the private range the operator opened, if any
		denied     bool   // refused with permission denied, not invalid
	}{
		{name: "absent", raw: ``, stored: `{"egress":"deny"}`},
		{name: "null", raw: `null`, stored: `{"egress":"deny"}`},
		{name: "absent with an open default", raw: ``, stored: `{"egress":"allow"}`, defaultOut: "allow"},
		{name: "rules", raw: `{"egress":"deny","allow":["Example.COM.","*.pypi.org:443","10.1.0.0/16"],"deny":["203.0.113.9"]}`,
			stored: `{"egress":"deny","allow":["example.com","*.pypi.org:443","10.1.0.0/16"],"deny":["203.0.113.9"]}`, private: "10.0.0.0/8"},
		{name: "a private range not opened", raw: `{"allow":["example.com","10.1.0.0/16"]}`, wantInErr: `network.allow[1] "10.1.0.0/16"`, denied: true},
		{name: "a private range wider than opened", raw: `{"allow":["10.0.0.0/8"]}`, wantInErr: `network.allow[0] "10.0.0.0/8"`, private: "10.1.0.0/16", denied: true},
		{name: "loopback", raw: `{"allow":["127.0.0.1:8080"]}`, wantInErr: "loopback", private: "10.0.0.0/8", denied: true},
		{name: "metadata", raw: `{"egress":"allow","allow":["169.254.169.254"]}`, wantInErr: "link-local", denied: true},
		{name: "the gateway", raw: `{"allow":["10.0.2.2:80"]}`, wantInErr: "gateway", private: "10.0.0.0/8", denied: true},
		{name: "deny entries name anything", raw: `{"egress":"allow","deny":["127.0.0.1","169.254.169.254","10.0.0.0/8"]}`,
			stored: `{"egress":"allow","deny":["127.0.0.1","169.254.169.254","10.0.0.0/8"]}`},
		{name: "a stored secret", raw: `{"egress":"deny","allow":["api.openai.com"],` + cred + `}`,
			stored: `{"egress":"deny","allow":["api.openai.com"],` + cred + `}`},
		{name: "a secret of nobody", raw: `{"credentials":[{"host":"a.example","header":"X-Key","secret":"nope"}]}`, wantInErr: `"nope"`},
		{name: "bad cidr", raw: `{"allow":["10.0.0.0/33"]}`, wantInErr: "10.0.0.0/33"},
		{name: "port zero", raw: `{"allow":["example.com:0"]}`, wantInErr: "example.com:0"},
		{name: "wildcard alone", raw: `{"allow":["*."]}`, wantInErr: `"*."`},
		{name: "credential on a wildcard", raw: `{"credentials":[{"host":"*.openai.com","header":"Authorization","secret":"openai"}]}`, wantInErr: "*.openai.com"},
		{name: "header with CR LF", raw: `{"credentials":[{"host":"api.openai.com","header":"X\r\nY","secret":"openai"}]}`, wantInErr: "header"},
		{name: "unknown field", raw: `{"egress":"deny","bogus":1}`, wantInErr: "bogus"},
		{name: "not an object", raw: `"deny"`, wantInErr: ""},
		{name: "egress of a wrong type", raw: `{"egress":5}`, wantInErr: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s.cfg.DefaultEgress, s.cfg.EgressPrivate = "deny", nil
			if tt.defaultOut != "" {
				s.cfg.DefaultEgress = tt.defaultOut
			}
			if tt.private != "" {
				s.cfg.EgressPrivate = []netip.Prefix{netip.MustParsePrefix(tt.private)}
			}
			_, stored, err := s.parseNetwork(ctx, alice.KeyID, json.RawMessage(tt.raw))
			if tt.stored == "" {
				want := errdefs.ErrInvalid
				if tt.denied {
					want = errdefs.ErrPermission
				}
				if !errors.Is(err, want) || !strings.Contains(err.Error(), tt.wantInErr) {
					t.Fatalf("got %s, %v; want %v naming %q", stored, err, want, tt.wantInErr)
				}
				return
			}
			if err != nil || string(stored) != tt.stored {
				t.Fatalf("stored %s, %v; want %s", stored, err, tt.stored)
			}
		})
	}
	// Another key cannot name alice's secret.
	if _, _, err := s.parseNetwork(ctx, "keybob", json.RawMessage(`{`+cred+`}`)); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("bob naming alice's secret: %v", err)
	}
}

// TestMayChangeCredentials: only the sandbox's owner may add, change or
// remove a credential rule, which aims the owner's secret at a host; an
// admin key may still change the rest of the policy.
func TestMayChangeCredentials(t *testing.T) {
	ctx := context.Background()
	s := secretService(t)
	alice := Principal{KeyID: "keyalice", Role: apiv1.RoleUser}
	admin := Principal{KeyID: "keyadmin", Role: apiv1.RoleAdmin}
	if _, _, err := s.PutSecret(ctx, alice, apiv1.PutSecret{Name: "openai", Value: "sk-alice"}); err != nil {
		t.Fatal(err)
	}
	cred := `"credentials":[{"host":"api.openai.com","header":"Authorization","secret":"openai","format":"Bearer {}"}]`
	_, stored, err := s.parseNetwork(ctx, alice.KeyID, json.RawMessage(`{"egress":"deny","allow":["api.openai.com"],`+cred+`}`))
	if err != nil {
		t.Fatal(err)
	}
	sb := store.Sandbox{ID: ids.New("sbx"), Owner: alice.KeyID, Network: stored}
	for _, tc := range []struct {
		name string
		who  Principal
		raw  string
		ok   bool
	}{
		{"the owner changes the host", alice, `{"credentials":[{"host":"evil.example","header":"Authorization","secret":"openai"}]}`, true},
		{"the owner removes them", alice, `{"egress":"deny"}`, true},
		{"an admin aims the secret at its own host", admin, `{"credentials":[{"host":"admin.example","header":"Authorization","secret":"openai"}]}`, false},
		{"an admin adds a second rule", admin, `{"egress":"deny","allow":["api.openai.com"],"credentials":[` +
			`{"host":"api.openai.com","header":"Authorization","secret":"openai","format":"Bearer {}"},` +
			`{"host":"admin.example","header":"X-Key","secret":"openai"}]}`, false},
		{"an admin removes them", admin, `{"egress":"deny","allow":["api.openai.com"]}`, false},
		{"an admin changes the rest", admin, `{"egress":"allow","deny":["evil.example"],` + cred + `}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next, _, err := s.parseNetwork(ctx, sb.Owner, json.RawMessage(tc.raw))
			if err != nil {
				t.Fatal(err)
			}
			err = mayChangeCredentials(tc.who, sb, next)
			if tc.ok != (err == nil) || !tc.ok && !errors.Is(err, errdefs.ErrPermission) {
				t.Fatalf("mayChangeCredentials = %v, want ok %v (or permission denied)", err, tc.ok)
			}
		})
	}
	// Through SetNetwork, the refusal comes before anything is changed.
	sb.State = apiv1.StateRunning
	if err := s.st.InsertSandbox(ctx, sb, store.Operation{ID: ids.New("op"), Kind: apiv1.OpCreate, TargetID: sb.ID,
		Owner: alice.KeyID, Status: apiv1.OpSucceeded}); err != nil {
		t.Fatal(err)
	}
	_, err = s.SetNetwork(ctx, admin, sb.ID, json.RawMessage(`{"credentials":[{"host":"admin.example","header":"Authorization","secret":"openai"}]}`))
	if !errors.Is(err, errdefs.ErrPermission) || !strings.Contains(err.Error(), "credential rules") {
		t.Fatalf("SetNetwork by an admin aiming the owner's secret: %v", err)
	}
	got, err := s.st.GetSandbox(ctx, sb.ID)
	if err != nil || string(got.Network) != string(stored) {
		t.Fatalf("the stored policy after the refusal: %s, %v", got.Network, err)
	}
}
