package gateway

import (
	"container/list"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// Bounds of a gateway's resolution cache.
const (
	cacheNames    = 4096            // names kept; the least recently resolved goes first
	cacheAddrs    = 32              // addresses kept per name; the soonest to expire go first
	cacheMinTTL   = 5 * time.Minute // an answer counts at least this long, whatever its TTL
	cacheMaxTTL   = 24 * time.Hour  // and at most this long
	resolveChains = 8               // CNAMEs followed from a queried name
)

// resolveCache remembers which IPv4 addresses the gateway itself resolved
// for which names: a name rule admits a flow only to those. It answers both
// ways, name to addresses (Flow.NameAddrs) and address to names
// (Flow.DstNames). Each address of a name expires on its own, at least
// cacheMinTTL after it was last seen, so that a guest that caches an answer
// for its TTL still finds it here.
type resolveCache struct {
	now func() time.Time

	mu     sync.Mutex                         // guards names, order and byAddr
	names  map[string]*cached                 // by name, lower case without a trailing dot
	order  *list.List                         // of names, least recently resolved first
	byAddr map[netip.Addr]map[string]struct{} // the names whose entries hold an address
}

type cached struct {
	addrs map[netip.Addr]time.Time // address -> when it expires
	elem  *list.Element            // in resolveCache.order
}

func newResolveCache(now func() time.Time) *resolveCache {
	return &resolveCache{
		now:    now,
		names:  make(map[string]*cached),
		order:  list.New(),
		byAddr: make(map[netip.Addr]map[string]struct{}),
	}
}

// add records that name resolved to addrs for ttl (clamped to
// [cacheMinTTL, cacheMaxTTL]). Addresses seen before for name are kept
// until they expire.
func (c *resolveCache) add(name string, addrs []netip.Addr, ttl time.Duration) {
	if name == "" || len(addrs) == 0 {
		return
	}
	ttl = min(max(ttl, cacheMinTTL), cacheMaxTTL)
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.names[name]
	if e == nil {
		e = &cached{addrs: make(map[netip.Addr]time.Time)}
		e.elem = c.order.PushBack(name)
		c.names[name] = e
	} else {
		c.order.MoveToBack(e.elem)
	}
	for _, a := range addrs {
		e.addrs[a] = now.Add(ttl)
		set := c.byAddr[a]
		if set == nil {
			set = make(map[string]struct{})
			c.byAddr[a] = set
		}
		set[name] = struct{}{}
	}
	c.prune(name, e, now)
	for len(c.names) > cacheNames {
		c.remove(c.order.Front().Value.(string))
	}
}

// prune drops the expired addresses of name's entry and, past cacheAddrs,
// those that expire first; an entry left empty goes.
func (c *resolveCache) prune(name string, e *cached, now time.Time) {
	for a, exp := range e.addrs {
		if !now.Before(exp) {
			c.drop(name, e, a)
		}
	}
	if len(e.addrs) > cacheAddrs {
		byExpiry := make([]netip.Addr, 0, len(e.addrs))
		for a := range e.addrs {
			byExpiry = append(byExpiry, a)
		}
		slices.SortFunc(byExpiry, func(x, y netip.Addr) int { return e.addrs[x].Compare(e.addrs[y]) })
		for _, a := range byExpiry[:len(byExpiry)-cacheAddrs] {
			c.drop(name, e, a)
		}
	}
	if len(e.addrs) == 0 {
		c.remove(name)
	}
}

func (c *resolveCache) drop(name string, e *cached, a netip.Addr) {
	delete(e.addrs, a)
	if set := c.byAddr[a]; set != nil {
		delete(set, name)
		if len(set) == 0 {
			delete(c.byAddr, a)
		}
	}
}

func (c *resolveCache) remove(name string) {
	e := c.names[name]
	if e == nil {
		return
	}
	for a := range e.addrs {
		c.drop(name, e, a)
	}
	c.order.Remove(e.elem)
	delete(c.names, name)
}

// lookup returns the unexpired addresses resolved for name, sorted.
func (c *resolveCache) lookup(name string) []netip.Addr {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.names[name]
	if e == nil {
		return nil
	}
	c.prune(name, e, now)
	var out []netip.Addr
	for a := range e.addrs {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// namesFor returns the names whose unexpired addresses include a, sorted.
func (c *resolveCache) namesFor(a netip.Addr) []string {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for name := range c.byAddr[a] {
		e := c.names[name]
		if exp, ok := e.addrs[a]; ok && now.Before(exp) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
