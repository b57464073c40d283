package vm

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func validConfig() Config {
	return Config{Kernel: "/k", Initramfs: "/i", Accel: AccelTCG, VCPUs: 1, MemoryMiB: 256, Dir: "/d"}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Config)
		want   string
	}{
		{"valid", func(*Config) {}, ""},
		{"no kernel", func(c *Config) { c.Kernel = "" }, "kernel and initramfs"},
		{"bad accel", func(c *Config) { c.Accel = "hvf" }, `accelerator "hvf"`},
		{"no vcpus", func(c *Config) { c.VCPUs = 0 }, "vcpus 0"},
		{"little memory", func(c *Config) { c.MemoryMiB = 16 }, "memory 16 MiB"},
		{"long socket path", func(c *Config) { c.Dir = "/" + strings.Repeat("d", 120) }, "longer than 107 bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.modify(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want invalid mentioning %q", err, tc.want)
			}
		})
	}
}

func TestArgs(t *testing.T) {
	c := validConfig()
	tcg := strings.Join(Args(c), " ")
	for _, want := range []string{"-accel tcg,thread=multi -cpu max", "panic=-1", "-no-reboot", "name=airlock.agent", "/d/agent.sock", "/d/qmp.sock"} {
		if !strings.Contains(tcg, want) {
			t.Errorf("TCG args lack %q: %s", want, tcg)
		}
	}
	if khz := HostTSCKHz(); khz > 0 && !strings.Contains(tcg, "tsc_early_khz=") {
		t.Errorf("TCG args do not pass the host TSC rate: %s", tcg)
	}
	if strings.Contains(tcg, "virtio-blk") {
		t.Errorf("a VM without a disk got one: %s", tcg)
	}

	c.Accel, c.CPU, c.Disk = AccelKVM, "host,-arch-capabilities", "/d/disk.qcow2"
	kvm := strings.Join(Args(c), " ")
	for _, want := range []string{"-accel kvm -cpu host,-arch-capabilities", "file=/d/disk.qcow2,format=qcow2", "virtio-blk-device"} {
		if !strings.Contains(kvm, want) {
			t.Errorf("KVM args lack %q: %s", want, kvm)
		}
	}
	if strings.Contains(kvm, "tsc_early_khz") {
		t.Errorf("KVM args carry the TCG clock hint: %s", kvm)
	}
}
