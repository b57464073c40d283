package agent

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestCPUTimes(t *testing.T) {
	p := filepath.Join(t.TempDir(), "stat")
	// user nice system idle iowait irq softirq steal guest guest_nice
	os.WriteFile(p, []byte("cpu  100 10 50 800 40 5 5 0 30 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"), 0o644)
	busy, total, err := cpuTimes(p)
	if err != nil || busy != 170 || total != 1010 {
		t.Errorf("cpuTimes = %d, %d, %v; want 170 busy of 1010 (guest counted in user already)", busy, total, err)
	}
	os.WriteFile(p, []byte("intr 1 2 3\n"), 0o644)
	if _, _, err := cpuTimes(p); err == nil {
		t.Error("a stat file without a cpu line was read")
	}
}

func TestMeasure(t *testing.T) {
	dir := t.TempDir()
	stat, mem := filepath.Join(dir, "stat"), filepath.Join(dir, "meminfo")
	os.WriteFile(mem, []byte("MemTotal:        1000 kB\nMemFree:          100 kB\nMemAvailable:     600 kB\nCached:           300 kB\nHugePages_Total:  0\n"), 0o644)
	os.WriteFile(stat, []byte("cpu  100 0 100 800 0 0 0 0 0 0\n"), 0o644)
	defer func(s, m string) { procStat, procMeminfo = s, m }(procStat, procMeminfo)
	procStat, procMeminfo = stat, mem

	// The CPUs' counters move by 50 busy and 50 idle jiffies in the window.
	go func() {
		time.Sleep(50 * time.Millisecond)
		os.WriteFile(stat, []byte("cpu  125 0 125 850 0 0 0 0 0 0\n"), 0o644)
	}()
	res, err := measure(dir, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if res.CPUUsedPct != 50 || res.CPUCount < 1 {
		t.Errorf("cpu = %d at %.1f%%, want 50%%", res.CPUCount, res.CPUUsedPct)
	}
	if res.MemTotalBytes != 1000<<10 || res.MemUsedBytes != 400<<10 || res.MemCacheBytes != 300<<10 {
		t.Errorf("memory = %+v", res)
	}
	if res.DiskTotalBytes <= 0 || res.DiskUsedBytes <= 0 || res.DiskUsedBytes > res.DiskTotalBytes {
		t.Errorf("disk = %d used of %d", res.DiskUsedBytes, res.DiskTotalBytes)
	}
	os.WriteFile(mem, []byte("MemFree: 1 kB\n"), 0o644)
	if _, err := measure(dir, time.Millisecond); err == nil {
		t.Error("a meminfo without MemTotal was read")
	}
}
