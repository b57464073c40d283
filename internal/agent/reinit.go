package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/timings"
)

// identity is what makes a guest one sandbox rather than another, as init
// (or the last reinit) set it up: a reinit needs to know what it replaces.
type identity struct {
	hostname   string
	caCert     []byte // the gateway CA the trust store gained; nil if none
	rootDevice string
	// placeholder is true while hostname and caCert are a template VM's
	// stand-ins (agentproto.InitRequest.Placeholder).
	placeholder bool
}

// diskResizeWait bounds how long a reinit waits for the guest's kernel to
// see the root disk at the size the host resized it to.
const diskResizeWait = 10 * time.Second

func (a *Agent) handleReinit(st net.Conn, req *agentproto.ReinitRequest) {
	if req == nil {
		replyErr(st, agentproto.CodeInvalid, "reinit request without parameters")
		return
	}
	if err := req.Validate(); err != nil {
		replyErr(st, agentproto.CodeInvalid, err.Error())
		return
	}
	if !a.initialized.Load() {
		replyErr(st, agentproto.CodeState, "the sandbox is not initialised yet")
		return
	}
	a.reinitMu.Lock()
	defer a.reinitMu.Unlock()
	a.mu.Lock()
	prev := a.identity
	a.mu.Unlock()
	res := &agentproto.InitResult{}
	if a.cfg.System {
		if err := systemReinit(req, prev, res); err != nil {
			a.log.Error("reinit", "err", err)
			replyErr(st, agentproto.CodeInternal, err.Error())
			return
		}
	}
	next := identity{hostname: prev.hostname, caCert: prev.caCert, rootDevice: prev.rootDevice, placeholder: req.Placeholder}
	if req.Hostname != "" {
		next.hostname = req.Hostname
	}
	if len(req.CACert) > 0 {
		next.caCert = req.CACert
	}
	a.mu.Lock()
	a.defaultEnv = req.Env
	a.identity = next
	a.mu.Unlock()
	reply(st, agentproto.Result{Init: res})
}

// systemReinit sets the clock and reseeds the kernel's random generator,
// replaces hostname and CA prev had by those of req, and grows the root
// filesystem once the kernel sees the disk at its new size. The clock,
// entropy, hostname and disk are errors; the files are warnings, as at
// init.
func systemReinit(req *agentproto.ReinitRequest, prev identity, res *agentproto.InitResult) error {
	clock := timings.Start()
	defer func() { res.Timings = clock.T }()
	if err := refresh(&agentproto.RefreshRequest{TimeUnixNano: req.TimeUnixNano, Entropy: req.Entropy}); err != nil {
		return err
	}
	if req.Hostname != "" {
		if err := unix.Sethostname([]byte(req.Hostname)); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
		if err := renameHost("/", prev.hostname, req.Hostname); err != nil {
			res.Warnings = append(res.Warnings, err.Error())
		}
	}
	clock.Lap("clock, entropy, hostname")
	if len(req.CACert) > 0 {
		if err := replaceCA("/", prev.caCert, req.CACert); err != nil {
			res.Warnings = append(res.Warnings, fmt.Sprintf("put the gateway's CA in the trust store: %v", err))
		}
	}
	clock.Lap("gateway CA")
	var uts unix.Utsname
	if unix.Uname(&uts) == nil {
		res.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	dev := rootDevice(prev.rootDevice)
	if err := waitDiskSize(dev, req.DiskBytes, diskResizeWait); err != nil {
		return err
	}
	clock.Lap("wait for disk size")
	size, err := growFS(dev, "/")
	if err != nil {
		return fmt.Errorf("grow root filesystem: %w", err)
	}
	res.DiskBytes = size
	clock.Lap("grow root filesystem")
	return nil
}

// waitDiskSize waits until block device dev is at least want bytes large
// (0: not at all), for at most timeout.
func waitDiskSize(dev string, want int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		size, err := blockSize(dev)
		if err != nil {
			return err
		}
		if int64(size) >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the root disk %s is %d bytes, not the %d it was resized to, after %s", dev, size, want, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// renameHost writes hostname name to HostnameFile under root and makes
// HostsFile resolve it instead of old.
func renameHost(root, old, name string) error {
	if old == "" || old == name {
		return writeHostname(root, name)
	}
	if err := os.WriteFile(filepath.Join(root, agentproto.HostnameFile), []byte(name+"\n"), 0o644); err != nil {
		return fmt.Errorf("write the hostname: %w", err)
	}
	hosts := filepath.Join(root, agentproto.HostsFile)
	b, err := os.ReadFile(hosts)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("replace the hostname in %s: %w", agentproto.HostsFile, err)
	}
	next := renameHostsLine(b, old, name)
	if bytes.Equal(next, b) {
		return nil
	}
	// In place, not renamed over: the file may be a symlink.
	if err := os.WriteFile(hosts, next, 0o644); err != nil {
		return fmt.Errorf("replace the hostname in %s: %w", agentproto.HostsFile, err)
	}
	return nil
}

// renameHostsLine returns the hosts file hosts with the line that init
// added for hostname old (agentproto.HostsLine) replaced by the one for
// name; without that line, name's is added as init adds it (addHostsLine).
func renameHostsLine(hosts []byte, old, name string) []byte {
	oldLine := strings.TrimSuffix(agentproto.HostsLine(old), "\n")
	newLine := strings.TrimSuffix(agentproto.HostsLine(name), "\n")
	lines := bytes.SplitAfter(hosts, []byte("\n"))
	var out []byte
	found := false
	for _, l := range lines {
		body, nl := bytes.CutSuffix(l, []byte("\n"))
		if string(body) == oldLine {
			found = true
			l = []byte(newLine)
			if nl {
				l = append(l, '\n')
			}
		}
		out = append(out, l...)
	}
	if !found {
		return append(out, addHostsLine(out, name)...)
	}
	return out
}

// replaceCA puts pem, the sandbox's gateway CA, in the trust store of the
// tree at root in place of old, the one init or the last reinit added:
// in every bundle of agentproto.CABundles that holds old, and in
// agentproto.CACertFile. Where old is nowhere, pem is added as init adds
// it (trustCA).
func replaceCA(root string, old, pem []byte) error {
	pem = withNewline(pem)
	if len(old) == 0 || bytes.Equal(withNewline(old), pem) {
		return trustCA(root, pem)
	}
	old = withNewline(old)
	replaced := false
	for _, b := range agentproto.CABundles() {
		p := filepath.Join(root, b)
		fi, err := os.Stat(p)
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		content, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		next, ok := replacePEM(content, old, pem)
		if !ok {
			continue // another bundle, or one reached through a symlink already done
		}
		// In place: bundles are often symlinks to one file.
		if err := os.WriteFile(p, next, fi.Mode().Perm()); err != nil {
			return err
		}
		replaced = true
	}
	own := filepath.Join(root, agentproto.CACertFile)
	if fi, err := os.Stat(filepath.Dir(own)); err == nil && fi.IsDir() {
		if err := os.WriteFile(own, pem, 0o644); err != nil {
			return err
		}
	}
	if !replaced {
		return trustCA(root, pem)
	}
	return nil
}

// replacePEM replaces every copy of old in the bundle b by pem (both with
// a final newline; old may also end b without one), and says whether
// there was any.
func replacePEM(b, old, pem []byte) ([]byte, bool) {
	if bytes.Contains(b, old) {
		return bytes.ReplaceAll(b, old, pem), true
	}
	if trimmed := bytes.TrimSuffix(old, []byte("\n")); bytes.HasSuffix(b, trimmed) {
		return append(bytes.Clone(b[:len(b)-len(trimmed)]), pem...), true
	}
	return b, false
}

// withNewline is pem ending in a newline.
func withNewline(pem []byte) []byte {
	if bytes.HasSuffix(pem, []byte("\n")) {
		return pem
	}
	return append(bytes.Clone(pem), '\n')
}
