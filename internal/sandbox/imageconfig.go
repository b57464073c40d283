package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// WriteImageConfig writes conf to agentproto.ImageConfigFile in the
// unmounted ext4 image img, owned by root, and makes the directory
// workdir ("" or "/" for none) with its parents, after growing the image
// by some room for them. img must be the tools' (ImageTools.Own).
//
// debugfs does the writing, from a script of this function's own
// commands whose every path is quoted by debugfsArg: a working directory
// with a newline or a quote is refused before debugfs runs, so no line of
// the script can start with "!" (debugfs's shell escape) or hold a second
// command, and debugfs runs jailed as the tools' user in any case.
func WriteImageConfig(ctx context.Context, tools ImageTools, img string, conf []byte, workdir string) error {
	cfgPath := agentproto.ImageConfigFile
	var dirs []string
	dirs = append(dirs, parentsOf(cfgPath)...)
	if workdir != "" && workdir != "/" {
		if !path.IsAbs(workdir) {
			return fmt.Errorf("working directory %q is not absolute", workdir)
		}
		dirs = append(dirs, parentsOf(path.Join(workdir, "x"))...)
	}
	var cmds []string
	for _, d := range dirs {
		q, err := debugfsArg(d)
		if err != nil {
			return fmt.Errorf("working directory: %w", err)
		}
		cmds = append(cmds, "mkdir "+q)
	}
	fi, err := os.Stat(img)
	if err != nil {
		return err
	}
	if err := os.Truncate(img, fi.Size()+16<<20); err != nil {
		return err
	}
	if _, err := tools.output(ctx, "resize2fs", nil, []string{img}, "-f", img); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(img), ".conf-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	host := filepath.Join(tmp, "image.json")
	if err := os.WriteFile(host, conf, 0o600); err != nil {
		return err
	}
	if err := tools.Own(host); err != nil {
		return err
	}
	qcfg, _ := debugfsArg(cfgPath)
	qhost, err := debugfsArg(host)
	if err != nil {
		return err
	}
	cmds = append(cmds, "rm "+qcfg, "write "+qhost+" "+qcfg, "sif "+qcfg+" uid 0", "sif "+qcfg+" gid 0")
	// debugfs goes on past a failed command, saying so on stderr: a
	// directory that exists already is one such. What counts is the
	// file read back below.
	var stdout, stderr bytes.Buffer
	script := strings.NewReader(strings.Join(cmds, "\n") + "\n")
	if err := tools.run(ctx, "debugfs", []string{host}, []string{img}, nil, script, &stdout, &stderr, "-w", "-f", "-", img); err != nil {
		return fmt.Errorf("debugfs: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	got, _, err := debugfs(ctx, ext4Image{path: img, tools: tools}, false, nil, "cat "+qcfg)
	if err != nil || !bytes.Equal(got, conf) {
		return fmt.Errorf("write %s into the image: it reads back as %q (a symlink or a file where a directory belongs?)", cfgPath, firstLine(got))
	}
	return fsck(ctx, tools, img)
}

// parentsOf lists the directories above p, outermost first: "/a/b/c" gives
// "/a" and "/a/b".
func parentsOf(p string) []string {
	var out []string
	parts := strings.Split(strings.Trim(path.Clean(p), "/"), "/")
	for i := 1; i < len(parts); i++ {
		out = append(out, "/"+strings.Join(parts[:i], "/"))
	}
	return out
}
