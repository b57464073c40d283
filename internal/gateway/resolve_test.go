package gateway

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeClock is a settable clock for the cache.
type fakeClock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestResolveCache(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	c := newResolveCache(clock.now)
	c.add("a.test", addrs("203.0.113.1", "203.0.113.2"), time.Second) // counts cacheMinTTL
	c.add("b.test", addrs("203.0.113.2"), time.Hour)
	if got := c.lookup("a.test"); !slices.Equal(got, addrs("203.0.113.1", "203.0.113.2")) {
		t.Errorf("a.test: %v", got)
	}
	if got := c.namesFor(netip.MustParseAddr("203.0.113.2")); !slices.Equal(got, []string{"a.test", "b.test"}) {
		t.Errorf("names for .2: %v", got)
	}

	// A later answer with other addresses adds to the earlier ones.
	clock.advance(cacheMinTTL - time.Minute)
	c.add("a.test", addrs("203.0.113.3"), time.Second)
	if got := c.lookup("a.test"); !slices.Equal(got, addrs("203.0.113.1", "203.0.113.2", "203.0.113.3")) {
		t.Errorf("a.test after a second answer: %v", got)
	}
	// Each address expires on its own.
	clock.advance(2 * time.Minute)
	if got := c.lookup("a.test"); !slices.Equal(got, addrs("203.0.113.3")) {
		t.Errorf("a.test after the first answer expired: %v", got)
	}
	if got := c.namesFor(netip.MustParseAddr("203.0.113.2")); !slices.Equal(got, []string{"b.test"}) {
		t.Errorf("names for .2 after a.test's expired: %v", got)
	}
	clock.advance(cacheMaxTTL)
	if got := c.lookup("b.test"); got != nil {
		t.Errorf("b.test after a day: %v", got)
	}
	if got := c.namesFor(netip.MustParseAddr("203.0.113.2")); got != nil {
		t.Errorf("names for .2 after all expired: %v", got)
	}
}

func TestResolveCacheBounds(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	c := newResolveCache(clock.now)
	for i := range cacheNames + 10 {
		c.add(fmt.Sprintf("n%d.test", i), addrs(fmt.Sprintf("198.51.%d.%d", i/256%256, i%256)), time.Hour)
	}
	if len(c.names) != cacheNames || len(c.byAddr) != cacheNames {
		t.Errorf("%d names, %d addresses kept; want %d", len(c.names), len(c.byAddr), cacheNames)
	}
	if c.lookup("n0.test") != nil || c.lookup(fmt.Sprintf("n%d.test", cacheNames+9)) == nil {
		t.Error("not the oldest names evicted")
	}

	var many []netip.Addr
	for i := range cacheAddrs + 5 {
		many = append(many, netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}))
	}
	c.add("many.test", many, time.Hour)
	if got := c.lookup("many.test"); len(got) != cacheAddrs {
		t.Errorf("%d addresses kept for one name, want %d", len(got), cacheAddrs)
	}
}
