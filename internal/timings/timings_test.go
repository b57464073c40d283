package timings

import (
	"encoding/json"
	"testing"
	"time"
)

func TestAddSumsRepeatedSteps(t *testing.T) {
	var tm Timings
	tm.Add("start vm", 40*time.Millisecond)
	tm.Add("connect", 2*time.Millisecond)
	tm.Add("start vm", 1500*time.Microsecond)
	if len(tm) != 2 || tm[0].Name != "start vm" || tm[0].MS != 41.5 || tm[1].MS != 2 {
		t.Fatalf("timings = %+v", tm)
	}
	if got := tm.Total(); got != 43500*time.Microsecond {
		t.Fatalf("Total = %s, want 43.5ms", got)
	}
	if ms, ok := tm.Get("connect"); !ok || ms != 2 {
		t.Fatalf("Get(connect) = %v, %v", ms, ok)
	}
	if _, ok := tm.Get("nothing"); ok {
		t.Fatal("Get of a step never added found one")
	}
}

func TestAppendAddsEachStep(t *testing.T) {
	tm := Timings{{"start vm", 1}}
	tm.Append(Timings{{"mount root", 3}, {"start vm", 0.5}})
	if len(tm) != 2 || tm[0] != (Step{"start vm", 1.5}) || tm[1] != (Step{"mount root", 3}) {
		t.Fatalf("timings = %+v", tm)
	}
}

func TestJSONKeepsOrder(t *testing.T) {
	tm := Timings{{"z last-named first", 1.234}, {"a", 0.005}, {`quote " and \`, 10}}
	b, err := json.Marshal(struct {
		T Timings `json:"timings"`
	}{tm})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"timings":{"z last-named first":1.23,"a":0.01,"quote \" and \\":10}}`
	if string(b) != want {
		t.Fatalf("JSON = %s\nwant   %s", b, want)
	}
	var back struct {
		T Timings `json:"timings"`
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.T) != 3 || back.T[0].Name != "z last-named first" || back.T[2].Name != `quote " and \` || back.T[0].MS != 1.23 {
		t.Fatalf("round trip = %+v", back.T)
	}
}

func TestJSONEmptyAndBad(t *testing.T) {
	b, _ := json.Marshal(Timings(nil))
	if string(b) != "{}" {
		t.Fatalf("empty = %s", b)
	}
	var tm Timings
	if err := json.Unmarshal([]byte("null"), &tm); err != nil || tm != nil {
		t.Fatalf("null: %v, %+v", err, tm)
	}
	for _, bad := range []string{`[1,2]`, `{"a":"x"}`, `{"a":1`, `"s"`} {
		if err := json.Unmarshal([]byte(bad), &tm); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func TestClockLaps(t *testing.T) {
	c := Start()
	time.Sleep(2 * time.Millisecond)
	c.Lap("one")
	c.Lap("two")
	if len(c.T) != 2 || c.T[0].MS < 2 || c.T[1].MS < 0 || c.T[1].MS > c.T[0].MS+50 {
		t.Fatalf("laps = %+v", c.T)
	}
}

func TestSplitKeepsTotal(t *testing.T) {
	tm := Timings{{"start vm", 40}, {"init guest", 10}, {"check disk", 1}}
	tm.Split("init guest", Timings{{"mount root", 4}, {"grow fs", 3}})
	want := Timings{{"start vm", 40}, {"init guest: mount root", 4}, {"init guest: grow fs", 3}, {"init guest: other", 3}, {"check disk", 1}}
	if len(tm) != len(want) {
		t.Fatalf("split = %+v", tm)
	}
	for i := range want {
		if tm[i] != want[i] {
			t.Fatalf("step %d = %+v, want %+v", i, tm[i], want[i])
		}
	}
	tm.Split("absent", Timings{{"x", 1}})
	tm.Split("start vm", nil)
	if len(tm) != len(want) {
		t.Fatalf("a split of nothing changed the steps: %+v", tm)
	}
	// Parts that report more than the step took leave no negative rest.
	tm = Timings{{"init guest", 2}}
	tm.Split("init guest", Timings{{"a", 3}})
	if len(tm) != 1 || tm[0].Name != "init guest: a" {
		t.Fatalf("split = %+v", tm)
	}
}

func TestClockLapSteps(t *testing.T) {
	c := StartAt(time.Now().Add(-30 * time.Millisecond))
	c.Lap("queued")
	began := time.Now()
	time.Sleep(5 * time.Millisecond)
	c.LapSteps("create: other", Timings{{"start vm", 1}, {"init guest", 2}})
	took := time.Since(began)
	if len(c.T) != 4 || c.T[0].Name != "queued" || c.T[0].MS < 30 || c.T[1].Name != "start vm" || c.T[3].Name != "create: other" {
		t.Fatalf("laps = %+v", c.T)
	}
	if rest := c.T[3].MS; rest < 2 || rest > float64(took)/1e6 {
		t.Fatalf("rest %.2f ms, want between 2 and %s", rest, took)
	}
}
