package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Every process the agent starts for the host runs in one cgroup,
// commandsGroup, whose pids.max stays below the kernel's own limit on
// tasks. A fork bomb in a command then runs out of pids in that group
// while the kernel still has room: the agent, PID 1 and a Go program,
// must be able to make a thread whenever its runtime needs one, since Go
// aborts when clone fails and the kernel panics when PID 1 exits. With
// the room kept, the agent lives through the bomb, its timeout kills the
// bomb's process group, and the guest answers again.
//
// The group is made once, at init, in a template's first boot; the
// clones of its snapshot inherit it with the rest of the kernel's state.
// Root in the guest can raise the limit: that harms only its own guest.
const (
	cgroupMount   = "/sys/fs/cgroup"
	commandsGroup = "commands"
)

// pidReserve is what the commands' limit keeps back of the kernel's:
// an eighth of it, and never less than minPidReserve, for the kernel's
// own threads, the agent's and what the agent starts for itself.
const minPidReserve = 256

func pidReserve(limit int) int { return max(minPidReserve, limit/8) }

// commandsPidsMax is the pids.max of the commands' group for a kernel
// whose threads-max and pid_max are given: the smaller, less the
// reserve. It is 0 when nothing would be left.
func commandsPidsMax(threadsMax, pidMax int) int {
	limit := min(threadsMax, pidMax)
	return max(0, limit-pidReserve(limit))
}

// setupCommandsCgroup mounts cgroup2 at /sys/fs/cgroup unless it is
// mounted there already, enables the pids controller below the root
// group, makes the commands' group with its pids.max, and returns an open
// descriptor of the group's directory for starting processes in it
// (SysProcAttr.CgroupFD) and the limit written.
func setupCommandsCgroup() (fd, pidsMax int, err error) {
	mnt := cgroupMount
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		if err := mountAt(mnt, "cgroup2", "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return -1, 0, err
		}
	}
	threadsMax, err := readInt("/proc/sys/kernel/threads-max")
	if err != nil {
		return -1, 0, err
	}
	pidMax, err := readInt("/proc/sys/kernel/pid_max")
	if err != nil {
		return -1, 0, err
	}
	pidsMax = commandsPidsMax(threadsMax, pidMax)
	if pidsMax == 0 {
		return -1, 0, fmt.Errorf("the kernel allows %d tasks: none would be left for commands after the agent's reserve", min(threadsMax, pidMax))
	}
	if err := os.WriteFile(filepath.Join(mnt, "cgroup.subtree_control"), []byte("+pids"), 0); err != nil {
		return -1, 0, fmt.Errorf("enable the pids controller: %w", err)
	}
	dir := filepath.Join(mnt, commandsGroup)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return -1, 0, fmt.Errorf("make the commands' cgroup: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.Itoa(pidsMax)), 0); err != nil {
		return -1, 0, fmt.Errorf("limit the commands' pids: %w", err)
	}
	fd, err = unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, 0, fmt.Errorf("open the commands' cgroup: %w", err)
	}
	return fd, pidsMax, nil
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}
