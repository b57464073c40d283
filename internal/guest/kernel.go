package guest

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/pierrec/lz4/v4"
)

// lz4LegacyMagic starts an LZ4 stream in the legacy format, the one the
// kernel's build uses for an LZ4-compressed bzImage payload.
var lz4LegacyMagic = []byte{0x02, 0x21, 0x4c, 0x18}

// lz4LegacyBlockMax is the most one legacy-format block decompresses to.
const lz4LegacyBlockMax = 8 << 20

// ExtractVmlinux returns the ELF vmlinux inside a bzImage whose payload is
// compressed with LZ4 in the legacy format. The format is the magic followed
// by blocks of [uint32 little-endian compressed size][data]; the stream ends
// at the end of the data or at a size that cannot be a block (the kernel
// appends the uncompressed length). The result must be an x86-64 ELF
// executable.
func ExtractVmlinux(bzImage []byte) ([]byte, error) {
	var firstErr error
	for off := 0; ; {
		i := bytes.Index(bzImage[off:], lz4LegacyMagic)
		if i < 0 {
			break
		}
		start := off + i
		vmlinux, err := decompressLegacy(bzImage[start+len(lz4LegacyMagic):])
		if err == nil {
			err = checkVmlinux(vmlinux)
		}
		if err == nil {
			return vmlinux, nil
		}
		if firstErr == nil {
			firstErr = fmt.Errorf("LZ4 stream at offset %d: %w", start, err)
		}
		off = start + 1
	}
	if firstErr == nil {
		firstErr = errors.New("no LZ4 legacy stream in the kernel image")
	}
	return nil, fmt.Errorf("extract vmlinux: %w", firstErr)
}

// decompressLegacy decompresses the blocks of an LZ4 legacy stream that
// follow its magic.
func decompressLegacy(data []byte) ([]byte, error) {
	var out bytes.Buffer
	block := make([]byte, lz4LegacyBlockMax)
	for len(data) >= 4 {
		size := int(binary.LittleEndian.Uint32(data))
		if size == 0 || size > len(data)-4 || size > lz4.CompressBlockBound(lz4LegacyBlockMax) {
			break
		}
		n, err := lz4.UncompressBlock(data[4:4+size], block)
		if err != nil {
			return nil, fmt.Errorf("block at output offset %d: %w", out.Len(), err)
		}
		out.Write(block[:n])
		data = data[4+size:]
	}
	return out.Bytes(), nil
}

// checkVmlinux verifies that b is an x86-64 ELF executable.
func checkVmlinux(b []byte) error {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("decompressed kernel is not ELF: %w", err)
	}
	defer f.Close()
	if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 || f.Type != elf.ET_EXEC {
		return fmt.Errorf("decompressed kernel is %v %v %v, want ELFCLASS64 EM_X86_64 ET_EXEC",
			f.Class, f.Machine, f.Type)
	}
	return nil
}
