// Package testhost makes a host to send test traffic to: a network
// namespace joined to this host by a veth pair, with addresses in ranges
// that never leave the machine (198.18.0.0/15, fd00::/8). The sandbox
// network tests and the network benchmarks run their servers in one, since
// a sandbox's gateway never dials the host's own addresses.
package testhost

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// Config describes a test host.
type Config struct {
	// Name names the namespace; the host's end of the veth pair is Name
	// with "h" before it, the namespace's end with "p" after that, so it
	// must be short (at most 12 bytes).
	Name string
	// HostAddrs are the addresses of the host's end of the veth, with
	// their prefixes; the first IPv4 one is the namespace's default route.
	HostAddrs []netip.Prefix
	// Addrs are the addresses inside the namespace, with their prefixes.
	Addrs []netip.Prefix
	// Routes are sent from the host into the namespace besides the
	// prefixes of HostAddrs (a cloud metadata address, for example, so
	// that nothing sent to it leaves the machine).
	Routes []netip.Prefix
}

// Host is a test host. Its namespace and veth pair live until Close.
type Host struct {
	cfg    Config
	hostIf string
}

// New makes the namespace and the veth pair, first removing what a crashed
// run of the same name left. It needs root.
func New(cfg Config) (*Host, error) {
	if len(cfg.Name) == 0 || len(cfg.Name) > 12 || strings.ContainsAny(cfg.Name, "/ \x00") {
		return nil, fmt.Errorf("test host name %q: use 1 to 12 characters, no slash or space", cfg.Name)
	}
	var gw netip.Addr
	for _, p := range cfg.HostAddrs {
		if p.Addr().Is4() {
			gw = p.Addr()
			break
		}
	}
	if !gw.IsValid() {
		return nil, errors.New("test host: HostAddrs needs an IPv4 address for the namespace's default route")
	}
	h := &Host{cfg: cfg, hostIf: "h" + cfg.Name}
	peer := h.hostIf + "p"
	h.Close() // a leftover of a crashed run
	cmds := [][]string{
		{"netns", "add", cfg.Name},
		{"link", "add", h.hostIf, "type", "veth", "peer", "name", peer},
		{"link", "set", peer, "netns", cfg.Name},
	}
	for _, p := range cfg.HostAddrs {
		cmds = append(cmds, addrAdd(p, h.hostIf))
	}
	cmds = append(cmds, []string{"link", "set", h.hostIf, "up"})
	for _, p := range cfg.Routes {
		cmds = append(cmds, []string{"route", "replace", p.String(), "dev", h.hostIf})
	}
	for _, p := range cfg.Addrs {
		cmds = append(cmds, append([]string{"-n", cfg.Name}, addrAdd(p, peer)...))
	}
	cmds = append(cmds,
		[]string{"-n", cfg.Name, "link", "set", peer, "up"},
		[]string{"-n", cfg.Name, "link", "set", "lo", "up"},
		[]string{"-n", cfg.Name, "route", "add", "default", "via", gw.String()},
	)
	for _, args := range cmds {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			h.Close()
			return nil, fmt.Errorf("test host: ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return h, nil
}

// addrAdd is the ip arguments that give dev the address p (IPv6 without
// duplicate address detection, so that it is usable at once).
func addrAdd(p netip.Prefix, dev string) []string {
	if p.Addr().Is6() {
		return []string{"-6", "addr", "add", p.String(), "dev", dev, "nodad"}
	}
	return []string{"addr", "add", p.String(), "dev", dev}
}

// Name is the namespace's name, as ip netns knows it.
func (h *Host) Name() string { return h.cfg.Name }

// HostIf is the name of the host's end of the veth pair.
func (h *Host) HostIf() string { return h.hostIf }

// Do runs f on a thread that is in the namespace: sockets f creates
// belong to it for good, wherever they are used afterwards.
func (h *Host) Do(f func() error) error {
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer self.Close()
	target, err := os.Open(filepath.Join("/run/netns", h.cfg.Name))
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter namespace %s: %w", h.cfg.Name, err)
	}
	ferr := f()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays in the namespace: never unlock it, so that it
		// ends with its goroutine.
		return fmt.Errorf("leave namespace %s: %w", h.cfg.Name, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// Close removes the routes, the veth pair and the namespace. What is
// already gone is no error.
func (h *Host) Close() {
	for _, p := range h.cfg.Routes {
		exec.Command("ip", "route", "del", p.String(), "dev", h.hostIf).Run()
	}
	exec.Command("ip", "link", "del", h.hostIf).Run()
	exec.Command("ip", "netns", "del", h.cfg.Name).Run()
}
