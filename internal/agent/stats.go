package agent

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// The files the measurements come from; tests point them elsewhere.
var (
	procStat    = "/proc/stat"
	procMeminfo = "/proc/meminfo"
)

func (a *Agent) handleStats(st net.Conn) {
	res, err := measure("/", agentproto.StatsWindow)
	if err != nil {
		replyErr(st, agentproto.CodeInternal, err.Error())
		return
	}
	reply(st, agentproto.Result{Stats: &res})
}

// measure takes the guest's use: CPU over window, memory and the
// filesystem at root now.
func measure(root string, window time.Duration) (agentproto.StatsResult, error) {
	var res agentproto.StatsResult
	busy0, total0, err := cpuTimes(procStat)
	if err != nil {
		return res, err
	}
	time.Sleep(window)
	busy1, total1, err := cpuTimes(procStat)
	if err != nil {
		return res, err
	}
	res.CPUCount = runtime.NumCPU()
	if d := total1 - total0; d > 0 {
		res.CPUUsedPct = float64(busy1-busy0) * 100 / float64(d)
	}
	mem, err := meminfo(procMeminfo)
	if err != nil {
		return res, err
	}
	res.MemTotalBytes = mem["MemTotal"]
	res.MemUsedBytes = mem["MemTotal"] - mem["MemAvailable"]
	res.MemCacheBytes = mem["Cached"]
	var fs unix.Statfs_t
	if err := unix.Statfs(root, &fs); err != nil {
		return res, fmt.Errorf("statfs %s: %w", root, err)
	}
	bs := int64(fs.Bsize)
	res.DiskTotalBytes = int64(fs.Blocks) * bs
	res.DiskUsedBytes = int64(fs.Blocks-fs.Bfree) * bs
	return res, nil
}

// cpuTimes sums the first line of /proc/stat: the busy jiffies of all
// CPUs (everything but idle and iowait) and all of them.
func cpuTimes(path string) (busy, total uint64, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("%s: no cpu line", path)
	}
	for i, s := range f[1:] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %w", path, err)
		}
		if i == 7 || i == 8 { // guest and guest_nice are in user and nice already
			continue
		}
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total, nil
}

// meminfo reads /proc/meminfo's fields, in bytes.
func meminfo(path string) (map[string]int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		n, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			continue
		}
		if len(fields) > 1 && fields[1] == "kB" {
			n <<= 10
		}
		out[k] = n
	}
	if out["MemTotal"] == 0 {
		return nil, fmt.Errorf("%s: no MemTotal", path)
	}
	return out, sc.Err()
}
