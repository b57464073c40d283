package vm

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Console output is kept bounded: QEMU writes the guest's serial console
// to a socket, and this process copies it into ConsoleLogName. Past
// ConsoleMax bytes that file becomes ConsoleLogName + ".1" (replacing the
// one before) and a new one begins, so a guest that floods its console
// costs at most twice ConsoleMax of disk. While no process reads the
// socket (the server is restarting), QEMU drops what the guest writes.
const ConsoleMax = 1 << 20

// consoleOldName is the rotated console log.
const consoleOldName = ConsoleLogName + ".1"

// ConsoleSocketName is the socket QEMU writes the console to.
const ConsoleSocketName = "console.sock"

// copyConsole copies the console from conn into dir's log until conn
// ends, then closes done.
func copyConsole(dir string, conn net.Conn, done chan<- struct{}) {
	defer close(done)
	defer conn.Close()
	path := filepath.Join(dir, ConsoleLogName)
	var f *os.File
	var size int64
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			if f != nil && size+int64(n) > ConsoleMax {
				f.Close()
				f = nil
				os.Rename(path, filepath.Join(dir, consoleOldName))
			}
			if f == nil {
				if f, err = os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
					// The directory is gone (the sandbox was removed):
					// nothing is left to keep the console for.
					return
				}
				fi, _ := f.Stat()
				size = fi.Size()
			}
			f.Write(buf[:n])
			size += int64(n)
		}
		if err != nil {
			return
		}
	}
}

// dialConsole connects to the console socket of the QEMU in dir and
// copies what it writes; the returned channel is closed when the copy
// ends. It returns nil if the socket cannot be reached.
func dialConsole(dir string) (net.Conn, chan struct{}) {
	conn, err := net.DialTimeout("unix", filepath.Join(dir, ConsoleSocketName), time.Second)
	if err != nil {
		return nil, nil
	}
	done := make(chan struct{})
	go copyConsole(dir, conn, done)
	return conn, done
}

// consoleTail returns up to max bytes of the end of the console log in
// dir, reaching into the rotated log when the current one is shorter.
func consoleTail(dir string, max int) string {
	cur, _ := os.ReadFile(filepath.Join(dir, ConsoleLogName))
	if len(cur) < max {
		if old, err := os.ReadFile(filepath.Join(dir, consoleOldName)); err == nil {
			cur = append(old, cur...)
		}
	}
	return tail(string(cur), max)
}

// hasPanic reports whether s shows a kernel panic.
func hasPanic(s string) bool { return strings.Contains(s, "Kernel panic") }
