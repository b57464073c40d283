package agentproto

import (
	"fmt"
	"maps"
	"strings"
	"testing"
)

func TestCheckMetadata(t *testing.T) {
	many := map[string]string{}
	for i := range MaxMetadataKeys + 1 {
		many[fmt.Sprintf("k%02d", i)] = ""
	}
	// One pair at exactly the size bound, and one a byte over it.
	full := strings.Repeat("v", MaxMetadataBytes-len("k")-metadataEntryCost)
	tests := []struct {
		name string
		md   map[string]string
		bad  string // in the error; "" accepts
	}{
		{"none", nil, ""},
		{"usual", map[string]string{"author": "mish", "Purpose": "up load", "x.y_z-1": ""}, ""},
		{"every token character", map[string]string{"!#$%&'*+-.^_`|~aZ09": "v"}, ""},
		{"at the size bound", map[string]string{"k": full}, ""},
		{"empty key", map[string]string{"": "v"}, "empty"},
		{"space in key", map[string]string{"a b": "v"}, `"a b"`},
		{"colon in key", map[string]string{"a:b": "v"}, `"a:b"`},
		{"slash in key", map[string]string{"../x": "v"}, `"../x"`},
		{"non-ASCII key", map[string]string{"ключ": "v"}, "ключ"},
		{"NUL in key", map[string]string{"a\x00": "v"}, `"a\x00"`},
		{"long key", map[string]string{strings.Repeat("k", MaxMetadataKey+1): "v"}, "longer than"},
		{"newline in value", map[string]string{"k": "a\nb"}, `"k"`},
		{"DEL in value", map[string]string{"k": "\x7f"}, "0x7f"},
		{"non-ASCII value", map[string]string{"k": "é"}, `"k"`},
		{"too many keys", many, "65 metadata keys"},
		{"over the size bound", map[string]string{"k": full + "v"}, "at most 4000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckMetadata(tt.md)
			switch {
			case tt.bad == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.bad != "" && err == nil:
				t.Fatal("accepted")
			case tt.bad != "" && !strings.Contains(err.Error(), tt.bad):
				t.Fatalf("error %q does not name %q", err, tt.bad)
			}
		})
	}
}

// What a file holds, which anything in the guest may have set, is cut to
// what a write could have set.
func TestBoundMetadata(t *testing.T) {
	md := map[string]string{"a": "1", "bad key": "x", "b": "bad\tvalue", "c": "3"}
	if got, want := BoundMetadata(md), map[string]string{"a": "1", "c": "3"}; !maps.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got := BoundMetadata(map[string]string{"bad key": "x"}); got != nil {
		t.Fatalf("nothing valid: got %v, want nil", got)
	}
	many := map[string]string{}
	for i := range 3 * MaxMetadataKeys {
		many[fmt.Sprintf("k%03d", i)] = "v"
	}
	got := BoundMetadata(many)
	if len(got) != MaxMetadataKeys || got["k000"] != "v" || CheckMetadata(got) != nil {
		t.Fatalf("too many: kept %d, first %q, check %v", len(got), got["k000"], CheckMetadata(got))
	}
	big := map[string]string{}
	for i := range 10 {
		big[fmt.Sprintf("k%d", i)] = strings.Repeat("v", 1000)
	}
	if got := BoundMetadata(big); len(got) != 3 || CheckMetadata(got) != nil {
		t.Fatalf("too large: kept %d pairs, check %v", len(got), CheckMetadata(got))
	}
}
