package agent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// setupNetwork brings loopback up and, with cfg, the interface whose
// hardware address is cfg.MAC: its address, MTU, the default route through
// the gateway, the gateway as the only resolver, no IPv6, and the
// gateway's CA in the trust store. It runs inside the sandbox's root, so
// the files it writes are the sandbox's. Files it cannot write are
// warnings; the interface and the route are errors.
func setupNetwork(cfg *agentproto.NetworkConfig) (warnings []string, err error) {
	// IPv6 off before any interface is up, so none gets even a link-local
	// address (the gateway drops IPv6 all the same).
	for _, p := range []string{"/proc/sys/net/ipv6/conf/all/disable_ipv6", "/proc/sys/net/ipv6/conf/default/disable_ipv6"} {
		os.WriteFile(p, []byte("1\n"), 0o644) // absent when the kernel has no IPv6
	}
	if err := ifUp("lo", netip.MustParsePrefix("127.0.0.1/8"), 0); err != nil {
		return nil, fmt.Errorf("loopback: %w", err)
	}
	if cfg == nil {
		return nil, nil
	}
	addr, err := netip.ParsePrefix(cfg.Address)
	if err != nil || !addr.Addr().Is4() {
		return nil, fmt.Errorf("network address %q is not an IPv4 prefix", cfg.Address)
	}
	gw, err := netip.ParseAddr(cfg.Gateway)
	if err != nil || !gw.Is4() {
		return nil, fmt.Errorf("gateway %q is not an IPv4 address", cfg.Gateway)
	}
	name, err := ifaceByMAC(cfg.MAC)
	if err != nil {
		return nil, err
	}
	if err := ifUp(name, addr, cfg.MTU); err != nil {
		return nil, fmt.Errorf("interface %s: %w", name, err)
	}
	if err := defaultRoute(name, gw); err != nil {
		return nil, fmt.Errorf("default route: %w", err)
	}
	if err := writeResolvConf("/", gw); err != nil {
		warnings = append(warnings, err.Error())
	}
	if len(cfg.CACert) > 0 {
		if err := trustCA("/", cfg.CACert); err != nil {
			warnings = append(warnings, fmt.Sprintf("add the gateway's CA to the trust store: %v", err))
		}
	}
	return warnings, nil
}

// ifaceByMAC finds the network interface with hardware address mac.
func ifaceByMAC(mac string) (string, error) {
	paths, _ := filepath.Glob("/sys/class/net/*/address")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil && strings.EqualFold(strings.TrimSpace(string(b)), mac) {
			return filepath.Base(filepath.Dir(p)), nil
		}
	}
	return "", fmt.Errorf("no network interface has address %s", mac)
}

// ifUp gives interface name its address and MTU (0 keeps it) and brings it
// up.
func ifUp(name string, addr netip.Prefix, mtu int) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	ip := addr.Addr().As4()
	if err := ifr.SetInet4Addr(ip[:]); err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFADDR, ifr); err != nil {
		return fmt.Errorf("set address: %w", err)
	}
	var m [4]byte
	for i := 0; i < addr.Bits(); i++ {
		m[i/8] |= 0x80 >> (i % 8)
	}
	if err := ifr.SetInet4Addr(m[:]); err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFNETMASK, ifr); err != nil {
		return fmt.Errorf("set netmask: %w", err)
	}
	if mtu > 0 {
		ifr.SetUint32(uint32(mtu))
		if err := unix.IoctlIfreq(fd, unix.SIOCSIFMTU, ifr); err != nil {
			return fmt.Errorf("set mtu: %w", err)
		}
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("read flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring up: %w", err)
	}
	return nil
}

// defaultRoute adds (or replaces) the IPv4 default route through gw on
// interface name, over rtnetlink.
func defaultRoute(name string, gw netip.Addr) error {
	iface, err := ifIndex(name)
	if err != nil {
		return err
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	gw4 := gw.As4()
	var oif [4]byte
	binary.NativeEndian.PutUint32(oif[:], uint32(iface))
	var body bytes.Buffer
	rt := unix.RtMsg{Family: unix.AF_INET, Table: unix.RT_TABLE_MAIN, Protocol: unix.RTPROT_STATIC, Scope: unix.RT_SCOPE_UNIVERSE, Type: unix.RTN_UNICAST}
	body.Write(unsafe.Slice((*byte)(unsafe.Pointer(&rt)), unix.SizeofRtMsg))
	writeAttr(&body, unix.RTA_GATEWAY, gw4[:])
	writeAttr(&body, unix.RTA_OIF, oif[:])
	hdr := unix.NlMsghdr{
		Len:   uint32(unix.SizeofNlMsghdr + body.Len()),
		Type:  unix.RTM_NEWROUTE,
		Flags: unix.NLM_F_REQUEST | unix.NLM_F_ACK | unix.NLM_F_CREATE | unix.NLM_F_REPLACE,
		Seq:   1,
	}
	msg := make([]byte, 0, hdr.Len)
	msg = append(msg, unsafe.Slice((*byte)(unsafe.Pointer(&hdr)), unix.SizeofNlMsghdr)...)
	msg = append(msg, body.Bytes()...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return err
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if m.Header.Type == syscall.NLMSG_ERROR && len(m.Data) >= 4 {
			if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
				return unix.Errno(-code)
			}
			return nil
		}
	}
	return errors.New("no answer from rtnetlink")
}

// writeAttr appends one rtnetlink attribute, padded to four bytes.
func writeAttr(b *bytes.Buffer, typ uint16, data []byte) {
	var h [4]byte
	binary.NativeEndian.PutUint16(h[0:], uint16(unix.SizeofRtAttr+len(data)))
	binary.NativeEndian.PutUint16(h[2:], typ)
	b.Write(h[:])
	b.Write(data)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
}

func ifIndex(name string) (int, error) {
	b, err := os.ReadFile(filepath.Join("/sys/class/net", name, "ifindex"))
	if err != nil {
		return 0, err
	}
	var n int
	if _, err := fmt.Sscan(string(b), &n); err != nil {
		return 0, fmt.Errorf("ifindex of %s: %w", name, err)
	}
	return n, nil
}

// writeResolvConf makes the gateway the only resolver of the tree at root
// (the sandbox's "/"). A symlink there (to a resolver daemon's file) is
// replaced by a file; an image without /etc gets one.
func writeResolvConf(root string, gw netip.Addr) error {
	p := filepath.Join(root, agentproto.ResolvConfFile)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("write %s: %w", agentproto.ResolvConfFile, err)
	}
	if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		os.Remove(p)
	}
	if err := os.WriteFile(p, []byte(agentproto.ResolvConf(gw.String())), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", agentproto.ResolvConfFile, err)
	}
	return nil
}

// trustCA adds pem to the trust store of the tree at root: to the first
// system bundle the image has (agentproto.CABundles), or to a new one at
// the usual place when it has none, and to a file of its own where the
// image has update-ca-certificates' directory of local certificates.
func trustCA(root string, pem []byte) error {
	if !bytes.HasSuffix(pem, []byte("\n")) {
		pem = append(pem, '\n')
	}
	if fi, err := os.Stat(filepath.Join(root, filepath.Dir(agentproto.CACertFile))); err == nil && fi.IsDir() {
		if err := os.WriteFile(filepath.Join(root, agentproto.CACertFile), pem, 0o644); err != nil {
			return err
		}
	}
	bundles := agentproto.CABundles()
	bundle := filepath.Join(root, bundles[0])
	for _, b := range bundles {
		if fi, err := os.Stat(filepath.Join(root, b)); err == nil && fi.Mode().IsRegular() {
			bundle = filepath.Join(root, b)
			break
		}
	}
	if err := os.MkdirAll(filepath.Dir(bundle), 0o755); err != nil {
		return err
	}
	b, err := os.ReadFile(bundle)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if bytes.Contains(b, pem) {
		return nil
	}
	if len(b) > 0 && !bytes.HasSuffix(b, []byte("\n")) {
		pem = append([]byte("\n"), pem...) // the last certificate's end line must stay a line
	}
	f, err := os.OpenFile(bundle, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(pem); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
