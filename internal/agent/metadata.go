package agent

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// File metadata (agentproto.MetadataXattrPrefix) is set through the open
// file a write made, before it is renamed into place: never through a
// path, so no symlink in the way is followed, and a file whose metadata
// could not be set never appears. It is read without following a final
// symlink.

// setMetadata gives the open file f the extended attributes of md, whose
// keys agentproto.CheckMetadata accepted: each name is the prefix and a
// checked key.
func setMetadata(f *os.File, md map[string]string) error {
	if len(md) == 0 {
		return nil
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	for _, k := range slices.Sorted(maps.Keys(md)) {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.Fsetxattr(int(fd), agentproto.MetadataXattrPrefix+k, []byte(md[k]), 0)
		}); err != nil {
			return err
		}
		if serr != nil {
			return metadataError(k, serr)
		}
	}
	return nil
}

// metadataError says why metadata key k could not be set.
func metadataError(k string, err error) error {
	switch {
	case errors.Is(err, unix.ENOTSUP):
		return &agentproto.Error{Code: agentproto.CodeInvalid,
			Message: "the filesystem there keeps no user extended attributes, so it cannot keep file metadata: write the file without metadata, or elsewhere"}
	case errors.Is(err, unix.E2BIG), errors.Is(err, unix.ERANGE):
		return &agentproto.Error{Code: agentproto.CodeInvalid,
			Message: fmt.Sprintf("metadata key %q: the filesystem has no room for this much metadata on one file", k)}
	}
	return fmt.Errorf("set metadata key %q: %w", k, err)
}

// maxXattrList bounds the names of one file's extended attributes, as the
// kernel does (XATTR_LIST_MAX).
const maxXattrList = 64 << 10

// readMetadata returns the metadata on path itself, bounded by
// agentproto.BoundMetadata; nil when it has none, and when its
// filesystem keeps no extended attributes or they cannot be read.
func readMetadata(path string) map[string]string {
	names, err := listXattrs(path)
	if err != nil {
		return nil
	}
	var md map[string]string
	val := make([]byte, agentproto.MaxMetadataBytes+1)
	for _, name := range names {
		k, ok := strings.CutPrefix(name, agentproto.MetadataXattrPrefix)
		if !ok || agentproto.CheckMetadataKey(k) != nil {
			continue
		}
		n, err := unix.Lgetxattr(path, name, val)
		if err != nil || n > agentproto.MaxMetadataBytes {
			continue // gone meanwhile, or larger than any a file may keep
		}
		if md == nil {
			md = map[string]string{}
		}
		md[k] = string(val[:n])
	}
	return agentproto.BoundMetadata(md)
}

// listXattrs returns the names of path's extended attributes, without
// following a final symlink.
func listXattrs(path string) ([]string, error) {
	n, err := unix.Llistxattr(path, nil)
	if err != nil || n == 0 {
		return nil, err
	}
	buf := make([]byte, min(n, maxXattrList))
	if n, err = unix.Llistxattr(path, buf); err != nil {
		return nil, err // ERANGE: it grew meanwhile
	}
	var names []string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name != "" {
			names = append(names, name)
		}
	}
	return names, nil
}
