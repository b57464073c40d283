package agentclient

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
)

func jsonDecode(b []byte, v any) error {
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode agent message: %w", err)
	}
	return nil
}

// ReadFile copies the file at path in the sandbox into w and returns its
// stat.
func (c *Client) ReadFile(ctx context.Context, path string, w io.Writer) (agentproto.Stat, error) {
	st, copyTo, err := c.OpenRead(ctx, path)
	if err != nil {
		return agentproto.Stat{}, err
	}
	return st, copyTo(w)
}

// OpenRead opens the file at path in the sandbox and returns its stat,
// taken from the open file, and copyTo, which copies its content into w
// and ends the read. A regular file's content is exactly SizeBytes long,
// or copyTo fails. copyTo must be called once.
func (c *Client) OpenRead(ctx context.Context, path string) (agentproto.Stat, func(w io.Writer) error, error) {
	st, done, err := c.open(ctx, agentproto.Request{Op: agentproto.OpRead, Path: path})
	if err != nil {
		return agentproto.Stat{}, nil, err
	}
	res, err := c.result(ctx, st)
	if err != nil {
		done()
		return agentproto.Stat{}, nil, err
	}
	if res.Stat == nil {
		done()
		return agentproto.Stat{}, nil, fmt.Errorf("agent began a read without the file's stat")
	}
	return *res.Stat, func(w io.Writer) error {
		defer done()
		return c.receive(ctx, st, w)
	}, nil
}

// receive copies MsgData payloads into w until MsgEOF. An error result in
// their place ends the transfer with that error.
func (c *Client) receive(ctx context.Context, r io.Reader, w io.Writer) error {
	buf := make([]byte, agentproto.ChunkSize+64)
	for {
		t, b, err := agentproto.ReadMsg(r, buf)
		if err != nil {
			return c.linkErr(ctx, err)
		}
		switch t {
		case agentproto.MsgData:
			if _, err := w.Write(b); err != nil {
				return err
			}
		case agentproto.MsgEOF:
			return nil
		case agentproto.MsgResult:
			var res agentproto.Result
			if err := jsonDecode(b, &res); err != nil {
				return err
			}
			if res.Error != nil {
				return AgentError(res.Error)
			}
			return fmt.Errorf("agent ended a transfer without an error or EOF")
		default:
			return fmt.Errorf("unexpected message type %d in a transfer", t)
		}
	}
}

// send streams r as MsgData and then MsgEOF, and reads the result.
func (c *Client) send(ctx context.Context, req agentproto.Request, r io.Reader) (agentproto.Result, error) {
	st, done, err := c.open(ctx, req)
	if err != nil {
		return agentproto.Result{}, err
	}
	defer done()
	// The agent may refuse before reading everything (a directory in the
	// way, a full disk); it then reads on to our EOF, so keep sending.
	if _, err := io.CopyBuffer(agentproto.DataWriter{W: st, Type: agentproto.MsgData}, r, make([]byte, agentproto.ChunkSize)); err != nil {
		return agentproto.Result{}, c.linkErr(ctx, err)
	}
	if err := agentproto.WriteMsg(st, agentproto.MsgEOF, nil); err != nil {
		return agentproto.Result{}, c.linkErr(ctx, err)
	}
	return c.result(ctx, st)
}

// WriteFile writes r to path in the sandbox with the permission mode, after
// creating missing parent directories. The file appears whole or not at all.
func (c *Client) WriteFile(ctx context.Context, path string, mode uint32, r io.Reader) error {
	_, err := c.WriteFileMetadata(ctx, path, mode, nil, r)
	return err
}

// WriteFileMetadata is WriteFile that gives the new file the metadata md
// (agentproto.MetadataXattrPrefix) and returns the file's stat as the
// agent wrote it. An agent that does not confirm the metadata, as one
// older than file metadata ignores it, is an error: the file was written
// then, without metadata.
func (c *Client) WriteFileMetadata(ctx context.Context, path string, mode uint32, md map[string]string, r io.Reader) (agentproto.Stat, error) {
	res, err := c.send(ctx, agentproto.Request{Op: agentproto.OpWrite, Path: path, Mode: mode, Metadata: md}, r)
	if err != nil {
		return agentproto.Stat{}, err
	}
	return written(path, md, res)
}

// written reads the answer to a write of path with metadata md.
func written(path string, md map[string]string, res agentproto.Result) (agentproto.Stat, error) {
	var st agentproto.Stat
	if res.Stat != nil {
		st = *res.Stat
	}
	if len(md) > 0 && (res.Stat == nil || !maps.Equal(st.Metadata, md)) {
		return st, fmt.Errorf("the sandbox's guest agent wrote %s without its metadata: it predates file metadata; a sandbox started from now on has one that keeps it: %w", path, errdefs.ErrPrecondition)
	}
	return st, nil
}

// Stat describes path without following a final symlink.
func (c *Client) Stat(ctx context.Context, path string) (agentproto.Stat, error) {
	res, err := c.call(ctx, agentproto.Request{Op: agentproto.OpStat, Path: path})
	if err != nil {
		return agentproto.Stat{}, err
	}
	if res.Stat == nil {
		return agentproto.Stat{}, fmt.Errorf("agent answered stat without a stat")
	}
	return *res.Stat, nil
}

// List describes the entries under dir, depth levels deep (1: its own).
func (c *Client) List(ctx context.Context, dir string, depth int) ([]agentproto.Stat, error) {
	res, err := c.call(ctx, agentproto.Request{Op: agentproto.OpList, Path: dir, Depth: depth})
	return res.Items, err
}

// Mkdir creates dir and its missing parents.
func (c *Client) Mkdir(ctx context.Context, dir string) error {
	_, err := c.call(ctx, agentproto.Request{Op: agentproto.OpMkdir, Path: dir})
	return err
}

// Move renames from to to, creating to's missing parents.
func (c *Client) Move(ctx context.Context, from, to string) error {
	_, err := c.call(ctx, agentproto.Request{Op: agentproto.OpMove, Path: from, To: to})
	return err
}

// Remove deletes path; a non-empty directory only when recursive.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	_, err := c.call(ctx, agentproto.Request{Op: agentproto.OpRemove, Path: path, Recursive: recursive})
	return err
}

// TarOut writes a tar stream of path (a directory's contents, or one file)
// to w.
func (c *Client) TarOut(ctx context.Context, path string, w io.Writer) error {
	st, done, err := c.open(ctx, agentproto.Request{Op: agentproto.OpTarOut, Path: path})
	if err != nil {
		return err
	}
	defer done()
	if _, err := c.result(ctx, st); err != nil {
		return err
	}
	return c.receive(ctx, st, w)
}

// TarIn extracts the tar stream r into the directory path.
func (c *Client) TarIn(ctx context.Context, path string, r io.Reader) error {
	_, err := c.send(ctx, agentproto.Request{Op: agentproto.OpTarIn, Path: path}, r)
	return err
}
