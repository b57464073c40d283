package sandbox

import (
	"context"
	"io"
	"os"
	"path/filepath"

	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/vm"
)

// ImageTools runs e2fsprogs and qemu-img on a disk or an image a tenant
// wrote, jailed as uid (vm.Tool): a sandbox's disk as its VM's own user,
// which already holds those bytes, and a build's image as a user of the
// range given to it for the build. A uid of 0 runs them unconfined, as
// this process, which only a runtime with the jail off does.
type ImageTools struct {
	uid int
}

// BuildTools returns the image tools for a build's work in the directory
// dir: jailed as a user of the runtime's range given to dir, until
// release, or unconfined when the runtime's VMs are.
func (r *Runtime) BuildTools(dir string) (tools ImageTools, release func(), err error) {
	if r.cfg.Unjailed {
		return ImageTools{}, func() {}, nil
	}
	uid, err := r.cfg.UIDs.AllocateUID(dir, 0)
	if err != nil {
		return ImageTools{}, nil, err
	}
	return ImageTools{uid: uid}, func() { vm.ReleaseUID(dir) }, nil
}

// output runs the tool name of e2fsprogs or qemu-img with args; it sees
// the files read (read-only) and write (read-write) and nothing else of
// the host's, and returns what it wrote to its standard output.
func (t ImageTools) output(ctx context.Context, name string, read, write []string, args ...string) ([]byte, error) {
	bin, err := toolPath(name)
	if err != nil {
		return nil, err
	}
	return vm.Tool{Path: bin, Args: args, UID: t.uid, GID: t.uid, Read: read, Write: write}.Output(ctx)
}

// run is output with the standard streams its caller's.
func (t ImageTools) run(ctx context.Context, name string, read, write []string, env []string, stdin io.Reader, stdout, stderr io.Writer, args ...string) error {
	bin, err := toolPath(name)
	if err != nil {
		return err
	}
	return vm.Tool{Path: bin, Args: args, UID: t.uid, GID: t.uid, Read: read, Write: write, Env: env, Stdin: stdin}.Run(ctx, stdout, stderr)
}

// TreeRunner runs a tool that reads a tenant's tree (mkfs.ext4 -d of a
// flattened image) jailed as the tools' user, keeping only
// CAP_DAC_READ_SEARCH so that it reads files whatever their owner
// (vm.Tool.ReadAnyFile); the files it writes are the tools' user's while
// it runs and root's after.
func (t ImageTools) TreeRunner() template.ToolRunner {
	return func(ctx context.Context, name string, args, env, read, write []string) ([]byte, error) {
		bin, err := toolPath(name)
		if err != nil {
			return nil, err
		}
		for _, w := range write {
			if err := t.Own(w); err != nil {
				return nil, err
			}
		}
		out, err := vm.Tool{Path: bin, Args: args, Env: env, UID: t.uid, GID: t.uid, Read: read, Write: write,
			ReadAnyFile: t.uid != 0}.Output(ctx)
		for _, w := range write {
			if gerr := t.GiveBack(w); gerr != nil && err == nil {
				err = gerr
			}
		}
		return out, err
	}
}

// tempBeside makes an empty temporary file in the directory of path, to
// be renamed to path once giveBack has made it root's again; meanwhile it
// is the tools' user's, for them to write.
func (t ImageTools) tempBeside(path string) (string, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return "", err
	}
	f.Close()
	if err := t.Own(f.Name()); err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// Own gives the file at p to the tools' user, so that they can write it.
func (t ImageTools) Own(p string) error {
	if t.uid == 0 {
		return nil
	}
	return os.Chown(p, t.uid, t.uid)
}

// GiveBack makes the file at p root's again, once the tools are done
// with it, before anything else reads it.
func (t ImageTools) GiveBack(p string) error {
	if t.uid == 0 {
		return nil
	}
	return os.Chown(p, 0, 0)
}
