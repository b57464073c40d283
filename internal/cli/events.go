package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

const eventsAbout = `Prints the changes of state of your sandboxes and builds (an admin key:
everyone's), oldest first, one line each: seq, time, type, sandbox and
details. With -f it then waits for new ones and prints them as they come,
until interrupted. Events are kept 7 days.

  airlock events
  airlock events -f --type 'sandbox.*'
  airlock events --after 1234 --json`

// eventsPage is how many events each call asks for; followPollS how long
// each wait of -f lasts.
const (
	eventsPage  = 500
	followPollS = 30
)

func runEvents(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("events", "airlock events [FLAGS]", eventsAbout, env)
	sf := addServerFlags(fs)
	follow := fs.Bool("f", false, "keep waiting for new events and print them as they come")
	after := fs.Int64("after", 0, "print the events after this `seq`")
	types := fs.String("type", "", "print only these `types`, comma-separated; kind.* for a whole kind (sandbox.*)")
	asJSON := fs.Bool("json", false, "print each event as a line of JSON")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return fmt.Errorf("events takes no arguments, got %q: see `airlock events -h`: %w", pos[0], errdefs.ErrInvalid)
	}
	if *after < 0 {
		return fmt.Errorf("events: --after %d is negative: %w", *after, errdefs.ErrInvalid)
	}
	q := apiclient.EventQuery{AfterSeq: *after, Limit: eventsPage}
	if *types != "" {
		q.Types = strings.Split(*types, ",")
		for _, t := range q.Types {
			if !apiv1.ValidEventType(t) {
				return fmt.Errorf("events: unknown type %q: use one of %s, or a kind followed by .*: %w", t, strings.Join(apiv1.EventTypes, ", "), errdefs.ErrInvalid)
			}
		}
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	for {
		page, err := c.ListEvents(ctx, q)
		if err != nil {
			if *follow && ctx.Err() != nil {
				return nil // interrupted: the end of a follow
			}
			return err
		}
		for _, ev := range page.Items {
			if err := printEvent(env.Stdout, ev, *asJSON); err != nil {
				return err
			}
		}
		q.AfterSeq = page.LastSeq
		if len(page.Items) < q.Limit {
			if !*follow {
				return nil
			}
			q.WaitS = followPollS
		} else {
			q.WaitS = 0
		}
	}
}

func printEvent(w io.Writer, ev apiv1.Event, asJSON bool) error {
	if asJSON {
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	sbx := ev.SandboxID
	if sbx == "" {
		sbx = "-"
	}
	_, err := fmt.Fprintf(w, "%d  %s  %-17s  %s  %s\n", ev.Seq, formatTime(&ev.Time), ev.Type, sbx, ev.Data)
	return err
}
