package agentproto

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// File metadata is user-defined key and value pairs kept with a file as
// its extended attributes MetadataXattrPrefix+key (E2B's file metadata):
// a write may set them (Request.Metadata), and a stat or a list reads them
// back (Stat.Metadata).
//
// A key is 1 to MaxMetadataKey bytes of HTTP token characters (letters,
// digits and !#$%&'*+-.^_`|~), a value printable US-ASCII (0x20 to 0x7e),
// possibly empty. A file holds at most MaxMetadataKeys pairs, and
// MetadataSize of them is at most MaxMetadataBytes: with 4 KiB blocks, the
// size the guest's ext4 is made with, ext4 keeps a file's extended
// attributes in one block, and pairs within these bounds always fit there.
const (
	MetadataXattrPrefix = "user.e2b."
	MaxMetadataKeys     = 64
	MaxMetadataKey      = 200
	MaxMetadataBytes    = 4000
	// metadataEntryCost is what each pair costs beyond its key and value
	// in MetadataSize: more than ext4's entry header, the "e2b." left of
	// the key in its stored name, and the padding of name and value.
	metadataEntryCost = 32
)

// MetadataSize is the size that MaxMetadataBytes bounds: the bytes of the
// keys and values, and 32 more for each pair.
func MetadataSize(md map[string]string) int {
	n := 0
	for k, v := range md {
		n += len(k) + len(v) + metadataEntryCost
	}
	return n
}

// CheckMetadataKey accepts a metadata key.
func CheckMetadataKey(k string) error {
	switch {
	case k == "":
		return fmt.Errorf("metadata key is empty")
	case len(k) > MaxMetadataKey:
		return fmt.Errorf("metadata key %.20q… is longer than %d bytes", k, MaxMetadataKey)
	}
	for i := 0; i < len(k); i++ {
		if !tokenChar(k[i]) {
			return fmt.Errorf("metadata key %q holds %q at byte %d: use letters, digits and !#$%%&'*+-.^_`|~", k, k[i], i)
		}
	}
	return nil
}

// CheckMetadataValue accepts the value of metadata key k.
func CheckMetadataValue(k, v string) error {
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return fmt.Errorf("metadata value of key %q holds byte 0x%02x at %d: values are printable US-ASCII", k, v[i], i)
		}
	}
	return nil
}

// CheckMetadata accepts the metadata a write sets. Keys are checked in
// order, so the error names the first bad one.
func CheckMetadata(md map[string]string) error {
	if len(md) > MaxMetadataKeys {
		return fmt.Errorf("%d metadata keys: a file holds at most %d", len(md), MaxMetadataKeys)
	}
	for _, k := range slices.Sorted(maps.Keys(md)) {
		if err := CheckMetadataKey(k); err != nil {
			return err
		}
		if err := CheckMetadataValue(k, md[k]); err != nil {
			return err
		}
	}
	if n := MetadataSize(md); n > MaxMetadataBytes {
		return fmt.Errorf("metadata of %d bytes (keys and values, and %d for each key): a file holds at most %d", n, metadataEntryCost, MaxMetadataBytes)
	}
	return nil
}

// BoundMetadata returns the pairs of md that CheckMetadata would accept,
// taken in key order while they stay within its bounds; nil when none
// is. It is how metadata read from a file, which anything in the guest
// may have set, is bounded on both sides of the agent.
func BoundMetadata(md map[string]string) map[string]string {
	var out map[string]string
	size := 0
	for _, k := range slices.Sorted(maps.Keys(md)) {
		v := md[k]
		if CheckMetadataKey(k) != nil || CheckMetadataValue(k, v) != nil {
			continue
		}
		if len(out) == MaxMetadataKeys || size+len(k)+len(v)+metadataEntryCost > MaxMetadataBytes {
			break
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = v
		size += len(k) + len(v) + metadataEntryCost
	}
	return out
}

// tokenChar reports whether c may be in an HTTP token (RFC 9110 tchar).
func tokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
