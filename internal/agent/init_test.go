package agent

import (
	"encoding/binary"
	"testing"
)

func TestRandPoolInfo(t *testing.T) {
	tests := []struct {
		name     string
		in       []byte
		wantBits int32
		wantLen  int
	}{
		{"whole words", []byte{1, 2, 3, 4, 5, 6, 7, 8}, 64, 8 + 8},
		{"padded", []byte{1, 2, 3, 4, 5}, 40, 8 + 8},
		{"64 bytes", make([]byte, 64), 512, 8 + 64},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := randPoolInfo(tc.in)
			if len(b) != tc.wantLen {
				t.Fatalf("length %d, want %d", len(b), tc.wantLen)
			}
			if bits := int32(binary.NativeEndian.Uint32(b[0:])); bits != tc.wantBits {
				t.Errorf("entropy_count %d, want %d", bits, tc.wantBits)
			}
			if size := int32(binary.NativeEndian.Uint32(b[4:])); size != int32(len(tc.in)) {
				t.Errorf("buf_size %d, want %d", size, len(tc.in))
			}
			if string(b[8:8+len(tc.in)]) != string(tc.in) {
				t.Errorf("buf %v, want %v", b[8:8+len(tc.in)], tc.in)
			}
		})
	}
}
