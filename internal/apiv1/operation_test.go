package apiv1

import "testing"

func TestOperationFailure(t *testing.T) {
	for _, c := range []struct {
		op   Operation
		want string
	}{
		{Operation{Kind: OpCreate, TargetID: "sbxa", Status: OpSucceeded}, ""},
		{Operation{Kind: OpCreate, TargetID: "sbxa", Status: "running"}, ""},
		{Operation{Kind: OpCreate, TargetID: "sbxa", Status: OpFailed, Error: &Status{Message: "no room"}}, "create sbxa failed: no room"},
		{Operation{Kind: OpDelete, TargetID: "sbxb", Status: OpFailed}, "delete sbxb failed: no reason given"},
	} {
		got := ""
		if err := c.op.Failure(); err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("%+v: failure %q, want %q", c.op, got, c.want)
		}
	}
}
