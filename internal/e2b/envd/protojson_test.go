package envd

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
)

func mustParse(t *testing.T, s string) message {
	t.Helper()
	m, err := parseMessage("", []byte(s))
	if err != nil {
		t.Fatalf("parse %s: %v", s, err)
	}
	return m
}

func wantInvalid(t *testing.T, err error) {
	t.Helper()
	var re *rpcError
	if !errors.As(err, &re) || re.Code != codeInvalidArgument {
		t.Fatalf("err %v, want invalid_argument", err)
	}
}

func TestParseMessage(t *testing.T) {
	bad := []string{``, `[]`, `"x"`, `null`, `{`, `{"a":}`, `{"a":1}{}`, `{"a":1} x`,
		`{"exit_code":1,"exitCode":2}`, `{"a":1,"a":2}`}
	for _, s := range bad {
		_, err := parseMessage("", []byte(s))
		var re *rpcError
		if !errors.As(err, &re) || re.Code != codeInvalidArgument {
			t.Errorf("parse %s: %v, want invalid_argument", s, err)
		}
	}
	m := mustParse(t, `{"exit_code": 3, "watcherId": "w1", "gone": null, "unknownField": {"deep": [1]}}`)
	if n, err := m.integer("exitCode", -10, 10); n != 3 || err != nil {
		t.Errorf("snake_case field: %d %v", n, err)
	}
	if s, err := m.str("watcherId"); s != "w1" || err != nil {
		t.Errorf("camelCase field: %q %v", s, err)
	}
	if m.has("gone") {
		t.Error("a null field counts as set")
	}
	if s, err := m.str("gone"); s != "" || err != nil {
		t.Errorf("null string: %q %v", s, err)
	}
}

func TestFieldTypes(t *testing.T) {
	m := mustParse(t, `{"n":42,"s":"42","e":4.2e1,"f":1.5,"neg":-1,"big":4294967296,"str":"x","t":true,
		"b64":"aGk=","b64raw":"aGk","b64url":"-_8","list":["a","b"],"badList":["a",1],"map":{"K":"v"},
		"sig":"SIGNAL_SIGKILL","sigNum":15,"sigBad":"SIGNAL_SIGHUP"}`)
	for _, name := range []string{"n", "s", "e"} {
		if n, err := m.uint32(name); n != 42 || err != nil {
			t.Errorf("%s: %d %v, want 42", name, n, err)
		}
	}
	for _, name := range []string{"f", "neg", "big", "str", "t"} {
		_, err := m.uint32(name)
		wantInvalid(t, err)
	}
	for name, want := range map[string]string{"b64": "hi", "b64raw": "hi", "b64url": "\xfb\xff"} {
		if b, err := m.bytes(name); string(b) != want || err != nil {
			t.Errorf("%s: %q %v, want %q", name, b, err, want)
		}
	}
	if _, err := m.bytes("n"); err == nil {
		t.Error("a number read as bytes")
	}
	if l, err := m.strings("list"); !reflect.DeepEqual(l, []string{"a", "b"}) || err != nil {
		t.Errorf("list: %q %v", l, err)
	}
	_, err := m.strings("badList")
	wantInvalid(t, err)
	if mp, err := m.stringMap("map"); mp["K"] != "v" || err != nil {
		t.Errorf("map: %v %v", mp, err)
	}
	if v, err := m.enum("sig", signalValues); v != 9 || err != nil {
		t.Errorf("enum by name: %d %v", v, err)
	}
	if v, err := m.enum("sigNum", signalValues); v != 15 || err != nil {
		t.Errorf("enum by number: %d %v", v, err)
	}
	_, err = m.enum("sigBad", signalValues)
	wantInvalid(t, err)
	if b, err := m.boolean("t"); !b || err != nil {
		t.Errorf("bool: %v %v", b, err)
	}
	_, err = m.boolean("n")
	wantInvalid(t, err)
}

// The request shapes of both SDKs (research 9.4): Python 2.34 sends
// pretty-printed JSON with explicit defaults; JS sends compact JSON.
func TestReadStartRequest(t *testing.T) {
	python := "{\n  \"process\": {\n    \"cmd\": \"/bin/bash\",\n    \"args\": [\n      \"-l\",\n      \"-c\",\n      \"echo hi\"\n    ]\n  },\n  \"stdin\": false\n}"
	js := `{"process":{"cmd":"/bin/bash","args":["-i","-l"],"envs":{"TERM":"xterm-256color"},"cwd":"work"},"pty":{"size":{"cols":80,"rows":24}},"tag":"t1"}`
	sr, err := readStartRequest(mustParse(t, python))
	if err != nil || sr.Process.Cmd != "/bin/bash" || !reflect.DeepEqual(sr.Process.Args, []string{"-l", "-c", "echo hi"}) ||
		sr.Stdin == nil || *sr.Stdin || sr.PTY != nil || sr.Tag != nil {
		t.Fatalf("python shape: %+v %v", sr, err)
	}
	sr, err = readStartRequest(mustParse(t, js))
	if err != nil || sr.PTY == nil || *sr.PTY != (ptySize{Cols: 80, Rows: 24}) || sr.Tag == nil || *sr.Tag != "t1" ||
		sr.Stdin != nil || sr.Process.Cwd == nil || *sr.Process.Cwd != "work" || sr.Process.Envs["TERM"] != "xterm-256color" {
		t.Fatalf("js shape: %+v %v", sr, err)
	}
	cr, err := toCommand(sr, "", 1500*time.Millisecond)
	if err != nil || cr.Cwd != "/root/work" || !cr.Stdin || cr.PTY == nil || cr.PTY.Cols != 80 || cr.TimeoutS != 2 ||
		!reflect.DeepEqual(cr.Argv, []string{"/bin/bash", "-i", "-l"}) {
		t.Fatalf("command: %+v %v", cr, err)
	}
	for _, s := range []string{`{}`, `{"process":null}`, `{"process":{"cmd":1}}`, `{"process":{"cmd":"x","args":"y"}}`,
		`{"process":{"cmd":"x"},"pty":{"size":{"cols":-1}}}`, `{"process":{"cmd":"x"},"stdin":"yes"}`} {
		_, err := readStartRequest(mustParse(t, s))
		wantInvalid(t, err)
	}
	sr, _ = readStartRequest(mustParse(t, `{"process":{"cmd":""}}`))
	_, err = toCommand(sr, "", 0)
	wantInvalid(t, err)
	sr, _ = readStartRequest(mustParse(t, `{"process":{"cmd":"x"},"stdin":null}`))
	if cr, _ := toCommand(sr, "", 0); !cr.Stdin || cr.TimeoutS != 0 {
		t.Fatalf("stdin null (default true), no timeout: %+v", cr)
	}
}

func TestReadSelector(t *testing.T) {
	s, err := readSelector(mustParse(t, `{"process":{"pid":42}}`))
	if err != nil || s.ByTag || s.PID != 42 {
		t.Fatalf("pid: %+v %v", s, err)
	}
	s, err = readSelector(mustParse(t, `{"process":{"tag":"job"}}`))
	if err != nil || !s.ByTag || s.Tag != "job" {
		t.Fatalf("tag: %+v %v", s, err)
	}
	for _, in := range []string{`{}`, `{"process":{"pid":1,"tag":"x"}}`, `{"process":{"pid":"x"}}`} {
		_, err := readSelector(mustParse(t, in))
		wantInvalid(t, err)
	}
	var re *rpcError
	if _, err := readSelector(mustParse(t, `{"process":{}}`)); !errors.As(err, &re) || re.Code != codeUnimplemented {
		t.Fatalf("empty selector: %v", err)
	}
}

func TestResponsesAsJSON(t *testing.T) {
	size := int64String(1 << 40)
	target := "/etc/x"
	one := "exit status 1"
	tests := []struct {
		v    any
		want string
	}{
		{eventResponse{Event: processEvent{Start: &startEvent{PID: 7}}}, `{"event":{"start":{"pid":7}}}`},
		{eventResponse{Event: processEvent{Data: &dataEvent{Stdout: []byte("hi\n")}}}, `{"event":{"data":{"stdout":"aGkK"}}}`},
		{eventResponse{Event: processEvent{Keepalive: &struct{}{}}}, `{"event":{"keepalive":{}}}`},
		{eventResponse{Event: processEvent{End: &endEvent{Exited: true, Status: "exit status 0"}}}, `{"event":{"end":{"exited":true,"status":"exit status 0"}}}`},
		{eventResponse{Event: processEvent{End: &endEvent{ExitCode: 1, Exited: true, Status: one, Error: &one}}},
			`{"event":{"end":{"exitCode":1,"exited":true,"status":"exit status 1","error":"exit status 1"}}}`},
		{entryInfo{Name: "x", Type: fileTypeSymlink, Path: "/x", Size: &size, Mode: 0o644, SymlinkTarget: &target},
			`{"name":"x","type":"FILE_TYPE_SYMLINK","path":"/x","size":"1099511627776","mode":420,"symlinkTarget":"/etc/x"}`},
		{watchResponse{Start: &struct{}{}}, `{"start":{}}`},
		{listResponse{Processes: []processInfo{{Config: processConfig{Cmd: "ls"}, PID: 3}}}, `{"processes":[{"config":{"cmd":"ls"},"pid":3}]}`},
	}
	for _, tt := range tests {
		b, err := json.Marshal(tt.v)
		if err != nil || string(b) != tt.want {
			t.Errorf("got %s %v, want %s", b, err, tt.want)
		}
	}
}

func TestTimestamp(t *testing.T) {
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))
	for ns, want := range map[int]string{
		0: "2026-01-02T02:04:05Z", 5e8: "2026-01-02T02:04:05.500Z", 123456000: "2026-01-02T02:04:05.123456Z", 1: "2026-01-02T02:04:05.000000001Z",
	} {
		if got := timestamp(base.Add(time.Duration(ns))); got != want {
			t.Errorf("%d ns: %s, want %s", ns, got, want)
		}
	}
}

func TestToEnd(t *testing.T) {
	kill, odd := "KILL", "NOPE"
	tests := []struct {
		x    apiv1.ExitEvent
		want string
	}{
		{apiv1.ExitEvent{ExitCode: 0}, `{"exited":true,"status":"exit status 0"}`},
		{apiv1.ExitEvent{ExitCode: 3}, `{"exitCode":3,"exited":true,"status":"exit status 3","error":"exit status 3"}`},
		{apiv1.ExitEvent{ExitCode: 137, Signal: &kill}, `{"exitCode":-1,"status":"signal: killed","error":"signal: killed"}`},
		{apiv1.ExitEvent{ExitCode: 128, Signal: &odd}, `{"exitCode":-1,"status":"signal: nope","error":"signal: nope"}`},
		{apiv1.ExitEvent{ExitCode: -1}, `{"exitCode":-1,"status":"unknown","error":"the process was lost: its exit status is unknown"}`},
	}
	for _, tt := range tests {
		b, _ := json.Marshal(toEnd(tt.x))
		if string(b) != tt.want {
			t.Errorf("%+v: %s, want %s", tt.x, b, tt.want)
		}
	}
}

func TestResolve(t *testing.T) {
	tests := []struct{ path, user, want string }{
		{"", "", "/root"},
		{"a.txt", "", "/root/a.txt"},
		{"a.txt", "user", "/home/user/a.txt"},
		{"~/x/../y", "user", "/home/user/y"},
		{"~", "root", "/root"},
		{"/tmp/x/", "user", "/tmp/x"},
		{"/a/../../b", "", "/b"},
	}
	for _, tt := range tests {
		if got, err := resolve(tt.path, tt.user); got != tt.want || err != nil {
			t.Errorf("resolve(%q, %q) = %q %v, want %q", tt.path, tt.user, got, err, tt.want)
		}
	}
	_, err := resolve("~bob/x", "")
	wantInvalid(t, err)
	if _, err := checkUser("bad:user"); err == nil {
		t.Error("a user name with a colon passed")
	}
	if _, err := checkUser(strings.Repeat("u", 33)); err == nil {
		t.Error("a 33-byte user name passed")
	}
}

// FuzzParseMessage checks that no request body panics the reader.
func FuzzParseMessage(f *testing.F) {
	f.Add([]byte(`{"process":{"cmd":"/bin/bash","args":["-c","x"],"envs":{"A":"b"}},"pty":{"size":{"cols":1,"rows":2}},"tag":"t","stdin":true}`))
	f.Add([]byte(`{"process":{"pid":4294967295}}`))
	f.Add([]byte(`{"a":{"a":{"a":null}}}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := parseMessage("", in)
		if err != nil {
			return
		}
		readStartRequest(m)
		readSelector(m)
		readWatchRequest(m)
		m.enum("signal", signalValues)
		if im, _, err := m.sub("input"); err == nil {
			im.bytes("stdin")
		}
	})
}
