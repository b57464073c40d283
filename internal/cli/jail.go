package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/vm"
)

// jailOptions are the --jail and --jail-uids flags of the commands that
// run VMs.
type jailOptions struct {
	mode *string
	uids *string
}

func addJailFlags(fs *flagSet) jailOptions {
	return jailOptions{
		mode: fs.String("jail", "on", "run each VM's QEMU, and each image tool on a tenant's disk or image, jailed: its own user, namespaces (mount, network, IPC, UTS, PID), seccomp filters and, for QEMU, a cgroup (see docs/hardening.md); off is for debugging only"),
		uids: fs.String("jail-uids", fmt.Sprintf("%d+%d", vm.DefaultUIDs.First, vm.DefaultUIDs.Count),
			"`FIRST+COUNT`: the users jailed VMs (and a build's image tools) run as, one each; no other user or subordinate id range of the host may be in it"),
	}
}

// parse returns whether the jail is off and the user range.
func (o jailOptions) parse() (unjailed bool, uids vm.UIDRange, err error) {
	switch *o.mode {
	case "on":
	case "off":
		unjailed = true
	default:
		return false, uids, fmt.Errorf("--jail %q is not on or off: %w", *o.mode, errdefs.ErrInvalid)
	}
	first, count, ok := strings.Cut(*o.uids, "+")
	f, err1 := strconv.Atoi(first)
	n, err2 := strconv.Atoi(count)
	if !ok || err1 != nil || err2 != nil {
		return false, uids, fmt.Errorf("--jail-uids %q is not FIRST+COUNT, like 2000000000+1000000: %w", *o.uids, errdefs.ErrInvalid)
	}
	uids = vm.UIDRange{First: f, Count: n}
	if err := uids.Check(); err != nil {
		return false, uids, fmt.Errorf("--jail-uids: %w", err)
	}
	return unjailed, uids, nil
}
