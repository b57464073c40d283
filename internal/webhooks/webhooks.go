// Package webhooks POSTs a key's events (internal/events' outbox) to the
// URLs it registers: signed, in order per webhook, at least once, retried
// with backoff for a day, every attempt recorded. The outbox is the
// queue: a receiver that is down costs a row's cursor, never memory. A
// webhook's address is checked when it is made and again on every
// connection, against the ranges egress always denies; the operator opens
// its own receivers' with airlock serve --webhook-private.
package webhooks

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/fields"
	"github.com/airlockhq/airlock/internal/gateway/policy"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/secrets"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/tenancy"
)

// Bounds of what a key may register.
const (
	MaxPerKey    = 10
	MaxURL       = 2048
	MaxSecret    = 256
	MinSecret    = 16
	MaxDelivered = 100 // deliveries listed at most
)

// Config configures a Service.
type Config struct {
	// Store holds the webhooks, their cursors and deliveries, and the events.
	Store *store.Store
	// Secrets seals the signing secrets at rest.
	Secrets *secrets.Box
	// Private are the ranges, otherwise always denied (loopback, private,
	// link-local…), where webhooks may point (--webhook-private).
	Private []netip.Prefix
	// Host are the host's own addresses: always denied unless in Private.
	Host []netip.Addr
	// Log receives the failures of the background work.
	Log *slog.Logger
	// Timeout bounds one attempt. Default 10 s.
	Timeout time.Duration
	// RetryFor is how long an event is retried before it is given up.
	// Default 24 h.
	RetryFor time.Duration
	// Every is how often Run looks for webhooks with work. Default 1 s.
	Every time.Duration
	// Parallel bounds the attempts in flight at once. Default 8.
	Parallel int
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Service keeps the webhooks and delivers to them.
type Service struct {
	cfg    Config
	st     *store.Store
	client *http.Client
}

// New returns the webhooks service of cfg.
func New(cfg Config) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.RetryFor <= 0 {
		cfg.RetryFor = 24 * time.Hour
	}
	if cfg.Every <= 0 {
		cfg.Every = time.Second
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 8
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Service{cfg: cfg, st: cfg.Store}
	dialer := &net.Dialer{Timeout: cfg.Timeout, Control: s.controlDial}
	s.client = &http.Client{
		Timeout: cfg.Timeout,
		Transport: &http.Transport{
			Proxy:                 nil, // never the environment's proxy: the address checked is the one reached
			DialContext:           dialer.DialContext,
			TLSHandshakeTimeout:   cfg.Timeout,
			ResponseHeaderTimeout: cfg.Timeout,
			MaxIdleConnsPerHost:   2,
		},
		// A redirect is an answer, and not a 2xx: the event is retried.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return s
}

// ParsePrivate reads --webhook-private: comma-separated CIDRs or
// addresses, IPv4 or IPv6, none wider than a /8 (IPv6: /32).
func ParsePrivate(list string) ([]netip.Prefix, error) {
	prefixes, err := policy.ParsePrefixes(list)
	if err != nil {
		return nil, err
	}
	for _, p := range prefixes {
		if min := map[bool]int{true: 8, false: 32}[p.Addr().Is4()]; p.Bits() < min {
			return nil, fmt.Errorf("%q is wider than a /%d: open the receivers' ranges only: %w", p, min, errdefs.ErrInvalid)
		}
	}
	return prefixes, nil
}

// checkAddr refuses an address egress always denies (loopback, private,
// link-local and metadata, multicast, the host's own, IPv6) unless the
// operator opened it.
func (s *Service) checkAddr(a netip.Addr) error {
	a = a.Unmap()
	for _, p := range s.cfg.Private {
		if p.Contains(a) {
			return nil
		}
	}
	if denied, why := policy.AlwaysDenied(a, policy.Bounds{Host: s.cfg.Host}); denied {
		return fmt.Errorf("webhook address %s is in a range always denied (%s): the operator opens its own receivers' with airlock serve --webhook-private CIDR: %w", a, why, errdefs.ErrPermission)
	}
	return nil
}

// controlDial checks each address a delivery connects to, after name
// resolution: a name that resolves to a denied address is refused there.
func (s *Service) controlDial(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("webhook address %q: %w", address, err)
	}
	return s.checkAddr(ap.Addr())
}

// checkURL refuses a URL that is not absolute http(s) to a host, or that
// names an address always denied.
func (s *Service) checkURL(raw string) error {
	if len(raw) > MaxURL {
		return fmt.Errorf("url is %d bytes: use at most %d: %w", len(raw), MaxURL, errdefs.ErrInvalid)
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		return fmt.Errorf("url %q is not an absolute http or https URL: %w", fields.Truncate(raw, 80), errdefs.ErrInvalid)
	}
	if u.User != nil {
		return fmt.Errorf("url carries credentials: the receiver checks Airlock-Signature instead: %w", errdefs.ErrInvalid)
	}
	if u.Fragment != "" || strings.ContainsAny(raw, " \x00\r\n\t") {
		return fmt.Errorf("url %q has a fragment or a blank: %w", fields.Truncate(raw, 80), errdefs.ErrInvalid)
	}
	if a, err := netip.ParseAddr(strings.Trim(u.Hostname(), "[]")); err == nil {
		return s.checkAddr(a)
	}
	return nil
}

// Create registers a webhook of p's: the events from now on (of every
// key's sandboxes for an admin key) that types selects go to req.URL.
// The secret, if none is given, is made and shown in this answer only.
func (s *Service) Create(ctx context.Context, p tenancy.Principal, req apiv1.CreateWebhook) (apiv1.WebhookCreated, error) {
	if err := s.checkURL(req.URL); err != nil {
		return apiv1.WebhookCreated{}, err
	}
	if len(req.Types) > 20 {
		return apiv1.WebhookCreated{}, fmt.Errorf("%d types: use at most 20: %w", len(req.Types), errdefs.ErrInvalid)
	}
	for _, t := range req.Types {
		if !apiv1.ValidEventType(t) {
			return apiv1.WebhookCreated{}, fmt.Errorf("unknown event type %q: use one of %s, or a kind followed by .* (sandbox.*): %w",
				fields.Truncate(t, 40), strings.Join(apiv1.EventTypes, ", "), errdefs.ErrInvalid)
		}
	}
	secret, made := req.Secret, false
	switch {
	case secret == "":
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return apiv1.WebhookCreated{}, err
		}
		secret, made = "whsec_"+hex.EncodeToString(b), true
	case len(secret) < MinSecret || len(secret) > MaxSecret || strings.ContainsRune(secret, 0):
		return apiv1.WebhookCreated{}, fmt.Errorf("secret must be %d to %d bytes without NUL, or left out for one to be made: %w", MinSecret, MaxSecret, errdefs.ErrInvalid)
	}
	have, err := s.st.ListWebhooks(ctx, p.KeyID, MaxPerKey+1)
	if err != nil {
		return apiv1.WebhookCreated{}, err
	}
	if len(have) >= MaxPerKey {
		return apiv1.WebhookCreated{}, fmt.Errorf("this key has %d webhooks, the most it may have: delete one first: %w", len(have), errdefs.ErrExhausted)
	}
	after, err := s.st.LastEventSeq(ctx)
	if err != nil {
		return apiv1.WebhookCreated{}, err
	}
	id := ids.New("whk")
	sealed, err := s.cfg.Secrets.Seal(p.KeyID, "webhook:"+id, []byte(secret))
	if err != nil {
		return apiv1.WebhookCreated{}, fmt.Errorf("seal the webhook's secret: %w", err)
	}
	w := store.Webhook{ID: id, Owner: p.KeyID, AllOwners: p.Admin(), URL: req.URL, Types: req.Types, Secret: sealed,
		CreatedAt: s.cfg.Now().UTC(), AfterSeq: after}
	if err := s.st.InsertWebhook(ctx, w); err != nil {
		return apiv1.WebhookCreated{}, err
	}
	out := apiv1.WebhookCreated{Webhook: view(w)}
	if made {
		out.Secret = secret
	}
	return out, nil
}

func view(w store.Webhook) apiv1.Webhook {
	types := w.Types
	if types == nil {
		types = []string{}
	}
	return apiv1.Webhook{ID: w.ID, URL: w.URL, Types: types, CreatedAt: w.CreatedAt}
}

// get returns p's webhook id; another key's answers as one unknown.
func (s *Service) get(ctx context.Context, p tenancy.Principal, id string) (store.Webhook, error) {
	if err := fields.ID("webhook", "whk", id); err != nil {
		return store.Webhook{}, err
	}
	w, err := s.st.GetWebhook(ctx, id)
	if err == nil && !p.Owns(w.Owner) {
		err = fmt.Errorf("webhook %s: %w", id, errdefs.ErrNotFound)
	}
	return w, err
}

// List returns p's webhooks (an admin key's: everyone's).
func (s *Service) List(ctx context.Context, p tenancy.Principal) (apiv1.List[apiv1.Webhook], error) {
	owner := p.KeyID
	if p.Admin() {
		owner = ""
	}
	ws, err := s.st.ListWebhooks(ctx, owner, fields.MaxLimit)
	if err != nil {
		return apiv1.List[apiv1.Webhook]{}, err
	}
	out := apiv1.List[apiv1.Webhook]{Items: make([]apiv1.Webhook, len(ws))}
	for i, w := range ws {
		out.Items[i] = view(w)
	}
	return out, nil
}

// Delete removes webhook id of p's and the record of its deliveries.
func (s *Service) Delete(ctx context.Context, p tenancy.Principal, id string) error {
	if _, err := s.get(ctx, p, id); err != nil {
		return err
	}
	return s.st.DeleteWebhook(ctx, id)
}

// Deliveries returns the newest attempts at deliveries to webhook id.
func (s *Service) Deliveries(ctx context.Context, p tenancy.Principal, id string) (apiv1.List[apiv1.Delivery], error) {
	if _, err := s.get(ctx, p, id); err != nil {
		return apiv1.List[apiv1.Delivery]{}, err
	}
	ds, err := s.st.ListDeliveries(ctx, id, MaxDelivered)
	if err != nil {
		return apiv1.List[apiv1.Delivery]{}, err
	}
	out := apiv1.List[apiv1.Delivery]{Items: make([]apiv1.Delivery, len(ds))}
	for i, d := range ds {
		out.Items[i] = apiv1.Delivery{ID: d.ID, EventID: d.EventID, EventType: d.EventType, Attempt: d.Attempt,
			Status: d.Status, Error: d.Error, DurationMS: d.DurationMS, CreatedAt: d.CreatedAt}
	}
	return out, nil
}

// Run delivers until ctx ends: every Config.Every, and at once when this
// server writes events, each webhook with work due gets its next event.
func (s *Service) Run(ctx context.Context) {
	tick := time.NewTicker(s.cfg.Every)
	defer tick.Stop()
	slots := make(chan struct{}, s.cfg.Parallel)
	var pruned time.Time
	for {
		written := s.st.EventsWritten()
		s.dispatch(ctx, slots)
		if time.Since(pruned) > time.Hour {
			pruned = time.Now()
			if err := s.st.PruneDeliveries(ctx, s.cfg.Now().Add(-7*24*time.Hour)); err != nil && ctx.Err() == nil {
				s.cfg.Log.Warn("prune webhook deliveries", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			// Wait for the attempts in flight: their leases are let go.
			for range cap(slots) {
				slots <- struct{}{}
			}
			return
		case <-tick.C:
		case <-written:
		}
	}
}

// dispatch starts an attempt for each webhook due that this server
// leases, as slots allow.
func (s *Service) dispatch(ctx context.Context, slots chan struct{}) {
	now := s.cfg.Now()
	due, err := s.st.DueWebhooks(ctx, now, 100)
	if err != nil {
		if ctx.Err() == nil {
			s.cfg.Log.Warn("list webhooks due", "err", err)
		}
		return
	}
	for _, w := range due {
		// Reading is cheap, writing is not: a webhook with nothing to
		// send is not leased.
		if next, err := s.st.ListEvents(ctx, eventsOf(w, 1)); err != nil || len(next) == 0 {
			if err != nil && ctx.Err() == nil {
				s.cfg.Log.Warn("read a webhook's next event", "webhook", w.ID, "err", err)
			}
			continue
		}
		select {
		case slots <- struct{}{}:
		default:
			return // all busy: the rest wait for the next pass
		}
		// The lease outlasts an attempt: a server that dies holding it
		// lets it lapse, and another takes the webhook up.
		ok, err := s.st.LeaseWebhook(ctx, w.ID, now, now.Add(3*s.cfg.Timeout))
		if err != nil || !ok {
			<-slots
			if err != nil && ctx.Err() == nil {
				s.cfg.Log.Warn("lease webhook", "webhook", w.ID, "err", err)
			}
			continue
		}
		go func() {
			defer func() { <-slots }()
			if err := s.drain(context.WithoutCancel(ctx), w.ID); err != nil {
				s.cfg.Log.Warn("webhook delivery", "webhook", w.ID, "err", err)
			}
		}()
	}
}

// drainMax bounds the events one lease of a webhook sends in a row.
const drainMax = 100

// drain delivers webhook id's events in order while they are delivered,
// drainMax at most, leased (the caller took the first lease). Each
// attempt is settled, which lets the lease go; the next takes it again.
func (s *Service) drain(ctx context.Context, id string) error {
	for i := 0; ; i++ {
		// Read under the lease: another server may have moved the cursor.
		w, err := s.st.GetWebhook(ctx, id)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil // deleted meanwhile
		}
		if err != nil {
			return err
		}
		delivered, err := s.Attempt(ctx, w)
		if err != nil || !delivered || i+1 >= drainMax {
			return err
		}
		now := s.cfg.Now()
		if ok, err := s.st.LeaseWebhook(ctx, id, now, now.Add(3*s.cfg.Timeout)); err != nil || !ok {
			return err
		}
	}
}

// Attempt delivers w's next event, leased, once, records the outcome
// and lets the lease go: the cursor moves past the event on a 2xx, or
// when it has failed for Config.RetryFor; otherwise it is tried again
// after a backoff. It reports whether the event was delivered.
func (s *Service) Attempt(ctx context.Context, w store.Webhook) (bool, error) {
	evs, err := s.st.ListEvents(ctx, eventsOf(w, 1))
	if err != nil || len(evs) == 0 {
		if serr := s.st.SettleWebhook(ctx, w, store.Delivery{}); serr != nil && !errors.Is(serr, errdefs.ErrNotFound) {
			err = errors.Join(err, serr)
		}
		return false, err
	}
	ev := evs[0]
	secret, err := s.cfg.Secrets.Open(w.Owner, "webhook:"+w.ID, w.Secret)
	if err != nil {
		return false, fmt.Errorf("open the secret of webhook %s: %w", w.ID, err)
	}
	body, err := json.Marshal(apiv1.Event{ID: ev.ID, Seq: ev.Seq, Time: ev.Time, Type: ev.Type, SandboxID: ev.SandboxID, Data: ev.Data})
	if err != nil {
		return false, err
	}
	start := s.cfg.Now()
	status, perr := s.post(ctx, w.URL, secret, ev.ID, body, start)
	d := store.Delivery{ID: ids.New("dlv"), EventID: ev.ID, EventType: ev.Type, Attempt: w.Attempts + 1, Status: status,
		DurationMS: time.Since(start).Milliseconds(), CreatedAt: start.UTC()}
	now := s.cfg.Now()
	switch {
	case perr == nil:
		w.AfterSeq, w.Attempts, w.FailingSince, w.NextAt = ev.Seq, 0, time.Time{}, time.Time{}
	default:
		d.Error = perr.Error()
		if w.FailingSince.IsZero() {
			w.FailingSince = start
		}
		if now.Sub(w.FailingSince) >= s.cfg.RetryFor {
			d.Error += fmt.Sprintf("; given up after %d attempts over %s", w.Attempts+1, s.cfg.RetryFor)
			w.AfterSeq, w.Attempts, w.FailingSince, w.NextAt = ev.Seq, 0, time.Time{}, time.Time{}
		} else {
			w.Attempts++
			w.NextAt = now.Add(Backoff(w.Attempts))
		}
	}
	if err := s.st.SettleWebhook(ctx, w, d); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return false, err
	}
	return perr == nil, nil
}

// eventsOf selects the events w is owed, after its cursor.
func eventsOf(w store.Webhook, limit int) store.EventFilter {
	f := store.EventFilter{AfterSeq: w.AfterSeq, Types: w.Types, Limit: limit}
	if !w.AllOwners {
		f.Owner = w.Owner
	}
	return f
}

// Backoff is the wait after the nth failed attempt at an event: 2 s,
// doubling, at most 10 minutes.
func Backoff(n int) time.Duration {
	d := 2 * time.Second
	for i := 1; i < n && d < 10*time.Minute; i++ {
		d *= 2
	}
	return min(d, 10*time.Minute)
}

// Sign is the Airlock-Signature header of body sent at t under secret:
// "t=UNIX,v1=HEX", HMAC-SHA256 of "UNIX.body".
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts + "."))
	m.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(m.Sum(nil))
}

// post sends one event and says how the receiver answered: nil for a
// 2xx.
func (s *Service) post(ctx context.Context, u string, secret []byte, eventID string, body []byte, t time.Time) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "airlock-webhooks")
	req.Header.Set("Airlock-Event-Id", eventID)
	req.Header.Set("Airlock-Signature", Sign(secret, t, body))
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // the answer's body is not kept
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, fmt.Errorf("the receiver answered %s", resp.Status)
	}
	return resp.StatusCode, nil
}
