package vm

import (
	"encoding/json"
	"errors"
	"reflect"
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
		{"memory file", func(c *Config) { c.MemoryFile, c.MemoryShared = "/t/mem", true }, ""},
		{"relative memory file", func(c *Config) { c.MemoryFile = "t/mem" }, "not an absolute path"},
		{"shared without a file", func(c *Config) { c.MemoryShared = true }, "shared memory needs a memory file"},
		{"negative tsc rate", func(c *Config) { c.TSCKHz = -1 }, "tsc rate -1 kHz"},
		{"network device", func(c *Config) { c.NetMAC = "5a:94:ef:e4:0c:ee" }, ""},
		{"bad mac", func(c *Config) { c.NetMAC = "5a:94,model=e1000" }, `network MAC "5a:94,model=e1000"`},
		{"jailed as root", func(c *Config) { c.Jail = &Jail{UID: 0, GID: 5} }, "must not be root"},
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
	for _, want := range []string{"-accel tcg,thread=multi,tb-size=256 -cpu max", "panic=-1", "-no-reboot", "name=airlock.agent", "-name guest=/d ", "socket,id=agent,fd=4,server=on", "socket,id=qmp,fd=3,server=on", "-mon chardev=qmp,mode=control"} {
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

func TestArgsMemoryAndIncoming(t *testing.T) {
	tests := []struct {
		name    string
		modify  func(*Config)
		want    []string // substrings of the command line joined by spaces
		notWant []string
	}{
		{
			name:    "plain",
			modify:  func(*Config) {},
			want:    []string{"-m 256", "socket,id=console,fd=5,server=on,wait=off", "virtio-serial-device,max_ports=2 "},
			notWant: []string{"memory-backend", "-incoming", " -S ", "netdev", "-sandbox", "aux"},
		},
		{
			name:   "aux port",
			modify: func(c *Config) { c.AuxPort = true },
			want: []string{
				"-device virtio-serial-device,max_ports=3 ",
				"-device virtserialport,chardev=agent,name=airlock.agent",
				"-chardev socket,id=aux,fd=9,server=on,wait=off -device virtserialport,chardev=aux,name=airlock.aux ",
			},
		},
		{
			name:   "network device",
			modify: func(c *Config) { c.NetMAC = "5a:94:ef:e4:0c:ee" },
			want: []string{
				"-netdev stream,id=net0,server=on,addr.type=fd,addr.str=6",
				"-device virtio-net-device,netdev=net0,mac=5a:94:ef:e4:0c:ee",
			},
		},
		{
			name:    "shared memory file",
			modify:  func(c *Config) { c.MemoryFile, c.MemoryShared = "/t/mem", true },
			want:    []string{"-object memory-backend-file,id=mem,size=256M,mem-path=/t/mem,share=on -machine memory-backend=mem", "-m 256"},
			notWant: []string{"share=off"},
		},
		{
			// The chain the server recorded, named in full: QEMU never
			// follows the backing name in the disk's own header.
			name: "disk with a recorded chain",
			modify: func(c *Config) {
				c.Disk, c.Backing = "/s/disk.qcow2", []string{"/t/layer,1.qcow2", "/t/image.ext4"}
			},
			want: []string{"-drive id=root,file=/s/disk.qcow2,format=qcow2," +
				"backing.driver=qcow2,backing.file.driver=file,backing.file.filename=/t/layer,,1.qcow2," +
				"backing.backing.driver=raw,backing.backing.file.driver=file,backing.backing.file.filename=/t/image.ext4," +
				"if=none,discard=unmap,detect-zeroes=unmap"},
		},
		{
			name:   "private memory file with a comma",
			modify: func(c *Config) { c.MemoryFile = "/t/a,b" },
			want:   []string{"mem-path=/t/a,,b,share=off"},
		},
		{
			name:   "jailed",
			modify: func(c *Config) { c.Jail = &Jail{UID: 1999999001, GID: 1999999001} },
			want:   []string{"-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"},
		},
		{
			name:    "jailed clone maps the sealed memory",
			modify:  func(c *Config) { c.MemoryFile, c.Jail = "/t/mem", &Jail{UID: 1999999001, GID: 1999999001} },
			want:    []string{"mem-path=/proc/self/fd/7,share=off"},
			notWant: []string{"/t/mem"},
		},
		{
			name: "jailed template VM writes its memory file",
			modify: func(c *Config) {
				c.MemoryFile, c.MemoryShared, c.Jail = "/t/mem", true, &Jail{UID: 1999999001, GID: 1999999001}
			},
			want: []string{"mem-path=/t/mem,share=on"},
		},
		{
			name:    "incoming",
			modify:  func(c *Config) { c.Incoming = true },
			want:    []string{"-S -incoming defer"},
			notWant: []string{"memory-backend"},
		},
		{
			name:   "recorded tsc rate",
			modify: func(c *Config) { c.TSCKHz = 1234567 },
			want:   []string{"tsc_early_khz=1234567 tsc=reliable"},
		},
		{
			name:    "kvm ignores the tsc rate",
			modify:  func(c *Config) { c.Accel, c.TSCKHz = AccelKVM, 1234567 },
			notWant: []string{"tsc_early_khz"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.modify(&c)
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			args := " " + strings.Join(Args(c), " ") + " "
			for _, w := range tc.want {
				if !strings.Contains(args, w) {
					t.Errorf("args lack %q: %s", w, args)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(args, w) {
					t.Errorf("args have %q: %s", w, args)
				}
			}
		})
	}
}

// TestArgsStable checks that a config read back from its JSON gives the
// same command line, which a VM started again from its record relies on.
func TestArgsStable(t *testing.T) {
	c := validConfig()
	c.Disk, c.Backing, c.MemoryFile, c.TSCKHz, c.Detach, c.KernelArgs = "/d/disk.qcow2", []string{"/t/image.ext4"}, "/t/mem", 2000000, true, "quiet"
	c.NetMAC, c.AuxPort = "5a:94:ef:e4:0c:ee", true
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var back Config
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, c) {
		t.Fatalf("round trip changed the config:\n%+v\n%+v", c, back)
	}
	if a, b := strings.Join(Args(c), " "), strings.Join(Args(back), " "); a != b {
		t.Errorf("args differ:\n%s\n%s", a, b)
	}
}
