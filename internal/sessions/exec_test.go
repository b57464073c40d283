package sessions

import (
	"bytes"
	"encoding/json"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"testing/iotest"
	"unicode/utf8"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// TestWriteJSONString checks the streamed escaping against json.Marshal of
// the whole, made valid, for output cut anywhere: runes split between
// reads, runs of invalid bytes across reads, control characters, HTML.
func TestWriteJSONString(t *testing.T) {
	alphabet := [][]byte{[]byte("a"), []byte("€"), []byte("𝄞"), []byte("é"), {0xff}, {0x80}, {0xe2, 0x82}, {0}, []byte("\n"), []byte("\""), []byte("\\"), []byte("<&>"), []byte("\u2028"), {0xed, 0xa0, 0x80}}
	rng := rand.New(rand.NewPCG(1, 2))
	cases := [][]byte{nil, []byte("plain"), bytes.Repeat([]byte{0xff}, 200_000), bytes.Repeat([]byte("€"), 70_000), bytes.Repeat([]byte{0}, 100_000)}
	for range 300 {
		var b []byte
		for range rng.IntN(3000) {
			b = append(b, alphabet[rng.IntN(len(alphabet))]...)
		}
		cases = append(cases, b)
	}
	for i, in := range cases {
		want, _ := json.Marshal(strings.ToValidUTF8(string(in), string(utf8.RuneError)))
		want = want[1 : len(want)-1]
		for _, reader := range []io.Reader{iotest.OneByteReader(bytes.NewReader(in)), iotest.HalfReader(bytes.NewReader(in)), bytes.NewReader(in)} {
			var got bytes.Buffer
			if err := writeJSONString(&got, reader); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Fatalf("case %d (%d bytes) through %T: got %d bytes, want %d", i, len(in), reader, got.Len(), len(want))
			}
		}
	}
}

// TestExecOutput writes an answer from spooled output: the JSON decodes to
// the result with its output, cut at the cap and marked truncated.
func TestExecOutput(t *testing.T) {
	dir := t.TempDir()
	out := &ExecOutput{Result: apiv1.ExecResult{ExitCode: 3, TimedOut: true}}
	var err error
	if out.stdout, err = newSpool(dir, 10); err != nil {
		t.Fatal(err)
	}
	if out.stderr, err = newSpool(dir, 10); err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	out.stdout.Write([]byte("hello\x00wor"))
	out.stdout.Write([]byte("ld and more"))
	out.stderr.Write([]byte{0xff, 'x'})
	out.Result.Truncated = out.stdout.truncated
	var b bytes.Buffer
	if err := out.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var got apiv1.ExecResult
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, b.Bytes())
	}
	want := apiv1.ExecResult{ExitCode: 3, TimedOut: true, Stdout: "hello\x00worl", Stderr: "\uFFFDx", Truncated: true}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if stdout, stderr, err := out.Text(); err != nil || stdout != want.Stdout || stderr != want.Stderr {
		t.Fatalf("Text() = %q, %q, %v", stdout, stderr, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("spools left files: %v", entries)
	}
	// A command that could not start has a note and no files.
	nf := &ExecOutput{Result: apiv1.ExecResult{ExitCode: 127}, note: "no such file\n"}
	b.Reset()
	if err := nf.WriteJSON(&b); err != nil || !strings.Contains(b.String(), `"stderr":"no such file\n"`) {
		t.Fatalf("%v: %s", err, b.String())
	}
	if err := nf.Close(); err != nil {
		t.Fatal(err)
	}
}
