package guest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/airlockhq/airlock/internal/digest"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// debPackage is a Debian binary package as apt's lists describe it.
type debPackage struct {
	Name    string
	Version string
}

// debFile is the file name apt-get download gives a package.
func (p debPackage) debFile() string {
	// apt escapes ':' in versions with an epoch as %3a.
	return fmt.Sprintf("%s_%s_amd64.deb", p.Name, strings.ReplaceAll(p.Version, ":", "%3a"))
}

// runOutput runs a command and returns its stdout; on failure the error
// carries the command and its stderr.
func runOutput(ctx context.Context, dir string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %s: %w", name, strings.Join(args, " "),
			strings.TrimSpace(stderr.String()), err)
	}
	return out, nil
}

// resolveKernelPackage follows the metapackage meta to the versioned kernel
// image package it depends on, with the version the candidate of meta pins.
// One apt-cache call keeps this quick, as it runs on every setup.
func resolveKernelPackage(ctx context.Context, meta string) (debPackage, error) {
	if _, err := exec.LookPath("apt-cache"); err != nil {
		return debPackage{}, fmt.Errorf("find the guest kernel: apt-cache not found (a Debian host is required): %w", errdefs.ErrPrecondition)
	}
	out, err := runOutput(ctx, "", "apt-cache", "show", "--no-all-versions", meta)
	if err != nil {
		return debPackage{}, fmt.Errorf("find the guest kernel (run apt-get update?): %w", err)
	}
	p, ok := kernelDependency(parseControl(out)["Depends"])
	if !ok {
		return debPackage{}, fmt.Errorf("find the guest kernel: %s depends on no versioned linux-image package: %w",
			meta, errdefs.ErrPrecondition)
	}
	return p, nil
}

// kernelDependency picks the "linux-image-... (= version)" entry out of a
// Depends field.
func kernelDependency(depends string) (debPackage, bool) {
	for _, d := range strings.Split(depends, ",") {
		name, rest, _ := strings.Cut(strings.TrimSpace(d), " ")
		if !strings.HasPrefix(name, "linux-image-") {
			continue
		}
		rest = strings.TrimSpace(rest)
		ver, ok := strings.CutPrefix(rest, "(=")
		if !ok || !strings.HasSuffix(ver, ")") {
			continue
		}
		return debPackage{Name: name, Version: strings.TrimSpace(strings.TrimSuffix(ver, ")"))}, true
	}
	return debPackage{}, false
}

// packageSHA256 asks apt for the sha256 of the .deb of p.
func packageSHA256(ctx context.Context, p debPackage) (string, error) {
	out, err := runOutput(ctx, "", "apt-cache", "show", "--no-all-versions", p.Name+"="+p.Version)
	if err != nil {
		return "", fmt.Errorf("look up %s: %w", p.Name, err)
	}
	sum := parseControl(out)["SHA256"]
	if sum == "" {
		return "", fmt.Errorf("look up %s: apt lists no SHA256: %w", p.Name, errdefs.ErrPrecondition)
	}
	return sum, nil
}

// parseControl returns the fields of the first paragraph of Debian control
// data. Continuation lines are dropped; only single-line fields are needed.
func parseControl(b []byte) map[string]string {
	fields := make(map[string]string)
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	return fields
}

// fetchDeb returns the path of p's .deb under cacheDir, downloading it with
// apt-get download when it is not cached or does not match apt's checksum.
func fetchDeb(ctx context.Context, p debPackage, cacheDir string) (string, error) {
	want, err := packageSHA256(ctx, p)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("create package cache: %w", err)
	}
	path := filepath.Join(cacheDir, p.debFile())
	if sum, _, err := digest.File(ctx, path); err == nil && sum == want {
		return path, nil
	}
	tmp, err := os.MkdirTemp(cacheDir, ".download-")
	if err != nil {
		return "", fmt.Errorf("download %s: %w", p.Name, err)
	}
	defer os.RemoveAll(tmp)
	// apt-get download drops privileges to _apt, which cannot write a
	// directory only root may write; the resulting warning is harmless.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("download %s: %w", p.Name, err)
	}
	if _, err := runOutput(ctx, tmp, "apt-get", "download", "-q", p.Name+"="+p.Version); err != nil {
		return "", fmt.Errorf("download %s: %v: %w", p.Name, err, errdefs.ErrUnavailable)
	}
	got := filepath.Join(tmp, p.debFile())
	sum, _, err := digest.File(ctx, got)
	if err != nil {
		return "", fmt.Errorf("download %s: %w", p.Name, err)
	}
	if sum != want {
		return "", fmt.Errorf("download %s: sha256 %s, apt expects %s: %w", p.Name, sum, want, errdefs.ErrUnavailable)
	}
	if err := os.Rename(got, path); err != nil {
		return "", fmt.Errorf("download %s: %w", p.Name, err)
	}
	return path, nil
}
