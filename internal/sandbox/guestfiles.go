package sandbox

import (
	"bytes"
	"context"
	"errors"
	"path"
	"strings"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// guestFiles is what the agent's init wrote into a sandbox's root
// filesystem for that sandbox alone (agentproto's HostnameFile and the
// others), which a disk image saved from the sandbox must not carry: a
// template made of it would hand one sandbox's hostname and CA to every
// sandbox made from it.
type guestFiles struct {
	// Hostname is the sandbox's ID.
	Hostname string
	// Gateway is the resolver ResolvConfFile names; "" when the sandbox
	// had no network.
	Gateway string
	// CACert is the gateway's CA (PEM) that the trust store gained; nil
	// when it gained none.
	CACert []byte
}

// agentDirs are the directories init makes (or made, in older agents) for
// the files it writes when the image lacks them, deepest first: a saved
// image loses those that its template did not have and that are empty
// once the files are gone.
func agentDirs() []string {
	return []string{
		path.Dir(agentproto.CACertFile), "/usr/local/share", "/usr/local",
		"/etc/ssl/certs", "/etc/ssl", "/etc",
	}
}

// caCertLink is where update-ca-certificates, run in a sandbox, links
// agentproto.CACertFile from.
const caCertLink = "/etc/ssl/certs/airlock-gateway.pem"

// removeGuestFiles takes out of the ext4 image img (not mounted, its
// journal replayed) what init wrote for the sandbox g describes, going by
// base, the image of the template the sandbox was made from: a file the
// agent replaced gets the template's version back (or goes, if the
// template had none) unless the sandbox changed it since; a file the
// agent added to loses the addition and keeps the sandbox's own changes.
// Processes in the sandbox may have left other traces of its identity
// (logs, shell history): those are the sandbox's own content.
func removeGuestFiles(ctx context.Context, tools ImageTools, img, base string, g guestFiles) error {
	// Nothing changes either image until the edits are applied at the end.
	im, tpl := ext4Image{path: img, tools: tools, cache: newExt4Cache()}, ext4Image{path: base, tools: tools, cache: newExt4Cache()}
	var edits ext4Edits
	plan := func(p string, change func(cur []byte, orig ext4Entry, origContent []byte) (keep bool, content []byte)) error {
		cur, err := im.stat(ctx, p)
		if err != nil || !cur.regular() {
			return err
		}
		content, err := im.readFile(ctx, p)
		if err != nil {
			return err
		}
		orig, err := tpl.stat(ctx, p)
		if err != nil {
			return err
		}
		var origContent []byte
		if orig.regular() {
			if origContent, err = tpl.readFile(ctx, p); err != nil {
				return err
			}
		}
		keep, next := change(content, orig, origContent)
		if keep {
			return nil
		}
		real, err := im.resolveDir(ctx, p)
		if err != nil {
			return err
		}
		switch {
		case next != nil:
			edits.replace(real, next, cur)
		case orig.regular():
			edits.replace(real, origContent, orig)
		case orig.Type == "symlink":
			edits.replaceByLink(real, orig.Target)
		default:
			edits.remove(real)
		}
		return nil
	}
	// A file the agent replaced: back to the template's when it still
	// holds what the agent wrote.
	replaced := func(wrote string) func([]byte, ext4Entry, []byte) (bool, []byte) {
		return func(cur []byte, _ ext4Entry, _ []byte) (bool, []byte) {
			return string(cur) != wrote, nil
		}
	}
	// A file the agent added to: without the addition; back to the
	// template's when that leaves it as the template had it (or as the
	// agent made it when the template had none).
	added := func(strip func([]byte) []byte, made string) func([]byte, ext4Entry, []byte) (bool, []byte) {
		return func(cur []byte, orig ext4Entry, origContent []byte) (bool, []byte) {
			rest := strip(cur)
			switch {
			case bytes.Equal(rest, cur):
				return true, nil
			case orig.regular() && bytes.Equal(bytes.TrimSuffix(rest, []byte("\n")), bytes.TrimSuffix(origContent, []byte("\n"))):
				return false, nil
			case !orig.exists() && len(bytes.TrimSpace(bytes.TrimPrefix(rest, []byte(made)))) == 0:
				return false, nil
			}
			return false, rest
		}
	}
	if g.Hostname != "" {
		if err := plan(agentproto.HostnameFile, replaced(g.Hostname+"\n")); err != nil {
			return err
		}
		line := agentproto.HostsLine(g.Hostname)
		if err := plan(agentproto.HostsFile, added(func(b []byte) []byte { return removeLines(b, line) }, agentproto.HostsHeader)); err != nil {
			return err
		}
	}
	if g.Gateway != "" {
		if err := plan(agentproto.ResolvConfFile, replaced(agentproto.ResolvConf(g.Gateway))); err != nil {
			return err
		}
	}
	if len(g.CACert) > 0 {
		pem := append(bytes.TrimSuffix(bytes.Clone(g.CACert), []byte("\n")), '\n')
		strip := func(b []byte) []byte { return removePEM(b, pem) }
		if err := plan(agentproto.CACertFile, added(strip, "")); err != nil {
			return err
		}
		if l, err := im.stat(ctx, caCertLink); err != nil {
			return err
		} else if l.Type == "symlink" && l.Target == agentproto.CACertFile {
			real, err := im.resolveDir(ctx, caCertLink)
			if err != nil {
				return err
			}
			edits.remove(real)
		}
		// The agent wrote through symlinks to the bundle's file, which
		// need not be one of the usual places.
		seen := map[string]bool{}
		for _, b := range agentproto.CABundles() {
			if e, err := im.stat(ctx, b); err != nil || !e.exists() {
				if err != nil {
					return err
				}
				continue
			}
			real, err := im.resolve(ctx, b)
			if errors.Is(err, errSymlinkLoop) {
				continue // nothing can have been written there
			}
			if err != nil {
				return err
			}
			if seen[real] {
				continue
			}
			seen[real] = true
			if err := plan(real, added(strip, "")); err != nil {
				return err
			}
		}
	}
	if err := edits.apply(ctx, im); err != nil {
		return err
	}
	im.cache = newExt4Cache() // the image changed
	// Then the directories the agent made, once empty.
	var dirs ext4Edits
	for _, d := range agentDirs() {
		cur, err := im.stat(ctx, d)
		if err != nil {
			return err
		}
		if cur.Type != "directory" {
			continue
		}
		if orig, err := tpl.stat(ctx, d); err != nil || orig.exists() {
			if err != nil {
				return err
			}
			continue
		}
		empty, err := im.empty(ctx, d)
		if err != nil {
			return err
		}
		if !empty {
			continue
		}
		// One at a time: whether a parent is empty depends on its child.
		dirs = ext4Edits{}
		dirs.rmdir(d)
		if err := dirs.apply(ctx, im); err != nil {
			return err
		}
	}
	return nil
}

// removeLines removes every line of b that is line (with its newline).
func removeLines(b []byte, line string) []byte {
	var out []byte
	for _, l := range bytes.SplitAfter(b, []byte("\n")) {
		if strings.TrimRight(string(l), "\n") == strings.TrimRight(line, "\n") {
			continue
		}
		out = append(out, l...)
	}
	if out == nil {
		out = []byte{}
	}
	return out
}

// removePEM removes every copy of pem (with its final newline, or at the
// very end without it) from b.
func removePEM(b, pem []byte) []byte {
	out := bytes.ReplaceAll(b, pem, nil)
	if trimmed := bytes.TrimSuffix(pem, []byte("\n")); bytes.HasSuffix(out, trimmed) {
		out = out[:len(out)-len(trimmed)]
	}
	return out
}
