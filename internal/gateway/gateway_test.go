package gateway

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"

	"github.com/airlockhq/airlock/internal/gateway/policy"
)

func TestDialGuest(t *testing.T) {
	n := newTestNet(t, policy.Policy{}, netOptions{})
	ln, err := gonet.ListenTCP(n.guest, tcpip.FullAddress{NIC: 1, Port: 8080}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := n.gw.DialGuest(ctx, 8080)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "inbound"); err != nil || got != "inbound" {
		t.Fatalf("echo %q, %v", got, err)
	}
	if c, err := n.gw.DialGuest(ctx, 8081); err == nil {
		c.Close()
		t.Error("dialed a guest port nothing listens on")
	}
}

// A guest that asks DHCP gets the address the gateway expects of it.
func TestDHCP(t *testing.T) {
	n := newTestNet(t, policy.Policy{}, netOptions{})
	mac, _ := net.ParseMAC(GuestMAC)
	discover, err := dhcpv4.NewDiscovery(mac)
	if err != nil {
		t.Fatal(err)
	}
	c, err := gonet.DialUDP(n.guest, &tcpip.FullAddress{NIC: 1, Port: 68}, &tcpip.FullAddress{NIC: 1, Addr: stackAddr(GatewayIP), Port: 67}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(discover.ToBytes()); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	k, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	offer, err := dhcpv4.FromBytes(buf[:k])
	if err != nil {
		t.Fatal(err)
	}
	if offer.MessageType() != dhcpv4.MessageTypeOffer || offer.YourIPAddr.String() != GuestIP ||
		offer.Router()[0].String() != GatewayIP || offer.DNS()[0].String() != GatewayIP {
		t.Errorf("offer %v", offer.Summary())
	}
}

// Close ends every goroutine of the gateway; ending the link ends the
// gateway by itself.
func TestCloseEndsEverything(t *testing.T) {
	before := runtime.NumGoroutine()
	for _, how := range []string{"Close", "link ends"} {
		t.Run(how, func(t *testing.T) {
			n := newTestNet(t, policy.Policy{Egress: "allow"}, netOptions{})
			n.dns.set("ok.test", "203.0.113.5")
			n.resolveA("ok.test")
			// An open flow, stuck in the sniff.
			c, err := n.dial("203.0.113.5:80")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			switch how {
			case "Close":
				if err := n.gw.Close(); err != nil {
					t.Fatal(err)
				}
				if err := n.gw.Close(); err != nil {
					t.Fatalf("second Close: %v", err)
				}
			case "link ends":
				n.link.Close()
			}
			select {
			case <-n.gw.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("Done not closed")
			}
			if _, err := n.gw.DialGuest(t.Context(), 80); err == nil {
				t.Error("DialGuest after the end")
			}
			if how == "Close" { // QEMU's end sees the link closed (EOF, or a reset)
				n.link.SetReadDeadline(time.Now().Add(5 * time.Second))
				_, err := io.Copy(io.Discard, n.link)
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					t.Errorf("link still open after Close: %v", err)
				}
			}
		})
	}
	// The subtests' cleanups have run: the guest stacks, the DNS servers
	// and the gateways are gone.
	deadline := time.Now().Add(5 * time.Second)
	for {
		now := runtime.NumGoroutine()
		if now <= before {
			break
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before, %d after:\n%s", before, now, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestStartWaitsForTheSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "net.sock")
	go func() {
		time.Sleep(200 * time.Millisecond)
		ln, err := net.Listen("unix", sock)
		if err != nil {
			return
		}
		defer ln.Close()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(io.Discard, c)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	gw, err := Start(ctx, Config{Socket: sock, DNSUpstream: "127.0.0.1:53"})
	if err != nil {
		t.Fatal(err)
	}
	gw.Close()

	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := Start(ctx, Config{Socket: filepath.Join(t.TempDir(), "none.sock")}); err == nil {
		t.Fatal("Start without a socket succeeded")
	}
}

func TestLinkFraming(t *testing.T) {
	frame := func(size uint32, payload int) []byte {
		b := make([]byte, 4+payload)
		binary.BigEndian.PutUint32(b, size)
		return b
	}
	tests := []struct {
		name string
		data []byte
		ok   bool
	}{
		{"ordinary frames", append(frame(60, 60), frame(1514, 1514)...), true},
		{"empty frame", frame(0, 0), false},
		{"shorter than an Ethernet header", frame(13, 13), false},
		{"too large", frame(maxFrameBytes+1, 0), false},
		{"4 GiB", frame(0xffffffff, 0), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := net.Pipe()
			go func() {
				// One byte at a time: the length may arrive split.
				for i := range tt.data {
					if _, err := a.Write(tt.data[i : i+1]); err != nil {
						return
					}
				}
				a.Close()
			}()
			_, err := io.Copy(io.Discard, &qemuLink{Conn: b})
			b.Close()
			if (err == nil) != tt.ok {
				t.Errorf("err %v, want ok %v", err, tt.ok)
			}
		})
	}
}

// QEMU closing the link while frames it sent are still unread must end the
// gateway, not crash the server: the replies to those frames fail to be
// written while the switch still reads.
func TestLinkClosedWithFramesUnread(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "net.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		gw  *Gateway
		err error
	}
	started := make(chan result, 1)
	go func() {
		gw, err := Start(context.Background(), Config{Socket: sock, DNSUpstream: "127.0.0.1:53"})
		started <- result{gw, err}
	}()
	qemu, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	r := <-started
	if r.err != nil {
		t.Fatal(r.err)
	}
	// ARP requests for the gateway from the guest's MAC: each gets a reply.
	guestMAC, _ := net.ParseMAC(GuestMAC)
	arp := make([]byte, 42)
	copy(arp[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(arp[6:12], guestMAC)
	binary.BigEndian.PutUint16(arp[12:], 0x0806)
	copy(arp[14:22], []byte{0, 1, 8, 0, 6, 4, 0, 1})
	copy(arp[22:28], guestMAC)
	copy(arp[28:32], netip.MustParseAddr(GuestIP).AsSlice())
	copy(arp[38:42], netip.MustParseAddr(GatewayIP).AsSlice())
	var frames []byte
	for range 2000 {
		frames = binary.BigEndian.AppendUint32(frames, uint32(len(arp)))
		frames = append(frames, arp...)
	}
	qemu.Write(frames)
	qemu.Close()
	select {
	case <-r.gw.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway did not end with its link")
	}
}
