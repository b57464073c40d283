package cli

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// revision is the VCS revision the binary was built from, for a build
// whose toolchain records none in the build info (-buildvcs=false): the
// Makefile sets it with -ldflags "-X …/internal/cli.revision=REV", REV
// ending in "-modified" when the work tree had changes. The build info's
// own record wins when there is one.
var revision string

// buildInfo is what `airlock version` prints.
type buildInfo struct {
	version  string // the main module's version: a tag, a pseudo-version, or "(devel)"
	revision string // the VCS revision, "" when unknown
	time     string // the revision's commit time, "" when unknown
	modified bool   // the work tree had changes the revision does not hold
	goVer    string // the toolchain that built it
}

// readBuildInfo gathers the build's facts from bi (nil when the binary
// carries none) and the linker-set revision.
func readBuildInfo(bi *debug.BuildInfo, linked string) buildInfo {
	out := buildInfo{version: "(devel)", goVer: runtime.Version()}
	if bi != nil {
		if v := bi.Main.Version; v != "" {
			out.version = v
		}
		out.goVer = bi.GoVersion
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				out.revision = s.Value
			case "vcs.time":
				out.time = s.Value
			case "vcs.modified":
				out.modified = s.Value == "true"
			}
		}
	}
	if out.revision == "" && linked != "" {
		out.revision, out.modified = strings.CutSuffix(linked, "-modified")
	}
	return out
}

func (b buildInfo) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "airlock %s\n", b.version)
	switch {
	case b.revision == "":
		sb.WriteString("revision unknown (built outside a git checkout, or with -buildvcs=false and not by make build)\n")
	default:
		sb.WriteString("revision " + b.revision)
		if b.time != "" {
			sb.WriteString(", committed " + b.time)
		}
		if b.modified {
			sb.WriteString(", with uncommitted changes")
		}
		sb.WriteString("\n")
	}
	fmt.Fprintf(&sb, "built with %s for %s/%s\n", b.goVer, runtime.GOOS, runtime.GOARCH)
	return sb.String()
}

// word is the version as one word: the main module's version, or the
// revision's first 12 digits when the module has none.
func (b buildInfo) word() string {
	if b.version == "(devel)" && b.revision != "" {
		v := b.revision[:min(12, len(b.revision))]
		if b.modified {
			v += "-modified"
		}
		return v
	}
	return b.version
}

// Version is airlock's version as one word (see buildInfo.word).
func Version() string {
	bi, _ := debug.ReadBuildInfo()
	return readBuildInfo(bi, revision).word()
}

func runVersion(_ context.Context, env *Env, args []string) error {
	fs := newFlagSet("version", "airlock version",
		"Print the version of airlock's module, the VCS revision it was built from\n"+
			"(and whether the work tree had changes), and the Go toolchain that built it.", env)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("version: unexpected argument %q: %w", fs.Arg(0), errdefs.ErrInvalid)
	}
	bi, _ := debug.ReadBuildInfo()
	fmt.Fprint(env.Stdout, readBuildInfo(bi, revision))
	return nil
}
