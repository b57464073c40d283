package apiclient

import (
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestEventStream(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []Event
		wantErr error // after the events
	}{
		{
			name: "one event",
			in:   "id: 1\nevent: stdout\ndata: {\"data\":\"aGk=\"}\n\n",
			want: []Event{{ID: 1, Name: "stdout", Data: []byte(`{"data":"aGk="}`)}},
		},
		{
			name: "multi-line data joins with newlines",
			in:   "data: a\ndata:b\ndata:  c\n\n",
			want: []Event{{Name: "message", Data: []byte("a\nb\n c")}},
		},
		{
			name: "comments and pings are skipped",
			in:   ": ping\n\nid: 7\n: between fields\nevent: exit\ndata: {}\n\n: ping\n",
			want: []Event{{ID: 7, Name: "exit", Data: []byte("{}")}},
		},
		{
			name: "the last id carries over to events without one",
			in:   "id: 3\ndata: x\n\ndata: y\n\nid: 9\ndata: z\n\n",
			want: []Event{{ID: 3, Name: "message", Data: []byte("x")}, {ID: 3, Name: "message", Data: []byte("y")}, {ID: 9, Name: "message", Data: []byte("z")}},
		},
		{
			name: "CRLF and lone CR end lines",
			in:   "id: 2\r\nevent: stderr\rdata: e\r\n\r\ndata: f\r\r",
			want: []Event{{ID: 2, Name: "stderr", Data: []byte("e")}, {ID: 2, Name: "message", Data: []byte("f")}},
		},
		{
			name: "an event without data is not dispatched, but its id counts",
			in:   "id: 5\nevent: start\n\ndata: x\n\n",
			want: []Event{{ID: 5, Name: "message", Data: []byte("x")}},
		},
		{
			name: "empty data field is an event with empty data",
			in:   "event: e\ndata\n\n",
			want: []Event{{Name: "e", Data: []byte{}}},
		},
		{
			name: "unknown fields and a bad id are ignored",
			in:   "id: 4\nretry: 10\nfoo: bar\nid: x1\ndata: d\n\n",
			want: []Event{{ID: 4, Name: "message", Data: []byte("d")}},
		},
		{
			name:    "a cut event is discarded",
			in:      "id: 1\ndata: a\n\nid: 2\ndata: b\n",
			want:    []Event{{ID: 1, Name: "message", Data: []byte("a")}},
			wantErr: io.ErrUnexpectedEOF,
		},
		{
			name:    "a cut line is discarded",
			in:      "data: a\n\ndata: b",
			want:    []Event{{Name: "message", Data: []byte("a")}},
			wantErr: io.ErrUnexpectedEOF,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// One byte per read, so that lines and line ends straddle reads.
			s := NewEventStream(io.NopCloser(&oneByteReader{strings.NewReader(tc.in)}))
			var got []Event
			var err error
			for {
				var ev Event
				if ev, err = s.Next(); err != nil {
					break
				}
				if len(ev.Data) == 0 {
					ev.Data = []byte{}
				}
				got = append(got, ev)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("events:\n got %+v\nwant %+v", got, tc.want)
			}
			wantErr := tc.wantErr
			if wantErr == nil {
				wantErr = io.EOF
			}
			if !errors.Is(err, wantErr) {
				t.Errorf("end: got %v, want %v", err, wantErr)
			}
		})
	}
}

type oneByteReader struct{ r io.Reader }

func (o *oneByteReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	return o.r.Read(p[:1])
}
