package setup

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Packages returns the Debian packages airlock needs on the host.
func Packages() []string {
	return []string{"qemu-system-x86", "qemu-utils", "e2fsprogs", "busybox-static", "debootstrap", "dpkg", "python3"}
}

// missingPackages returns the packages of want that dpkg does not report as
// installed.
func missingPackages(ctx context.Context, want []string) ([]string, error) {
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		return nil, fmt.Errorf("check packages: dpkg-query not found; airlock needs a Debian host: %w", errdefs.ErrPrecondition)
	}
	args := append([]string{"-W", "-f=${Package}\t${Status}\n"}, want...)
	// dpkg-query exits 1 when a package is unknown; stdout still lists the rest.
	out, _ := exec.CommandContext(ctx, "dpkg-query", args...).Output()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	installed := make(map[string]bool)
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		name, status, _ := strings.Cut(sc.Text(), "\t")
		name, _, _ = strings.Cut(name, ":") // an architecture qualifier
		if status == "install ok installed" {
			installed[name] = true
		}
	}
	var missing []string
	for _, p := range want {
		if !installed[p] {
			missing = append(missing, p)
		}
	}
	return missing, nil
}

// installCommand is the command that installs pkgs.
func installCommand(pkgs []string) []string {
	return append([]string{"apt-get", "install", "-y", "--no-install-recommends"}, pkgs...)
}

// ensurePackages installs the missing packages with apt-get when running as
// root, and otherwise says which command to run.
func ensurePackages(ctx context.Context, out io.Writer) (string, error) {
	missing, err := missingPackages(ctx, Packages())
	if err != nil {
		return "", err
	}
	if len(missing) == 0 {
		return upToDate, nil
	}
	install := installCommand(missing)
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("packages %s are missing: run `sudo %s`: %w",
			strings.Join(missing, ", "), strings.Join(install, " "), errdefs.ErrPrecondition)
	}
	fmt.Fprintf(out, "installing %s\n", strings.Join(missing, " "))
	if !aptListsPresent() {
		if err := runApt(ctx, out, "apt-get", "update"); err != nil {
			return "", err
		}
	}
	if err := runApt(ctx, out, install...); err != nil {
		fmt.Fprintf(out, "install failed; updating package lists and retrying\n")
		if err := runApt(ctx, out, "apt-get", "update"); err != nil {
			return "", err
		}
		if err := runApt(ctx, out, install...); err != nil {
			return "", err
		}
	}
	if still, err := missingPackages(ctx, Packages()); err != nil {
		return "", err
	} else if len(still) > 0 {
		return "", fmt.Errorf("packages %s still missing after apt-get install", strings.Join(still, ", "))
	}
	return "installed " + strings.Join(missing, ", "), nil
}

// aptListsPresent reports whether apt has downloaded any package lists.
func aptListsPresent() bool {
	lists, _ := filepath.Glob("/var/lib/apt/lists/*_Packages*")
	return len(lists) > 0
}

// runApt runs an apt-get command, forwarding its output lines to out.
func runApt(ctx context.Context, out io.Writer, args ...string) error {
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w", strings.Join(args, " "), err)
	}
	return nil
}
