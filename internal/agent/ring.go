package agent

import "github.com/airlockhq/airlock/internal/agentproto"

// RingSize is how many of the latest bytes of a process's output sequence
// the agent keeps for replay. It is allocated as output arrives, so a
// process with little output costs little memory. About half of it holds
// what a stream may have in flight (a yamux window), so that a host that
// lost its session can resume from what it received; the rest holds output
// read ahead of the stream.
const RingSize = 2 << 20

// outRing holds the tail of a process's output sequence: the payloads of
// its MsgStdout and MsgStderr messages in order, each byte with its type.
// The byte at offset o sits at data[o%RingSize]. It is not safe for
// concurrent use; the process's mutex guards it.
type outRing struct {
	data  []byte   // grows to RingSize while the first RingSize bytes arrive
	isErr []uint64 // one bit per byte of data: set for stderr; nil until stderr output
	end   int64    // offset just past the last byte appended
	floor int64    // offset below which output was released early (see release)
}

// start is the offset of the oldest byte still held.
func (r *outRing) start() int64 {
	return max(r.floor, r.end-RingSize, 0)
}

// size is the memory the ring holds, in bytes.
func (r *outRing) size() int {
	return cap(r.data) + 8*cap(r.isErr)
}

// append adds p, output of type t, overwriting the oldest bytes once the
// ring is full.
func (r *outRing) append(t agentproto.MsgType, p []byte) {
	for len(p) > 0 {
		i := int(r.end % RingSize)
		if need := min(RingSize, i+len(p)); need > len(r.data) {
			r.grow(need)
		}
		n := copy(r.data[i:], p)
		r.setType(i, n, t == agentproto.MsgStderr)
		r.end += int64(n)
		p = p[n:]
	}
}

// grow extends data to n bytes, at least doubling its capacity so that
// appends stay cheap, and never beyond RingSize.
func (r *outRing) grow(n int) {
	if n <= cap(r.data) {
		r.data = r.data[:n]
		return
	}
	d := make([]byte, n, min(RingSize, max(n, 2*cap(r.data), 4<<10)))
	copy(d, r.data)
	r.data = d
}

// setType records the type of the n bytes at index i.
func (r *outRing) setType(i, n int, isErr bool) {
	if !isErr && r.isErr == nil {
		return // no stderr yet: every byte is stdout
	}
	if isErr {
		if words := (len(r.data) + 63) / 64; words > len(r.isErr) {
			w := make([]uint64, words, min(RingSize/64, max(words, 2*cap(r.isErr))))
			copy(w, r.isErr)
			r.isErr = w
		}
	}
	for j := i; j < i+n; j++ {
		w, bit := j/64, uint64(1)<<(j%64)
		if w >= len(r.isErr) {
			return // never set: already stdout
		}
		if isErr {
			r.isErr[w] |= bit
		} else {
			r.isErr[w] &^= bit
		}
	}
}

func (r *outRing) errAt(i int) bool {
	w := i / 64
	return w < len(r.isErr) && r.isErr[w]&(1<<(i%64)) != 0
}

// read copies into buf the bytes from offset off, which must lie between
// start and end, up to the first change of type and at most len(buf). It
// returns their type and count; the count is 0 only at the end.
func (r *outRing) read(off int64, buf []byte) (agentproto.MsgType, int) {
	i := int(off % RingSize)
	n := int(min(int64(len(buf)), r.end-off, int64(RingSize-i)))
	if n <= 0 {
		return agentproto.MsgStdout, 0
	}
	isErr := r.errAt(i)
	if r.isErr != nil {
		for k := 1; k < n; k++ {
			if r.errAt(i+k) != isErr {
				n = k
				break
			}
		}
	}
	copy(buf, r.data[i:i+n])
	if isErr {
		return agentproto.MsgStderr, n
	}
	return agentproto.MsgStdout, n
}

// release frees the memory of the bytes held; later reads start at end.
func (r *outRing) release() {
	r.floor = r.end
	r.data, r.isErr = nil, nil
}
