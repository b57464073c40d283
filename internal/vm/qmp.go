package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// QMP is a client of QEMU's machine protocol: JSON lines over a unix
// socket. Commands are serialised; asynchronous events are skipped.
type QMP struct {
	conn net.Conn

	mu   sync.Mutex // serialises commands
	resp chan qmpMessage
	err  error // set when the reader stops; read after resp is closed
}

type qmpMessage struct {
	Event  string          `json:"event"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	QMP json.RawMessage `json:"QMP"`
}

// DialQMP connects to a QMP socket, retrying until QEMU has created it or
// ctx ends, and negotiates capabilities.
func DialQMP(ctx context.Context, path string) (*QMP, error) {
	var conn net.Conn
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			conn = c
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect to QMP: %w", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	q := &QMP{conn: conn, resp: make(chan qmpMessage, 1)}
	r := bufio.NewReader(conn)
	// The greeting comes first.
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := r.ReadBytes('\n')
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("read QMP greeting: %w", err)
	}
	conn.SetReadDeadline(time.Time{})
	var greet qmpMessage
	if err := json.Unmarshal(line, &greet); err != nil || greet.QMP == nil {
		conn.Close()
		return nil, fmt.Errorf("unexpected QMP greeting %q", line)
	}
	go q.read(r)
	if err := q.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

// read delivers replies until the connection ends.
func (q *QMP) read(r *bufio.Reader) {
	defer close(q.resp)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			q.err = err
			return
		}
		var m qmpMessage
		if err := json.Unmarshal(line, &m); err != nil {
			continue
		}
		if m.Event != "" {
			continue
		}
		q.resp <- m
	}
}

// Execute runs a QMP command and decodes its return value into out (which
// may be nil).
func (q *QMP) Execute(ctx context.Context, cmd string, args any, out any) error {
	return q.executeFile(ctx, cmd, args, nil, out)
}

// executeFile is Execute; a non-nil f is passed to QEMU with the command
// (SCM_RIGHTS), as getfd expects.
func (q *QMP) executeFile(ctx context.Context, cmd string, args any, f *os.File, out any) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if err := q.write(append(b, '\n'), f); err != nil {
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	select {
	case m, ok := <-q.resp:
		if !ok {
			return fmt.Errorf("qmp %s: connection closed: %w", cmd, errors.Join(q.err, net.ErrClosed))
		}
		if m.Error != nil {
			return fmt.Errorf("qmp %s: %s: %s", cmd, m.Error.Class, m.Error.Desc)
		}
		if out != nil && m.Return != nil {
			return json.Unmarshal(m.Return, out)
		}
		return nil
	case <-ctx.Done():
		// The reply may still come; the connection is no longer in step.
		q.conn.Close()
		return fmt.Errorf("qmp %s: %w", cmd, ctx.Err())
	}
}

// write sends b, with f's descriptor attached to its first byte when f is
// not nil.
func (q *QMP) write(b []byte, f *os.File) error {
	if f == nil {
		_, err := q.conn.Write(b)
		return err
	}
	uc, ok := q.conn.(*net.UnixConn)
	if !ok {
		return errors.New("passing a file needs a unix socket")
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var n int
	var werr error
	if err := rc.Control(func(fd uintptr) {
		n, _, werr = uc.WriteMsgUnix(b, unix.UnixRights(int(fd)), nil)
	}); err != nil {
		return err
	}
	if werr != nil {
		return werr
	}
	_, err = q.conn.Write(b[n:])
	return err
}

// Close closes the connection.
func (q *QMP) Close() error { return q.conn.Close() }
