// Package timings records how long the named steps of one piece of work
// took, in the order they ran: a sandbox's create or wake, broken down so
// that where the time goes can be read off the operation that did it.
package timings

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// Step is one named step and how long it took, in milliseconds.
type Step struct {
	Name string
	MS   float64
}

// Timings is a sequence of steps in the order they ran. In JSON it is an
// object of step names to milliseconds, in that order: {"start vm": 41.2}.
type Timings []Step

// Add records that step name took d. A name already recorded gains d, so
// that a step run twice is one entry with its total.
func (t *Timings) Add(name string, d time.Duration) {
	t.addMS(name, float64(d)/float64(time.Millisecond))
}

func (t *Timings) addMS(name string, ms float64) {
	for i := range *t {
		if (*t)[i].Name == name {
			(*t)[i].MS += ms
			return
		}
	}
	*t = append(*t, Step{Name: name, MS: ms})
}

// Append records the steps of u after those of t, as Add does.
func (t *Timings) Append(u Timings) {
	for _, s := range u {
		t.addMS(s.Name, s.MS)
	}
}

// Total is the sum of the steps.
func (t Timings) Total() time.Duration {
	var ms float64
	for _, s := range t {
		ms += s.MS
	}
	return time.Duration(ms * float64(time.Millisecond))
}

// Get returns the milliseconds of step name, and whether it is there.
func (t Timings) Get(name string) (float64, bool) {
	for _, s := range t {
		if s.Name == name {
			return s.MS, true
		}
	}
	return 0, false
}

// Clock times consecutive steps: each Lap records the time since the last
// one (or since the clock started) under a name.
type Clock struct {
	T    Timings
	last time.Time
}

// Start returns a clock that counts from now.
func Start() *Clock { return StartAt(time.Now()) }

// StartAt returns a clock that counts from t: from when an operation was
// asked for, say, rather than from when its work began.
func StartAt(t time.Time) *Clock { return &Clock{last: t} }

// Lap records the time since the previous lap as step name.
func (c *Clock) Lap(name string) {
	now := time.Now()
	c.T.Add(name, now.Sub(c.last))
	c.last = now
}

// LapSteps records the time since the previous lap as steps, the
// breakdown of work that reported its own, and what they leave of it as
// step rest.
func (c *Clock) LapSteps(rest string, steps Timings) {
	now := time.Now()
	c.T.Append(steps)
	if d := now.Sub(c.last) - steps.Total(); d > 0 {
		c.T.Add(rest, d)
	}
	c.last = now
}

// MarshalJSON writes the steps as one object, in order, each value in
// milliseconds rounded to a hundredth.
func (t Timings) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, s := range t {
		if i > 0 {
			b.WriteByte(',')
		}
		name, err := json.Marshal(s.Name)
		if err != nil {
			return nil, err
		}
		b.Write(name)
		b.WriteByte(':')
		ms := math.Round(s.MS*100) / 100
		if math.IsNaN(ms) || math.IsInf(ms, 0) {
			ms = 0
		}
		v, _ := json.Marshal(ms)
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// UnmarshalJSON reads an object of step names to milliseconds, keeping
// the order of its keys. null is no steps.
func (t *Timings) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok == nil {
		*t = nil
		return nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("timings: want an object of step names to milliseconds, not %v", tok)
	}
	out := Timings{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		name, _ := tok.(string)
		var ms float64
		if err := dec.Decode(&ms); err != nil {
			return fmt.Errorf("timings: step %q: %w", name, err)
		}
		out = append(out, Step{Name: name, MS: ms})
	}
	if _, err := dec.Token(); err != nil {
		return err
	}
	*t = out
	return nil
}

// Split replaces step name, if it is there, by parts, each named
// "<name>: <part>", and what they leave of it as "<name>: other": a step
// whose own work reports a breakdown (the guest's init) is shown by it,
// and the steps still add up to the same total.
func (t *Timings) Split(name string, parts Timings) {
	i := -1
	for j, s := range *t {
		if s.Name == name {
			i = j
		}
	}
	if i < 0 || len(parts) == 0 {
		return
	}
	whole := (*t)[i].MS
	repl := make(Timings, 0, len(parts)+1)
	var sum float64
	for _, p := range parts {
		repl = append(repl, Step{Name: name + ": " + p.Name, MS: p.MS})
		sum += p.MS
	}
	if rest := whole - sum; rest > 0 {
		repl = append(repl, Step{Name: name + ": other", MS: rest})
	}
	*t = append((*t)[:i], append(repl, (*t)[i+1:]...)...)
}
