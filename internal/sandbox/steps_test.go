package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/timings"
)

func TestRunStepsRecordsTimings(t *testing.T) {
	var undone []string
	sleep := func(d time.Duration) func(context.Context) error {
		return func(context.Context) error { time.Sleep(d); return nil }
	}
	var tm timings.Timings
	err := runSteps(context.Background(), []step{
		{"first", sleep(3 * time.Millisecond), func() { undone = append(undone, "first") }},
		{"second", sleep(0), nil},
		{"fails", func(context.Context) error { return errors.New("boom") }, nil},
		{"never", sleep(0), nil},
	}, &tm)
	if err == nil || !strings.HasPrefix(err.Error(), "fails: boom") {
		t.Fatalf("err = %v", err)
	}
	if len(undone) != 1 {
		t.Fatalf("undone %v", undone)
	}
	if len(tm) != 3 || tm[0].Name != "first" || tm[0].MS < 3 || tm[2].Name != "fails" {
		t.Fatalf("timings %+v: want first (3 ms or more), second, fails", tm)
	}
	if err := runSteps(context.Background(), []step{{"untimed", sleep(0), nil}}, nil); err != nil {
		t.Fatal(err)
	}
}
