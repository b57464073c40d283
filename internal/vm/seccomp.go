package vm

import (
	"os"
)

// qemuSeccompEnv set to "log" makes the filter log the calls it does not
// allow instead of refusing them (to the kernel's audit log, dmesg), to
// measure what QEMU needs; anything else, or unset, enforces it.
const qemuSeccompEnv = "AIRLOCK_QEMU_SECCOMP"

// qemuFilterMode is the mode the jail stage is told: "log" to measure,
// else "enforce".
func qemuFilterMode() string {
	if os.Getenv(qemuSeccompEnv) == "log" {
		return "log"
	}
	return "enforce"
}
