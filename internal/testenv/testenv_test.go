package testenv

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

func TestProcessAlive(t *testing.T) {
	if !ProcessAlive(os.Getpid()) {
		t.Fatal("this process is not alive")
	}
	cmd := exec.Command("sleep", "10")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if !ProcessAlive(pid) {
		t.Fatal("a running sleep is not alive")
	}
	cmd.Process.Kill()
	for i := 0; i < 100 && ProcessAlive(pid); i++ {
		time.Sleep(10 * time.Millisecond) // until the kernel makes it a zombie
	}
	if ProcessAlive(pid) {
		t.Error("a killed child not yet reaped (a zombie) is alive")
	}
	cmd.Wait()
	if ProcessAlive(pid) {
		t.Error("a reaped process is alive")
	}
}
