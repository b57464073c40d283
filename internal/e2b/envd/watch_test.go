package envd

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/service"
)

func ent(path, typ string, size int64, mode string, mtime int) service.Entry {
	return service.Entry{Stat: apiv1.Stat{Path: path, Type: typ, SizeBytes: size, Mode: mode, ModifiedAt: time.Unix(int64(mtime), 0)}}
}

func TestDiff(t *testing.T) {
	a := ent("/w/a", "file", 1, "0644", 1)
	link := ent("/w/l", "symlink", 4, "0777", 1)
	link.Target = "/x"
	relinked := link
	relinked.Target = "/y"
	tests := []struct {
		name     string
		old, cur snapshot
		want     string
	}{
		{"nothing", snapshot{"a": a}, snapshot{"a": a}, ""},
		{"create", snapshot{}, snapshot{"a": a, "d/b": ent("/w/d/b", "file", 0, "0644", 1)}, "a CREATE, d/b CREATE"},
		{"remove", snapshot{"a": a}, snapshot{}, "a REMOVE"},
		{"write by size", snapshot{"a": a}, snapshot{"a": ent("/w/a", "file", 2, "0644", 1)}, "a WRITE"},
		{"write by time", snapshot{"a": a}, snapshot{"a": ent("/w/a", "file", 1, "0644", 2)}, "a WRITE"},
		{"chmod", snapshot{"a": a}, snapshot{"a": ent("/w/a", "file", 1, "0600", 1)}, "a CHMOD"},
		{"write and chmod", snapshot{"a": a}, snapshot{"a": ent("/w/a", "file", 9, "0600", 1)}, "a WRITE, a CHMOD"},
		{"file became a directory", snapshot{"a": a}, snapshot{"a": ent("/w/a", "dir", 1, "0644", 1)}, "a REMOVE, a CREATE"},
		{"link retargeted", snapshot{"l": link}, snapshot{"l": relinked}, "l REMOVE, l CREATE"},
		{"rename is remove and create", snapshot{"a": a}, snapshot{"b": ent("/w/b", "file", 1, "0644", 1)}, "a REMOVE, b CREATE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ""
			for i, c := range diff(tt.old, tt.cur) {
				if i > 0 {
					got += ", "
				}
				got += fmt.Sprintf("%s %s", c.name, c.typ[len("EVENT_TYPE_"):])
				if (c.entry == nil) != (c.typ == eventRemove) {
					t.Errorf("%s %s: entry %v", c.name, c.typ, c.entry)
				}
			}
			if got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestEntryInfo(t *testing.T) {
	rs := &resolver{} // no budget: symlinks are not followed
	e := ent("/root/run.sh", "file", 12, "4755", 1700000000)
	b, _ := json.Marshal(rs.entry(e))
	want := `{"name":"run.sh","type":"FILE_TYPE_FILE","path":"/root/run.sh","size":"12","mode":493,"permissions":"urwxr-xr-x",` +
		`"owner":"root","group":"root","modifiedTime":"2023-11-14T22:13:20Z"}`
	if string(b) != want {
		t.Errorf("file:\n got %s\nwant %s", b, want)
	}
	e.Metadata = map[string]string{"author": "mish"}
	b, _ = json.Marshal(rs.entry(e))
	if want := strings.TrimSuffix(want, "}") + `,"metadata":{"author":"mish"}}`; string(b) != want {
		t.Errorf("file with metadata:\n got %s\nwant %s", b, want)
	}
	d := ent("/tmp", "dir", 0, "1777", 0)
	if info := rs.entry(d); info.Type != fileTypeDirectory || info.Permissions != (fs.ModeDir|fs.ModeSticky|0o777).String() || info.Size != nil {
		t.Errorf("dir: %+v", info)
	}
	l := ent("/l", "symlink", 4, "0777", 0)
	l.Target = "gone"
	if info := rs.entry(l); info.Type != fileTypeSymlink || info.SymlinkTarget == nil || *info.SymlinkTarget != "gone" || info.Permissions != "Lrwxrwxrwx" {
		t.Errorf("unfollowed link: %+v", info)
	}
	if info := rs.entry(ent("/dev/null", "other", 0, "0666", 0)); info.Type != "" {
		t.Errorf("device: %+v", info)
	}
}
