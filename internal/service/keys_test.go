package service

import (
	"context"
	"crypto/sha256"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/fields"
)

var e2bKeyShape = regexp.MustCompile(`^e2b_[0-9a-f]{40}$`)

func TestE2BKeys(t *testing.T) {
	ctx := context.Background()
	s := secretService(t)
	admin := Principal{KeyID: "keyadmin", Role: apiv1.RoleAdmin}

	k, err := s.CreateKey(ctx, admin, apiv1.CreateKey{Name: "sdk", Format: apiv1.KeyFormatE2B})
	if err != nil || !e2bKeyShape.MatchString(k.Key) || k.Format != apiv1.KeyFormatE2B || k.Role != apiv1.RoleUser ||
		!fields.ValidID(k.ID) || !strings.HasPrefix(k.ID, "key") || k.Name != "sdk" || k.CreatedAt.IsZero() {
		t.Fatalf("CreateKey e2b = %+v, %v", k, err)
	}
	if strings.Contains(k.Key, strings.TrimPrefix(k.ID, "key")) {
		t.Errorf("the key %q holds its ID %s", k.Key, k.ID)
	}
	// Only the sha256 of the key is stored.
	row, err := s.st.GetKey(ctx, k.ID)
	if h := sha256.Sum256([]byte(k.Key)); err != nil || string(row.Hash) != string(h[:]) || row.Format != apiv1.KeyFormatE2B {
		t.Fatalf("stored %+v, %v; want the key's sha256 and format e2b", row, err)
	}
	p, err := s.Authenticate(ctx, k.Key)
	if err != nil || p != (Principal{KeyID: k.ID, Role: apiv1.RoleUser}) {
		t.Fatalf("Authenticate(e2b key) = %+v, %v", p, err)
	}
	ka, err := s.CreateKey(ctx, admin, apiv1.CreateKey{Name: "sdk-admin", Role: apiv1.RoleAdmin, Format: apiv1.KeyFormatE2B})
	if err != nil {
		t.Fatal(err)
	}
	if pa, err := s.Authenticate(ctx, ka.Key); err != nil || !pa.Admin() || pa.KeyID != ka.ID {
		t.Fatalf("Authenticate(e2b admin key) = %+v, %v", pa, err)
	}
	if k2, _ := s.CreateKey(ctx, admin, apiv1.CreateKey{Name: "sdk", Format: apiv1.KeyFormatE2B}); k2.Key == k.Key || k2.ID == k.ID {
		t.Errorf("two e2b keys are the same: %+v %+v", k, k2)
	}

	// The same tenancy as a native key: what it makes is the key ID's.
	if _, err := s.CreateKey(ctx, p, apiv1.CreateKey{Name: "x"}); !errors.Is(err, errdefs.ErrPermission) {
		t.Errorf("a user e2b key created a key: %v", err)
	}
	if _, _, err := s.PutSecret(ctx, p, apiv1.PutSecret{Name: "openai", Value: "sk-e2b"}); err != nil {
		t.Fatal(err)
	}
	if v, err := s.SecretValue(ctx, k.ID, "openai"); err != nil || v != "sk-e2b" {
		t.Errorf("the e2b key's secret: %q, %v", v, err)
	}
	if l, err := s.ListSecrets(ctx, admin, 0, ""); err != nil || len(l.Items) != 0 {
		t.Errorf("another key sees the e2b key's secrets: %+v, %v", l.Items, err)
	}
	list, err := s.ListKeys(ctx, p, 0, "")
	if err != nil || len(list.Items) != 1 || list.Items[0].ID != k.ID || list.Items[0].Format != apiv1.KeyFormatE2B {
		t.Errorf("the e2b key lists %+v, %v; want only itself, format e2b", list.Items, err)
	}

	// Near misses are refused, with the answer a wrong native key gets.
	native, err := s.CreateKey(ctx, admin, apiv1.CreateKey{Name: "native"})
	if err != nil || native.Format != apiv1.KeyFormatAirlock || !strings.HasPrefix(native.Key, "alk_") {
		t.Fatalf("CreateKey without a format = %+v, %v", native, err)
	}
	hexPart := strings.TrimPrefix(k.Key, "e2b_")
	flip := func(s string, i int) string {
		b := []byte(s)
		if b[i] == '0' {
			b[i] = '1'
		} else {
			b[i] = '0'
		}
		return string(b)
	}
	for _, bad := range []string{
		"e2b_", "e2b_" + hexPart[:39], k.Key + "0", flip(k.Key, 4), flip(k.Key, len(k.Key)-1),
		"e2b_" + strings.ToUpper(hexPart), "E2B_" + hexPart, " " + k.Key, k.Key + "\n", hexPart,
		"e2b_" + strings.Repeat("0", 40), "e2b_" + strings.Repeat("g", 40),
		// The stored hash of one format does not open the other.
		"alk_" + strings.TrimPrefix(k.ID, "key") + "_" + k.Key,
		"e2b_" + strings.Split(native.Key, "_")[2],
	} {
		_, err := s.Authenticate(ctx, bad)
		if !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "the API key is not valid") {
			t.Errorf("Authenticate(%q) = %v, want unauthenticated", bad, err)
		}
	}

	// Revoked, it stops working.
	if err := s.DeleteKey(ctx, admin, k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, k.Key); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("a deleted e2b key still works: %v", err)
	}
	if pa, err := s.Authenticate(ctx, ka.Key); err != nil || !pa.Admin() {
		t.Errorf("deleting one e2b key broke another: %+v, %v", pa, err)
	}
}

func TestKeyFormats(t *testing.T) {
	ctx := context.Background()
	s := keyService(t)
	admin := Principal{KeyID: "keyadmin", Role: apiv1.RoleAdmin}
	for _, tc := range []struct {
		format, want, prefix string
	}{{"", "airlock", "alk_"}, {"airlock", "airlock", "alk_"}, {"e2b", "e2b", "e2b_"}} {
		k, err := s.CreateKey(ctx, admin, apiv1.CreateKey{Name: "k", Format: tc.format})
		if err != nil || k.Format != tc.want || !strings.HasPrefix(k.Key, tc.prefix) {
			t.Errorf("format %q: %+v, %v; want format %s, a key starting %s", tc.format, k, err, tc.want, tc.prefix)
		}
		if _, err := s.Authenticate(ctx, k.Key); err != nil {
			t.Errorf("format %q: the key does not authenticate: %v", tc.format, err)
		}
	}
	before, _ := s.st.CountKeys(ctx, "")
	for _, tc := range []struct {
		format, msg string
	}{
		{"E2B", `format "E2B" is not "airlock" or "e2b"`},
		{"alk", `format "alk" is not`},
		{"e2b ", `format "e2b " is not`},
		{"native", `format "native" is not`},
		{strings.Repeat("f", 100), `format "` + strings.Repeat("f", 20) + `…" is not`},
	} {
		_, err := s.CreateKey(ctx, admin, apiv1.CreateKey{Name: "k", Format: tc.format})
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("format %q: %v, want invalid saying %q", tc.format, err, tc.msg)
		}
	}
	// A user key is refused whatever the format.
	if _, err := s.CreateKey(ctx, Principal{KeyID: "keyu", Role: apiv1.RoleUser}, apiv1.CreateKey{Name: "k", Format: "e2b"}); !errors.Is(err, errdefs.ErrPermission) {
		t.Errorf("a user key made an e2b key: %v", err)
	}
	if after, _ := s.st.CountKeys(ctx, ""); after != before {
		t.Errorf("%d keys after refused creates, want %d", after, before)
	}
	// Keys list with their formats, in the order they were made.
	list, _ := s.ListKeys(ctx, admin, 0, "")
	var formats []string
	for _, k := range list.Items {
		formats = append(formats, k.Format)
	}
	if strings.Join(formats, " ") != "airlock airlock e2b" {
		t.Errorf("listed formats %q", formats)
	}
}
