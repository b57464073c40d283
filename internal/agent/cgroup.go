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
// commandsGroup, whose pids.max and memory.max stay below what the
// kernel has, so that a command that takes all it can (a fork bomb, a
// memory hog) runs out inside that group while the agent, PID 1 and a
// Go program, keeps room of its own:
//
//   - pids: Go aborts when clone fails, and the kernel panics when PID 1
//     exits, so the agent must always be able to make a thread;
//   - memory: a guest whose memory is full stalls in reclaim and global
//     OOM kills, the agent with it, for minutes (a bash fork bomb in a
//     512 MiB guest: its exit 3 minutes late, or never). memory.max
//     keeps what the kernel and the agent hold out of the commands'
//     reach, and pids.max is low enough (memoryPerPid) that a bomb of
//     small processes runs out of pids first: with the memory limit
//     alone, the same bomb still stalled the guest.
//
// With the room kept, the agent lives through such a command, its
// timeout kills the command's process group, and the guest answers again.
//
// The group is made once, at init, in a template's first boot; the
// clones of its snapshot inherit it with the rest of the kernel's state.
// Root in the guest can raise the limits: that harms only its own guest.
const (
	cgroupMount   = "/sys/fs/cgroup"
	commandsGroup = "commands"
)

// pidReserve is what the commands' limit keeps back of the kernel's:
// an eighth of it, and never less than minPidReserve, for the kernel's
// own threads, the agent's and what the agent starts for itself.
const minPidReserve = 256

func pidReserve(limit int) int { return max(minPidReserve, limit/8) }

// memoryPerPid is the memory the commands' group has for each pid it
// may hold: a process takes at least a few hundred KiB (a forked bash
// about 400: page tables, kernel stack, the pages it writes), so a group
// that could hold more processes than that would run out of memory
// before pids, and a guest out of memory stalls for minutes where one out
// of pids refuses the fork at once.
const memoryPerPid = 512 << 10

// commandsPidsMax is the pids.max of the commands' group for a kernel
// whose threads-max and pid_max are given and a group of memory bytes:
// the smaller of the two less the reserve, and no more than memory
// allows at memoryPerPid each. It is 0 when nothing would be left.
func commandsPidsMax(threadsMax, pidMax int, memory int64) int {
	limit := min(threadsMax, pidMax)
	return max(0, min(limit-pidReserve(limit), int(memory/memoryPerPid)))
}

// minMemReserve is the least memory the commands' limit keeps back for
// the agent and the kernel: the agent holds the output of the commands
// it runs (a ring of RingSize each) and of recent exits.
const minMemReserve = 32 << 20

// commandsMemoryMax is the memory.max of the commands' group for a
// guest of total bytes (MemTotal) of which available bytes are available
// at init (MemAvailable): what the kernel, its initramfs and the agent
// already hold is not the commands' to take, so the limit is what is
// available less a reserve of a sixteenth of the total, at least
// minMemReserve. It is 0 when nothing would be left.
func commandsMemoryMax(total, available int64) int64 {
	return max(0, min(total, available)-max(minMemReserve, total/16))
}

// commandsLimits are the limits setupCommandsCgroup wrote.
type commandsLimits struct {
	pids   int
	memory int64
}

// setupCommandsCgroup mounts cgroup2 at /sys/fs/cgroup unless it is
// mounted there already, enables the pids and memory controllers below
// the root group, makes the commands' group with its pids.max and
// memory.max, and returns an open descriptor of the group's directory
// for starting processes in it (SysProcAttr.CgroupFD) and the limits
// written.
func setupCommandsCgroup() (fd int, limits commandsLimits, err error) {
	mnt := cgroupMount
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		if err := mountAt(mnt, "cgroup2", "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return -1, limits, err
		}
	}
	threadsMax, err := readInt("/proc/sys/kernel/threads-max")
	if err != nil {
		return -1, limits, err
	}
	pidMax, err := readInt("/proc/sys/kernel/pid_max")
	if err != nil {
		return -1, limits, err
	}
	mem, err := meminfo(procMeminfo)
	if err != nil {
		return -1, limits, err
	}
	total, available := mem["MemTotal"], mem["MemAvailable"]
	limits.memory = commandsMemoryMax(total, available)
	limits.pids = commandsPidsMax(threadsMax, pidMax, limits.memory)
	if limits.pids == 0 || limits.memory == 0 {
		return -1, limits, fmt.Errorf("the kernel allows %d tasks and has %d bytes of memory: nothing would be left for commands after the agent's reserve",
			min(threadsMax, pidMax), total)
	}
	if err := os.WriteFile(filepath.Join(mnt, "cgroup.subtree_control"), []byte("+pids +memory"), 0); err != nil {
		return -1, limits, fmt.Errorf("enable the pids and memory controllers: %w", err)
	}
	dir := filepath.Join(mnt, commandsGroup)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return -1, limits, fmt.Errorf("make the commands' cgroup: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.Itoa(limits.pids)), 0); err != nil {
		return -1, limits, fmt.Errorf("limit the commands' pids: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.max"), []byte(strconv.FormatInt(limits.memory, 10)), 0); err != nil {
		return -1, limits, fmt.Errorf("limit the commands' memory: %w", err)
	}
	fd, err = unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, limits, fmt.Errorf("open the commands' cgroup: %w", err)
	}
	return fd, limits, nil
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
