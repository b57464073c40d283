package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/atomicfile"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/guest"
	"github.com/airlockhq/airlock/internal/vm"
)

// AccelVerdict is the cached result of the accelerator probe.
type AccelVerdict struct {
	Accel vm.Accel `json:"accel"`
	// CPU is the -cpu model that worked under KVM.
	CPU string `json:"cpu,omitempty"`
	// Reason says why KVM was not chosen, when it was not.
	Reason string `json:"reason,omitempty"`
	// Kernel identifies the guest kernel the probe booted; a new kernel
	// invalidates the verdict.
	Kernel    string    `json:"kernel"`
	CheckedAt time.Time `json:"checked_at"`
}

// errNoKVM marks a host without a usable /dev/kvm.
var errNoKVM = errors.New("/dev/kvm is not usable")

// ProbeTimeout bounds one KVM trial boot. A guest that works under KVM
// reaches its agent in well under a second.
const ProbeTimeout = 15 * time.Second

// kernelID names the guest kernel the verdict was reached with: its sha256
// from the boot manifest, so that rebuilding only the initramfs keeps the
// verdict.
func kernelID(dir datadir.Dir) string {
	if m, err := guest.ReadManifest(dir); err == nil && m.KernelSHA256 != "" {
		return "sha256:" + m.KernelSHA256
	}
	fi, err := os.Stat(dir.Kernel())
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%d-%d", fi.Size(), fi.ModTime().UnixNano())
}

// ProbeAccel decides between KVM and TCG. A /dev/kvm that opens is no proof
// that KVM can run the guest (a paravirtual nested hypervisor fails an
// unmodified kernel with an emulation failure), so it boots the real guest
// under KVM once and checks that its agent answers. The verdict is cached
// in the data directory; force probes again.
func ProbeAccel(ctx context.Context, dir datadir.Dir, log *slog.Logger, force bool) (AccelVerdict, error) {
	kid := kernelID(dir)
	if !force {
		if b, err := os.ReadFile(dir.AccelVerdict()); err == nil {
			var v AccelVerdict
			if json.Unmarshal(b, &v) == nil && v.Kernel == kid && (v.Accel == vm.AccelKVM || v.Accel == vm.AccelTCG) {
				return v, nil
			}
		}
	}
	v := AccelVerdict{Accel: vm.AccelTCG, Kernel: kid, CheckedAt: time.Now().UTC()}
	// Some hosts' KVM refuses the ARCH_CAPABILITIES MSR that "-cpu host"
	// passes through; hiding it from the guest is the fallback.
	var reasons []string
	for _, cpu := range []string{"host", "host,-arch-capabilities"} {
		err := tryKVM(ctx, dir, cpu, log)
		if err == nil {
			v.Accel, v.CPU = vm.AccelKVM, cpu
			break
		}
		reasons = append(reasons, fmt.Sprintf("-cpu %s: %s", cpu, strings.Join(strings.Fields(err.Error()), " ")))
		if errors.Is(err, errNoKVM) {
			break
		}
	}
	if v.Accel == vm.AccelTCG {
		v.Reason = strings.Join(reasons, "; ")
		log.Info("using TCG (software emulation)", "reason", v.Reason)
	}
	b, _ := json.MarshalIndent(v, "", "  ")
	if err := atomicfile.WriteBytes(dir.AccelVerdict(), append(b, '\n'), 0o644); err != nil {
		log.Warn("cache the accelerator verdict", "err", err)
	}
	return v, nil
}

// tryKVM boots the guest without a disk under KVM and waits for its agent.
func tryKVM(ctx context.Context, dir datadir.Dir, cpu string, log *slog.Logger) error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("%w: %v", errNoKVM, err)
	}
	f.Close()
	if err := os.MkdirAll(dir.Sandboxes(), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(dir.Sandboxes(), "probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	m, err := vm.Start(ctx, vm.Config{
		Kernel: dir.Kernel(), Initramfs: dir.Initramfs(), Accel: vm.AccelKVM, CPU: cpu,
		VCPUs: 1, MemoryMiB: 256, Dir: tmp,
	}, log)
	if err != nil {
		return err
	}
	defer m.Stop(context.Background())
	c, err := ConnectAgent(ctx, m, ProbeTimeout)
	if err != nil {
		if b, rerr := os.ReadFile(filepath.Join(tmp, vm.QEMULogName)); rerr == nil && len(b) > 0 {
			line, _, _ := strings.Cut(string(b), "\n")
			return fmt.Errorf("the guest did not come up under KVM: %s", line)
		}
		return fmt.Errorf("the guest did not reach its agent within %s", ProbeTimeout)
	}
	defer c.Close()
	if _, err := c.Ping(ctx); err != nil {
		return fmt.Errorf("the guest agent did not answer under KVM: %w", err)
	}
	return nil
}
