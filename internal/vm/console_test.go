package vm

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A console that floods keeps at most two logs of ConsoleMax, and the
// tail still ends with the last line written.
func TestConsoleBounded(t *testing.T) {
	dir := t.TempDir()
	guest, host := net.Pipe()
	done := make(chan struct{})
	go copyConsole(dir, host, done)
	total := 0
	for i := 0; total < 3*ConsoleMax+1000; i++ {
		line := fmt.Sprintf("line %d %s\n", i, strings.Repeat("x", 100))
		guest.Write([]byte(line))
		total += len(line)
	}
	guest.Write([]byte("the last line\n"))
	guest.Close()
	<-done
	for _, name := range []string{ConsoleLogName, consoleOldName} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Size() > ConsoleMax {
			t.Errorf("%s: %v, %d bytes (at most %d)", name, err, fi.Size(), ConsoleMax)
		}
	}
	if got := consoleTail(dir, 200); !strings.HasSuffix(got, "the last line\n") {
		t.Errorf("tail %q", got)
	}
	// A short current log takes the rest from the rotated one.
	os.WriteFile(filepath.Join(dir, ConsoleLogName), []byte("new\n"), 0o600)
	if got := consoleTail(dir, 300); !strings.HasSuffix(got, "x\nnew\n") || len(got) < 200 {
		t.Errorf("tail across the rotation %q", got)
	}
}
