package agent

import (
	"bytes"
	"testing"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// chunk is one append to a ring.
type chunk struct {
	t agentproto.MsgType
	n int
}

// model is everything appended to a ring, byte by byte.
type model struct {
	data  []byte
	types []agentproto.MsgType
}

func (m *model) append(r *outRing, c chunk) {
	p := make([]byte, c.n)
	for i := range p {
		p[i] = byte(len(m.data)+i) ^ byte((len(m.data)+i)>>8)
	}
	r.append(c.t, p)
	m.data = append(m.data, p...)
	for range p {
		m.types = append(m.types, c.t)
	}
}

// replay reads r from off to its end as a stream would, checking that no
// message mixes types or crosses the wrap, and returns the bytes and their
// types.
func replay(t *testing.T, r *outRing, off int64) ([]byte, []agentproto.MsgType) {
	t.Helper()
	var data []byte
	var types []agentproto.MsgType
	buf := make([]byte, agentproto.ChunkSize)
	for off < r.end {
		typ, n := r.read(off, buf)
		if n == 0 {
			t.Fatalf("read at %d (end %d) returned nothing", off, r.end)
		}
		if int(off%RingSize)+n > RingSize {
			t.Fatalf("read at %d crosses the wrap", off)
		}
		data = append(data, buf[:n]...)
		for range n {
			types = append(types, typ)
		}
		off += int64(n)
	}
	return data, types
}

func TestOutRing(t *testing.T) {
	const k = 1 << 10
	tests := []struct {
		name      string
		chunks    []chunk
		from      int64 // offset to replay from; -1 for the ring's start
		wantStart int64
		maxSize   int // bound on the memory held
	}{
		{name: "little output is small", chunks: []chunk{{agentproto.MsgStdout, 5}}, wantStart: 0, maxSize: 8 * k},
		{name: "types alternate", chunks: []chunk{{agentproto.MsgStdout, 100}, {agentproto.MsgStderr, 7}, {agentproto.MsgStdout, 1}, {agentproto.MsgStderr, 40 * k}}, wantStart: 0, maxSize: 200 * k},
		{name: "replay inside a chunk", chunks: []chunk{{agentproto.MsgStdout, 100}, {agentproto.MsgStderr, 100}}, from: 150, wantStart: 0, maxSize: 8 * k},
		{name: "exactly full", chunks: []chunk{{agentproto.MsgStdout, RingSize}}, wantStart: 0, maxSize: RingSize + 64*k},
		{name: "wrapped", chunks: []chunk{{agentproto.MsgStdout, RingSize - 10}, {agentproto.MsgStderr, 30}, {agentproto.MsgStdout, 1000}}, from: -1, wantStart: 1020, maxSize: RingSize + RingSize/8},
		{name: "stderr overwritten by stdout", chunks: []chunk{{agentproto.MsgStderr, RingSize}, {agentproto.MsgStdout, RingSize / 2}, {agentproto.MsgStderr, 3}}, from: -1, wantStart: RingSize/2 + 3, maxSize: RingSize + RingSize/8},
		{name: "many wraps", chunks: []chunk{{agentproto.MsgStdout, 3*RingSize + 77}, {agentproto.MsgStderr, 5}}, from: -1, wantStart: 2*RingSize + 82, maxSize: RingSize + RingSize/8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r outRing
			var m model
			for _, c := range tc.chunks {
				m.append(&r, c)
			}
			if r.end != int64(len(m.data)) || r.start() != tc.wantStart {
				t.Fatalf("start %d end %d, want %d %d", r.start(), r.end, tc.wantStart, len(m.data))
			}
			if r.size() > tc.maxSize {
				t.Fatalf("the ring holds %d bytes, want at most %d", r.size(), tc.maxSize)
			}
			from := tc.from
			if from < 0 {
				from = r.start()
			}
			data, types := replay(t, &r, from)
			if !bytes.Equal(data, m.data[from:]) {
				t.Fatalf("replay from %d differs from the output", from)
			}
			for i, typ := range types {
				if typ != m.types[int(from)+i] {
					t.Fatalf("byte %d replayed as type %d, was %d", int(from)+i, typ, m.types[int(from)+i])
				}
			}
		})
	}
}

func TestOutRingRelease(t *testing.T) {
	var r outRing
	r.append(agentproto.MsgStdout, make([]byte, 100<<10))
	r.release()
	if r.start() != r.end || r.end != 100<<10 || r.size() != 0 {
		t.Fatalf("after release: start %d end %d size %d", r.start(), r.end, r.size())
	}
}
