package e2e

// The reliability suite: churn of create/exec/delete cycles, attacks from
// inside a guest while another sandbox on the same server is measured, and
// QEMU or the server killed in the middle of lifecycle operations. Each
// test has a server of its own, measures what that server holds on the
// host before it starts (QEMU processes, descriptors, sockets, files, disk,
// cgroups) and requires all of it back when it ends.
//
// AIRLOCK_SOAK=1 (make soak) runs 500 churn cycles instead of 50.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/vm"
)

// soak reports whether the long runs of the reliability suite are asked
// for.
func soak() bool { return os.Getenv("AIRLOCK_SOAK") == "1" }

// Bounds of the leak checks.
const (
	// otherDiskSlack bounds the growth of the data directory outside the
	// store and sandboxes/ (keys, logs): nothing there grows with
	// sandboxes.
	otherDiskSlack = 64 << 10
	// storeDiskSlack and storeDiskPerSandbox bound the store's growth: the
	// rows of deleted sandboxes and their operations stay by design, and
	// SQLite's write-ahead log grows to its checkpoint size (1000 pages,
	// about 4 MiB) before it is reused.
	storeDiskSlack      = 8 << 20
	storeDiskPerSandbox = 16 << 10
	// settleTime bounds how long the checks wait for the server to let go
	// of what a test used: a delete's reclaim and a command pump's end run
	// after the operation is answered (pumps get 5 s).
	settleTime = 20 * time.Second
)

// hostUse is what one server holds on the host, measured from outside it.
type hostUse struct {
	qemus     []string       // "PID ARGS" of live QEMU processes in the server's data directory
	zombies   []int          // the server's children that exited and were not reaped
	fds       map[string]int // the server's open descriptors, by what they point at
	nfds      int
	sockets   int
	sandboxes []string // entries of the data directory's sandboxes/
	snapshots []string // entries of snapshots/ (shared with the set-up data directory) but builds in progress
	store     int64    // bytes on disk of the store (airlock.db and its WAL and index)
	other     int64    // bytes on disk of the rest of the data directory, sandboxes/ included
	rssKiB    int64    // the server's resident memory
}

// pid is the server process's ID, 0 while it is stopped.
func (s *server) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// measure takes stock of what the server holds now.
func (s *server) measure(t *testing.T) hostUse {
	t.Helper()
	pid := s.pid()
	if pid == 0 {
		t.Fatal("measure: the server is not running")
	}
	u := hostUse{fds: map[string]int{}, qemus: qemusIn(s.home), zombies: zombieChildren(pid), rssKiB: rssKiB(pid)}
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatalf("descriptors of the server: %v", err)
	}
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err != nil {
			continue // closed since the listing
		}
		u.nfds++
		switch {
		case strings.HasPrefix(target, "socket:"):
			u.sockets++
			target = "socket"
		case strings.HasPrefix(target, "pipe:"):
			target = "pipe"
		}
		u.fds[target]++
	}
	dir := datadir.Dir{Root: s.home}
	u.sandboxes = dirNames(t, dir.Sandboxes())
	// A ".build-*" directory is a snapshot being made, by whichever
	// process: it is renamed or swept, never kept.
	for _, name := range dirNames(t, dir.Snapshots()) {
		if !strings.HasPrefix(name, ".build-") {
			u.snapshots = append(u.snapshots, name)
		}
	}
	err = filepath.WalkDir(s.home, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // removed while walked
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil // boot, templates and snapshots are the set-up data directory's
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		if strings.HasPrefix(d.Name(), "airlock.db") && filepath.Dir(p) == s.home {
			u.store += st.Blocks * 512
		} else {
			u.other += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		t.Fatalf("disk use of %s: %v", s.home, err)
	}
	return u
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	names := []string{}
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// leaks compares now with base, taken before the test's sandboxes, and
// says what was not given back. sandboxes is how many sandboxes the test
// made, for the store's bound.
func leaks(base, now hostUse, sandboxes int) []string {
	var out []string
	if extra := minus(now.qemus, base.qemus); len(extra) > 0 {
		out = append(out, fmt.Sprintf("%d QEMU processes left in the data directory: %s", len(extra), strings.Join(extra, "; ")))
	}
	if len(now.zombies) > 0 {
		out = append(out, fmt.Sprintf("the server did not reap its children %v", now.zombies))
	}
	var grown []string
	for target, n := range now.fds {
		if n > base.fds[target] && !(runtimeFile(target) && n == 1) {
			grown = append(grown, fmt.Sprintf("%s ×%d", target, n-base.fds[target]))
		}
	}
	if len(grown) > 0 {
		sort.Strings(grown)
		out = append(out, fmt.Sprintf("the server holds %d descriptors (%d sockets), %d (%d) before; more of %s",
			now.nfds, now.sockets, base.nfds, base.sockets, strings.Join(grown, ", ")))
	}
	if extra := minus(now.sandboxes, base.sandboxes); len(extra) > 0 {
		out = append(out, fmt.Sprintf("sandboxes/ holds %v", extra))
	}
	if added, removed := minus(now.snapshots, base.snapshots), minus(base.snapshots, now.snapshots); len(added)+len(removed) > 0 {
		out = append(out, fmt.Sprintf("snapshots/ changed: added %v, removed %v", added, removed))
	}
	if now.other > base.other+otherDiskSlack {
		out = append(out, fmt.Sprintf("the data directory outside the store grew from %d to %d bytes", base.other, now.other))
	}
	if limit := base.store + storeDiskSlack + int64(sandboxes)*storeDiskPerSandbox; now.store > limit {
		out = append(out, fmt.Sprintf("the store grew from %d to %d bytes, past %d for %d sandboxes", base.store, now.store, limit, sandboxes))
	}
	return out
}

// runtimeFile reports whether target is a cgroup CPU limit file, which the
// Go runtime opens when it first reads the limit and keeps open.
//
// The server may hold no descriptor more after a test than before it, of
// any kind (a file, a socket, a pipe, a pidfd, a memfd), with one
// exception, the slack: these files (cpu.cfs_quota_us and
// cpu.cfs_period_us, or cpu.max), one of each, which the baseline's first
// cycle usually has opened already but not always. There is no slack for
// sockets: the checks close this test's idle HTTP connections and give
// the server time to see them go.
func runtimeFile(target string) bool {
	switch filepath.Base(target) {
	case "cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.max":
		return strings.HasPrefix(target, "/sys/fs/cgroup/")
	}
	return false
}

// minus is what a holds that b does not.
func minus(a, b []string) []string {
	in := map[string]bool{}
	for _, x := range b {
		in[x] = true
	}
	var out []string
	for _, x := range a {
		if !in[x] {
			out = append(out, x)
		}
	}
	return out
}

func fdDiff(base, now map[string]int) string {
	var out []string
	for target, n := range now {
		if n > base[target] {
			out = append(out, fmt.Sprintf("%s ×%d", target, n-base[target]))
		}
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// baseline makes and deletes one sandbox of each of warm ("tiny" when
// none is given), so that the server has opened what it keeps open once
// used (the store's files, the runtime's, a sealed copy of each template
// snapshot's memory that clones map) and every snapshot the test needs
// exists; then it measures the server once two measurements agree.
func (s *server) baseline(t *testing.T, warm ...apiv1.CreateSandbox) hostUse {
	t.Helper()
	if len(warm) == 0 {
		warm = []apiv1.CreateSandbox{{Template: "tiny"}}
	}
	for _, req := range warm {
		if err := s.cycle(req, "baseline"); err != nil {
			t.Fatalf("first cycle of %+v: %v", req, err)
		}
	}
	http.DefaultClient.CloseIdleConnections()
	prev := s.measure(t)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		u := s.measure(t)
		if u.nfds == prev.nfds && len(u.qemus) == len(prev.qemus) {
			return u
		}
		prev = u
	}
	return prev
}

// checkNoLeaks waits up to settleTime for the server to be back at base
// and fails the test with what it still holds. It also requires that no
// cgroup named for one of the server's sandboxes is left.
func (s *server) checkNoLeaks(t *testing.T, base hostUse, sandboxes int) hostUse {
	t.Helper()
	var now hostUse
	var problems []string
	// snapshots/ is shared with every server of the test binary, and with
	// other users of the set-up data directory: only the snapshots of the
	// templates this server's sandboxes came from are its business.
	digests := s.templateDigests(t)
	base.snapshots = ofTemplates(base.snapshots, digests)
	for deadline := time.Now().Add(settleTime); ; {
		http.DefaultClient.CloseIdleConnections()
		now = s.measure(t)
		now.snapshots = ofTemplates(now.snapshots, digests)
		problems = leaks(base, now, sandboxes)
		if len(problems) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, p := range problems {
		t.Errorf("leak: %s", p)
	}
	if left := leakedCgroups(t, s.sandboxIDs(t)); len(left) > 0 {
		t.Errorf("leak: cgroups of deleted sandboxes: %v", left)
	}
	if now.nfds != base.nfds {
		t.Logf("descriptors more than before: %s; fewer: %s", fdDiff(base.fds, now.fds), fdDiff(now.fds, base.fds))
	}
	t.Logf("host use: %d descriptors (%d sockets; %d and %d before), %d QEMU, store %d bytes (%d before), rest %d bytes (%d before), server RSS %d KiB (%d before)",
		now.nfds, now.sockets, base.nfds, base.sockets, len(now.qemus), now.store, base.store, now.other, base.other, now.rssKiB, base.rssKiB)
	return now
}

// qemusIn lists the live QEMU processes whose working directory or
// arguments lie in the data directory home, as "PID ARGS".
func qemusIn(home string) []string {
	homes := []string{home + "/"}
	if real, err := filepath.EvalSymlinks(home); err == nil && real != home {
		homes = append(homes, real+"/")
	}
	in := func(s string) bool {
		for _, h := range homes {
			if strings.Contains(s+"/", h) {
				return true
			}
		}
		return false
	}
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if !strings.HasPrefix(filepath.Base(exe), "qemu-system") && !strings.HasPrefix(filepath.Base(args[0]), "qemu-system") {
			continue
		}
		cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		joined := strings.Join(args, " ")
		if (in(cwd) || in(joined)) && testenv.ProcessAlive(pid) {
			out = append(out, fmt.Sprintf("%d %s", pid, truncateArgs(joined)))
		}
	}
	return out
}

func truncateArgs(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// zombieChildren lists the children of ppid that exited and that it has
// not waited for.
func zombieChildren(ppid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f := procStat(pid)
		// After the command's name: state, ppid.
		if len(f) > 1 && f[0] == "Z" && f[1] == strconv.Itoa(ppid) {
			out = append(out, pid)
		}
	}
	return out
}

// procStat returns the fields of /proc/PID/stat after the command's name
// (state first), or nil.
func procStat(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times: 100 on
// every Linux architecture airlock runs on.
const clockTicks = 100

// cpuSeconds is the CPU time process pid has used, user and system.
func cpuSeconds(pid int) float64 {
	f := procStat(pid)
	if len(f) < 13 {
		return 0
	}
	// utime and stime are fields 14 and 15 of the whole line.
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return float64(u+st) / clockTicks
}

// rssKiB is process pid's resident memory in KiB, 0 if it is gone.
func rssKiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// leakedCgroups lists the cgroup directories that are named for one of
// ids (a sandbox's ID, alone or with a prefix or suffix such as
// ".scope"), anywhere below an airlock* directory of a cgroup hierarchy:
// /sys/fs/cgroup/<controller>/airlock*/... for cgroup v1 and
// /sys/fs/cgroup/airlock*/... for v2. A sandbox that is gone must have
// none left.
func leakedCgroups(t *testing.T, ids []string) []string {
	t.Helper()
	var roots []string
	for _, pattern := range []string{"/sys/fs/cgroup/*/airlock*", "/sys/fs/cgroup/airlock*"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		roots = append(roots, m...)
	}
	var left []string
	for _, root := range roots {
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil // a cgroup removed while walked, or a control file
			}
			for _, id := range ids {
				if strings.Contains(d.Name(), id) {
					left = append(left, p)
					return fs.SkipDir
				}
			}
			return nil
		})
	}
	return left
}

// sandboxIDs lists the IDs of every sandbox the server has a record of, in
// any state, deleted ones too.
func (s *server) sandboxIDs(t *testing.T) []string {
	t.Helper()
	var ids []string
	for _, state := range apiv1.States {
		token := ""
		for {
			var page apiv1.List[apiv1.Sandbox]
			s.must(t, 200, "GET", "/v1/sandboxes?limit=1000&state="+state+"&page_token="+token, s.key, nil, &page)
			for _, sb := range page.Items {
				ids = append(ids, sb.ID)
			}
			if token = page.NextPageToken; token == "" {
				break
			}
		}
	}
	return ids
}

// templateDigests lists the hex digests of the templates of every
// sandbox the server has a record of.
func (s *server) templateDigests(t *testing.T) []string {
	t.Helper()
	seen := map[string]bool{}
	var out []string
	for _, state := range apiv1.States {
		var page apiv1.List[apiv1.Sandbox]
		s.must(t, 200, "GET", "/v1/sandboxes?limit=1000&state="+state, s.key, nil, &page)
		for _, sb := range page.Items {
			if d := strings.TrimPrefix(sb.Template.Digest, "sha256:"); d != "" && !seen[d] {
				seen[d] = true
				out = append(out, d)
			}
		}
	}
	return out
}

// ofTemplates keeps the snapshot entries, named "<template digest>-...",
// of the templates of digests.
func ofTemplates(names, digests []string) []string {
	var out []string
	for _, n := range names {
		for _, d := range digests {
			if strings.HasPrefix(n, d+"-") {
				out = append(out, n)
				break
			}
		}
	}
	return out
}

// try sends a request with the admin key, bounded by d. Unlike call it
// returns what went wrong instead of ending the test, so that goroutines
// and requests expected to fail can use it.
func (s *server) try(method, path string, body any, d time.Duration) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var r io.Reader
	if body != nil {
		j, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		r = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, r)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// tryOp sends a lifecycle request that answers an operation and waits for
// that operation to finish.
func (s *server) tryOp(method, path string, body any) (apiv1.Operation, error) {
	status, b, err := s.try(method, path, body, time.Minute)
	if err != nil {
		return apiv1.Operation{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	var res apiv1.SandboxOperation
	if status != 202 || json.Unmarshal(b, &res) != nil {
		return apiv1.Operation{}, fmt.Errorf("%s %s: %d %s", method, path, status, b)
	}
	return s.tryWait(res.Operation)
}

// tryWait long-polls op until it finishes, for at most 3 minutes.
func (s *server) tryWait(op apiv1.Operation) (apiv1.Operation, error) {
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); {
		status, b, err := s.try("GET", "/v1/operations/"+op.ID+"?wait_s=30", nil, time.Minute)
		if err != nil {
			return op, err
		}
		if status != 200 || json.Unmarshal(b, &op) != nil {
			return op, fmt.Errorf("operation %s: %d %s", op.ID, status, b)
		}
		if op.Done() {
			return op, nil
		}
	}
	return op, fmt.Errorf("operation %s (%s) did not finish in 3 minutes", op.ID, op.Kind)
}

// execOK runs cmd in sandbox id within d and returns its stdout; a
// non-zero exit is an error.
func (s *server) execOK(id, cmd string, d time.Duration) (string, error) {
	status, b, err := s.try("POST", "/v1/sandboxes/"+id+"/exec", apiv1.CommandRequest{Cmd: cmd}, d)
	if err != nil {
		return "", fmt.Errorf("exec %q in %s: %w", cmd, id, err)
	}
	var res apiv1.ExecResult
	if status != 200 || json.Unmarshal(b, &res) != nil {
		return "", fmt.Errorf("exec %q in %s: %d %s", cmd, id, status, b)
	}
	if res.ExitCode != 0 {
		return res.Stdout, fmt.Errorf("exec %q in %s: exit %d, stderr %q", cmd, id, res.ExitCode, res.Stderr)
	}
	return res.Stdout, nil
}

// cycle is one create (of req), exec, delete, with the checks that each
// step did what it says: the command's output, the delete's operation, and
// no directory or QEMU process left for the sandbox.
func (s *server) cycle(req apiv1.CreateSandbox, name string) error {
	status, b, err := s.try("POST", "/v1/sandboxes", req, time.Minute)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	var res apiv1.SandboxOperation
	if status != 202 || json.Unmarshal(b, &res) != nil {
		return fmt.Errorf("create: %d %s", status, b)
	}
	id := res.Sandbox.ID
	op, err := s.tryWait(res.Operation)
	if err == nil && op.Status != apiv1.OpSucceeded {
		err = fmt.Errorf("create %s failed: %+v", id, op.Error)
	}
	if err == nil {
		var out string
		out, err = s.execOK(id, "echo "+name, time.Minute)
		if err == nil && out != name+"\n" {
			err = fmt.Errorf("exec in %s answered %q, want %q", id, out, name+"\n")
		}
	}
	dir := datadir.Dir{Root: s.home}.Sandbox(id)
	pid := 0
	if b, rerr := os.ReadFile(filepath.Join(dir, "qemu.pid")); rerr == nil {
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	op, derr := s.tryOp("DELETE", "/v1/sandboxes/"+id, nil)
	if derr == nil && op.Status != apiv1.OpSucceeded {
		derr = fmt.Errorf("delete %s failed: %+v", id, op.Error)
	}
	if derr == nil {
		if _, serr := os.Stat(dir); !errors.Is(serr, os.ErrNotExist) {
			derr = fmt.Errorf("the directory of deleted sandbox %s is left (%v)", id, serr)
		} else if pid > 0 && testenv.ProcessAlive(pid) {
			derr = fmt.Errorf("the QEMU (pid %d) of deleted sandbox %s still runs", pid, id)
		}
	}
	return errors.Join(err, derr)
}

// TestReliabilityChurn runs create/exec/delete cycles of "tiny" sandboxes
// on one server, two at a time, and then requires the server to hold no
// more than before: no QEMU process, descriptor, socket, sandbox
// directory, snapshot, disk or cgroup more. AIRLOCK_SOAK=1 runs 500 cycles
// instead of 50.
func TestReliabilityChurn(t *testing.T) {
	t.Parallel()
	cycles := 50
	if soak() {
		cycles = 500
	}
	const workers = 2
	s := newServer(t)
	base := s.baseline(t)

	start := time.Now()
	durations := make([]time.Duration, cycles)
	errs := make(chan error, cycles)
	var next atomic.Int64 // the next cycle to run
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= cycles {
					return
				}
				t0 := time.Now()
				if err := s.cycle(apiv1.CreateSandbox{Template: "tiny"}, fmt.Sprintf("churn-%d", i)); err != nil {
					errs <- fmt.Errorf("cycle %d: %w", i, err)
				}
				durations[i] = time.Since(t0)
				if (i+1)%50 == 0 {
					t.Logf("%d cycles in %v; server: %d descriptors, RSS %d KiB", i+1, time.Since(start).Round(time.Second), fdCount(s.pid()), rssKiB(s.pid()))
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		if failed++; failed <= 10 {
			t.Error(err)
		}
	}
	if failed > 10 {
		t.Errorf("and %d cycles more failed", failed-10)
	}
	elapsed := time.Since(start)

	// Every sandbox is recorded as deleted, none in another state.
	for _, state := range apiv1.States {
		if state == apiv1.StateDeleted {
			continue
		}
		var page apiv1.List[apiv1.Sandbox]
		s.must(t, 200, "GET", "/v1/sandboxes?state="+state, s.key, nil, &page)
		for _, sb := range page.Items {
			t.Errorf("sandbox %s is %s after the churn (last error %+v)", sb.ID, sb.State, sb.LastError)
		}
	}
	now := s.checkNoLeaks(t, base, cycles+1)

	// Cycles should not get slower as the server ages: report the first
	// and last tenth.
	tenth := max(cycles/10, 1)
	first, last := median(durations[:tenth]), median(durations[cycles-tenth:])
	report(t, map[string]any{
		"test": "churn", "cycles": cycles, "workers": workers, "seconds": elapsed.Seconds(),
		"cycle_median_ms": ms(median(durations)), "cycle_max_ms": ms(maxDuration(durations)),
		"first_tenth_median_ms": ms(first), "last_tenth_median_ms": ms(last),
		"fds_before": base.nfds, "fds_after": now.nfds, "sockets_before": base.sockets, "sockets_after": now.sockets,
		"store_bytes_before": base.store, "store_bytes_after": now.store,
		"rss_kib_before": base.rssKiB, "rss_kib_after": now.rssKiB,
	})
}

// fdCount is how many descriptors process pid has open.
func fdCount(pid int) int {
	entries, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(entries)
}

// report logs one result of the suite as a JSON line, for tools to pick
// out of the test log.
func report(t *testing.T, fields map[string]any) {
	t.Helper()
	b, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reliability: %s", b)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	c := append([]time.Duration(nil), ds...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	return c[len(c)/2]
}

func maxDuration(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}

// victimBound is how long every exec in the measured sandbox and every
// /healthz may take while another sandbox attacks: generous, as TCG on a
// small host is slow, but finite.
const victimBound = 30 * time.Second

// rtt is the round trip of `true` in sandbox id.
func (s *server) rtt(id string) (time.Duration, error) {
	start := time.Now()
	status, b, err := s.try("POST", "/v1/sandboxes/"+id+"/exec", apiv1.CommandRequest{Argv: []string{"true"}}, victimBound)
	d := time.Since(start)
	if err != nil {
		return d, fmt.Errorf("exec true: %w", err)
	}
	var res apiv1.ExecResult
	if status != 200 || json.Unmarshal(b, &res) != nil || res.ExitCode != 0 {
		return d, fmt.Errorf("exec true after %v: %d %s", d, status, b)
	}
	return d, nil
}

// health checks that /healthz answers within victimBound.
func (s *server) health() error {
	status, b, err := s.try("GET", "/healthz", nil, victimBound)
	if err != nil {
		return fmt.Errorf("/healthz: %w", err)
	}
	if status != 200 {
		return fmt.Errorf("/healthz: %d %s", status, b)
	}
	return nil
}

// attack is a program run as root in a sandbox of its own while the
// victim, another sandbox of the same server, is measured.
type attack struct {
	name   string
	create apiv1.CreateSandbox
	cmd    apiv1.CommandRequest
	// unread closes the command's stream once it started: nobody reads
	// its output.
	unread bool
	// settle is how long the attack runs before the victim is measured,
	// window how long it is measured.
	settle, window time.Duration
	// check looks at what the attack did: evidence that it hit what it
	// aims at, and the bounds the host must keep.
	check func(t *testing.T, r *attackRun)
}

// attackRun is one attack as it ran.
type attackRun struct {
	s    *server
	sb   apiv1.Sandbox
	qemu int    // the attacked sandbox's QEMU
	cmd  string // the attack's command ID

	cpu      float64 // CPU seconds per second the attacked QEMU used during the window
	guestCPU float64 // the attacked guest's own view of its CPUs' use at the window's end, percent; -1 unknown
	// guestLoad and guestTasks are the attacked guest's one-minute load
	// average and its number of tasks at the window's end (/proc/loadavg);
	// -1 when the guest could not run cat within 10 s.
	guestLoad  float64
	guestTasks int

	mu           sync.Mutex // guards the maxima, sampled from the attack's start to the end of its check
	maxQEMURSS   int64      // KiB
	maxServerRSS int64      // KiB
	maxLogBytes  int64      // the attack command's log on disk
	serverRSS0   int64      // KiB, before the attack

	end chan attackEnd // the command's end, for a command whose stream is read
}

// attackEnd is how an attack's command ended, as its stream told.
type attackEnd struct {
	out output
	err error
}

// maxima returns the attacked QEMU's and the server's largest resident
// memory (KiB) and the command log's largest size seen so far.
func (r *attackRun) maxima() (qemuRSS, serverRSS, logBytes int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxQEMURSS, r.maxServerRSS, r.maxLogBytes
}

// sample records the current sizes; it runs every 200 ms until stop
// closes.
func (r *attackRun) sample(stop <-chan struct{}) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		q, sv, l := rssKiB(r.qemu), rssKiB(r.s.pid()), r.logBytes()
		r.mu.Lock()
		r.maxQEMURSS, r.maxServerRSS, r.maxLogBytes = max(r.maxQEMURSS, q), max(r.maxServerRSS, sv), max(r.maxLogBytes, l)
		r.mu.Unlock()
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// awaitEnd waits up to d for the attack's command to end.
func (r *attackRun) awaitEnd(t *testing.T, d time.Duration) (output, bool) {
	t.Helper()
	select {
	case e := <-r.end:
		if e.err != nil {
			t.Errorf("the stream of the attack's command: %v", e.err)
		}
		return e.out, e.err == nil
	case <-time.After(d):
		return output{}, false
	}
}

// logBytes is the size on disk of the attack command's event log.
func (r *attackRun) logBytes() int64 {
	var n int64
	m, _ := filepath.Glob(filepath.Join(datadir.Dir{Root: r.s.home}.Sandbox(r.sb.ID), "commands", r.cmd+".log*"))
	for _, p := range m {
		if fi, err := os.Stat(p); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// readEnd reads a command's stream to its exit, reporting a broken stream
// as an error instead of ending the test.
func readEnd(r *sseReader) (output, error) {
	var o output
	for {
		ev, err := r.next()
		if err != nil {
			return o, fmt.Errorf("stream ended before exit (%v) after %v", err, o.names)
		}
		o.names = append(o.names, ev.name)
		switch ev.name {
		case "stdout", "stderr":
			var d apiv1.DataEvent
			if err := json.Unmarshal([]byte(ev.data), &d); err != nil {
				return o, err
			}
			if ev.name == "stdout" {
				o.stdout += string(d.Data)
			} else {
				o.stderr += string(d.Data)
			}
		case "exit":
			return o, json.Unmarshal([]byte(ev.data), &o.exit)
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// guestLoad is sandbox id's one-minute load average and number of tasks,
// from /proc/loadavg ("0.50 0.40 0.30 RUNNING/TOTAL LASTPID"), or -1, -1
// when the guest cannot run cat within 10 s.
func (s *server) guestLoad(id string) (float64, int) {
	status, b, err := s.try("POST", "/v1/sandboxes/"+id+"/exec", apiv1.CommandRequest{Argv: []string{"cat", "/proc/loadavg"}}, 10*time.Second)
	var res apiv1.ExecResult
	if err != nil || status != 200 || json.Unmarshal(b, &res) != nil || res.ExitCode != 0 {
		return -1, -1
	}
	f := strings.Fields(res.Stdout)
	if len(f) < 4 {
		return -1, -1
	}
	load, err1 := strconv.ParseFloat(f[0], 64)
	_, total, _ := strings.Cut(f[3], "/")
	n, err2 := strconv.Atoi(total)
	if err1 != nil || err2 != nil {
		return -1, -1
	}
	return load, n
}

// spinVCPUs is the CPU spinner's vCPU count: the host's CPUs, at most 2,
// which on a 2-core host is every core.
func spinVCPUs() int { return min(goruntime.NumCPU(), 2) }

// TestReliabilityAttacks runs attacks from inside a guest, as root, each
// in a sandbox of its own, while a second sandbox on the same server (the
// victim) is measured: a fork bomb, a memory hog past the guest's memory,
// a disk filled to ENOSPC, a spinner on every vCPU, and a flood of output
// nobody reads. During each, every exec of `true` in the victim and every
// /healthz must answer within victimBound; the ratio of the victim's
// median round trip during the attack to before it is reported, not
// bounded (timings under TCG are noisy). Each attack must show that it
// hit (the process table full, the guest's memory exhausted, ENOSPC, the
// vCPUs busy, output logged) and stay within the host's bounds (QEMU's
// memory, the disk overlay, the command log, the server's memory); its
// sandbox must then delete cleanly, and at the end the server must hold no
// more than before.
//
// It is not parallel: the ratios mean something only when nothing else in
// the suite loads the host.
func TestReliabilityAttacks(t *testing.T) {
	s := newServer(t)
	spin := apiv1.CreateSandbox{Template: "tiny", VCPUs: spinVCPUs()}
	base := s.baseline(t, apiv1.CreateSandbox{Template: "tiny"}, apiv1.CreateSandbox{Template: "base"}, spin)
	made := 3
	victim := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny"})
	made++
	// leakedCgroups finds the group of a live sandbox, when its QEMU has
	// one: the leak checks could see one left behind.
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", qemuPID(t, s, victim.ID))); err == nil && strings.Contains(string(b), "/"+victim.ID+"\n") {
		if found := leakedCgroups(t, []string{victim.ID}); len(found) == 0 {
			t.Errorf("leakedCgroups does not find the cgroup of live sandbox %s (%s)", victim.ID, b)
		}
	}

	attacks := []attack{{
		name:   "fork_bomb",
		create: apiv1.CreateSandbox{Template: "base"}, // bash: ash's ":" is a builtin that a function cannot replace
		// The sleep keeps the command running, so that its timeout kills
		// the whole process group, the bomb with it.
		cmd:    apiv1.CommandRequest{Argv: []string{"bash", "-c", ":(){ :|:& };:; sleep 3600"}, User: "root", TimeoutS: 15},
		settle: 500 * time.Millisecond, window: 8 * time.Second,
		check: func(t *testing.T, r *attackRun) {
			o, ok := r.awaitEnd(t, time.Minute)
			if !ok || !o.exit.TimedOut {
				t.Errorf("the bomb did not end by its 15 s timeout within a minute: %+v", o.exit)
			}
			// Hundreds of processes ran at once: the load average says so
			// for a minute (the bomb may have burnt out by the window's
			// end), unless the guest can no longer even run cat.
			if r.guestLoad >= 0 && r.guestLoad < 10 {
				t.Errorf("the bomb's guest has a load average of %.1f: it did not explode", r.guestLoad)
			}
			// The bomb ran out of pids in the guest's commands' cgroup,
			// which keeps room for the agent (internal/agent/cgroup.go):
			// the agent lived through it, killed its process group at the
			// timeout, and the guest answers again.
			start := time.Now()
			_, err := r.s.execOK(r.sb.ID, "true", time.Minute)
			report(t, map[string]any{"test": "attack_after", "attack": "fork_bomb", "guest_answers": err == nil, "seconds": time.Since(start).Seconds()})
			if err != nil {
				t.Errorf("the guest does not answer after the bomb: %v", err)
			}
		},
	}, {
		name:   "memory_hog",
		create: apiv1.CreateSandbox{Template: "base"},
		// Each chunk is written, so that its pages are really used.
		cmd:    apiv1.CommandRequest{Argv: []string{"python3", "-c", "a = []\nwhile True:\n    a.append(b'x' * (8 << 20))"}, User: "root", TimeoutS: 120},
		settle: time.Second, window: 8 * time.Second,
		check: func(t *testing.T, r *attackRun) {
			o, ok := r.awaitEnd(t, 2*time.Minute)
			if !ok || o.exit.Signal == nil || *o.exit.Signal != "KILL" || o.exit.TimedOut {
				t.Errorf("the hog did not end killed by the guest's OOM killer: %+v", o.exit)
			}
			// QEMU's own memory, its TCG translation cache included,
			// stays far below 256 MiB over a minute of this
			// (internal/cgroup measured 63 MiB for an idle clone).
			if qemuRSS, _, _ := r.maxima(); qemuRSS > int64(r.sb.MemoryMiB+256)<<10 {
				t.Errorf("the hog's QEMU reached %d KiB resident for a %d MiB guest", qemuRSS, r.sb.MemoryMiB)
			}
			if _, err := r.s.execOK(r.sb.ID, "true", time.Minute); err != nil {
				t.Errorf("the guest does not answer after its OOM kill: %v", err)
			}
		},
	}, {
		name:   "disk_fill",
		create: apiv1.CreateSandbox{Template: "tiny"},
		cmd:    apiv1.CommandRequest{Cmd: "dd if=/dev/zero of=/fill bs=1M; sync", User: "root", TimeoutS: 300},
		settle: time.Second, window: 8 * time.Second,
		check: func(t *testing.T, r *attackRun) {
			o, ok := r.awaitEnd(t, 5*time.Minute)
			if !ok || !strings.Contains(o.stderr, "No space left on device") {
				t.Errorf("filling the disk: %+v, stderr %q", o.exit, tail(o.stderr, 300))
			}
			fi, err := os.Stat(filepath.Join(datadir.Dir{Root: r.s.home}.Sandbox(r.sb.ID), "disk.qcow2"))
			if err != nil {
				t.Fatal(err)
			}
			if limit := int64(r.sb.DiskMiB+32) << 20; fi.Size() > limit {
				t.Errorf("the disk overlay grew to %d bytes for a %d MiB disk", fi.Size(), r.sb.DiskMiB)
			}
			if out, err := r.s.execOK(r.sb.ID, "rm /fill && echo ok > /ok && cat /ok", time.Minute); err != nil || out != "ok\n" {
				t.Errorf("after freeing the disk: %q %v", out, err)
			}
		},
	}, {
		name:   "cpu_spin",
		create: spin,
		cmd:    apiv1.CommandRequest{Cmd: "for i in $(seq $(nproc)); do (while :; do :; done) & done; wait", User: "root", TimeoutS: 15},
		settle: time.Second, window: 8 * time.Second,
		check: func(t *testing.T, r *attackRun) {
			// The guest's own view: the host's share depends on what
			// else runs on it.
			if r.guestCPU < 90 {
				t.Errorf("the spinners' guest saw its CPUs %.0f%% busy", r.guestCPU)
			}
			if o, ok := r.awaitEnd(t, time.Minute); !ok || !o.exit.TimedOut {
				t.Errorf("the spinners did not end by their 15 s timeout within a minute: %+v", o.exit)
			}
			if _, err := r.s.execOK(r.sb.ID, "true", time.Minute); err != nil {
				t.Errorf("the guest does not answer after its spinners: %v", err)
			}
		},
	}, {
		name:   "output_flood",
		create: apiv1.CreateSandbox{Template: "tiny"},
		cmd:    apiv1.CommandRequest{Cmd: "yes 'output nobody reads: 0123456789abcdefghijklmnopqrstuvwxyz'", User: "root"},
		unread: true, settle: 2 * time.Second, window: 8 * time.Second,
		check: func(t *testing.T, r *attackRun) {
			_, serverRSS, logBytes := r.maxima()
			// The log keeps two segments of 8 MiB, each ending with an
			// event of at most 1 MiB.
			if limit := int64(2 * (8<<20 + 1<<20 + 64)); logBytes > limit {
				t.Errorf("the log of a command nobody reads reached %d bytes", logBytes)
			}
			if logBytes < 1<<20 {
				t.Errorf("the flood logged %d bytes: it did not flood", logBytes)
			}
			// Tens of MiB went through the server meanwhile.
			if grew := serverRSS - r.serverRSS0; grew > 64<<10 {
				t.Errorf("the server's memory grew by %d KiB while the output of a command nobody reads was logged", grew)
			}
			// The delete that follows runs while the flood goes on.
		},
	}}

	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			made++
			s.runAttack(t, victim.ID, a)
		})
	}
	s.deleteSandbox(t, s.key, victim.ID)
	s.checkNoLeaks(t, base, made)
}

// runAttack runs one attack and measures the victim before and during it.
func (s *server) runAttack(t *testing.T, victim string, a attack) {
	t.Helper()
	sb := s.createSandbox(t, s.key, a.create)
	r := &attackRun{s: s, sb: sb, qemu: qemuPID(t, s, sb.ID), guestCPU: -1, end: make(chan attackEnd, 1)}

	// Before: the median of five, after one to warm up.
	s.rtt(victim)
	var before []time.Duration
	for range 5 {
		d, err := s.rtt(victim)
		if err != nil {
			t.Fatalf("the victim before the attack: %v", err)
		}
		before = append(before, d)
	}
	r.serverRSS0 = rssKiB(s.pid())

	var sess apiv1.CommandSession
	s.must(t, 201, "POST", "/v1/sandboxes/"+sb.ID+"/commands", s.key, a.cmd, &sess)
	r.cmd = sess.ID
	resp, stream := s.attach(t, sess.ID, s.key, 0)
	if ev, err := stream.next(); err != nil || ev.name != "start" {
		resp.Body.Close()
		t.Fatalf("the attack's first event: %+v %v", ev, err)
	}
	if a.unread {
		resp.Body.Close()
	} else {
		go func() {
			defer resp.Body.Close()
			o, err := readEnd(stream)
			r.end <- attackEnd{o, err}
		}()
	}
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() { defer close(sampled); r.sample(stop) }()
	defer func() { close(stop); <-sampled }()
	time.Sleep(a.settle)

	// During: every exec in the victim and every /healthz must answer.
	cpu0, t0 := cpuSeconds(r.qemu), time.Now()
	var during []time.Duration
	var failures []string
	for deadline := time.Now().Add(a.window); time.Now().Before(deadline) || len(during) < 5; {
		d, err := s.rtt(victim)
		if err != nil {
			failures = append(failures, err.Error())
		}
		during = append(during, d)
		if err := s.health(); err != nil {
			failures = append(failures, err.Error())
		}
	}
	r.cpu = (cpuSeconds(r.qemu) - cpu0) / time.Since(t0).Seconds()
	if status, b, err := s.try("GET", "/v1/sandboxes/"+sb.ID+"/metrics", nil, 10*time.Second); err == nil && status == 200 {
		var m apiv1.SandboxMetrics
		if json.Unmarshal(b, &m) == nil {
			r.guestCPU = m.CPUUsedPct
		}
	}
	r.guestLoad, r.guestTasks = s.guestLoad(sb.ID)
	for _, f := range failures {
		t.Errorf("during the %s: %s", a.name, f)
	}

	ratio := float64(median(during)) / float64(median(before))
	t.Logf("%s: the victim's exec of true took %v (median of %d) during the attack, %v before: ×%.1f",
		a.name, median(during), len(during), median(before), ratio)
	a.check(t, r)
	qemuRSS, serverRSS, logBytes := r.maxima()
	report(t, map[string]any{
		"test": "attack", "attack": a.name,
		"before_median_ms": ms(median(before)), "during_median_ms": ms(median(during)), "during_max_ms": ms(maxDuration(during)),
		"ratio": ratio, "samples": len(during), "failures": len(failures),
		"attacked_vm_host_cpu": r.cpu, "attacked_guest_cpu_pct": r.guestCPU, "attacked_guest_load": r.guestLoad, "attacked_guest_tasks": r.guestTasks, "attacked_vm_max_rss_kib": qemuRSS,
		"server_rss_kib_before": r.serverRSS0, "server_max_rss_kib": serverRSS, "command_log_max_bytes": logBytes,
	})
	// The attacked sandbox goes, however it fared; deleteSandbox checks
	// that its directory and QEMU are gone.
	s.deleteSandbox(t, s.key, sb.ID)
}

// waitState polls sandbox id until its state is one of want, for at most
// d, and returns it as last seen.
func (s *server) waitState(t *testing.T, id string, d time.Duration, want ...string) apiv1.Sandbox {
	t.Helper()
	var sb apiv1.Sandbox
	for deadline := time.Now().Add(d); ; {
		sb = s.state(t, id)
		for _, w := range want {
			if sb.State == w {
				return sb
			}
		}
		if time.Now().After(deadline) {
			return sb
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cutShort posts a lifecycle request to path and, while its operation
// runs, asks hit every millisecond for a process to kill; the first one it
// names is killed with SIGKILL. It returns the finished operation and
// whether the kill was sent before the operation was seen to finish.
func (s *server) cutShort(t *testing.T, path string, hit func() int) (apiv1.Operation, bool) {
	t.Helper()
	var res apiv1.SandboxOperation
	s.must(t, 202, "POST", path, s.key, nil, &res)
	type result struct {
		op  apiv1.Operation
		err error
	}
	done := make(chan result, 1)
	go func() {
		op, err := s.tryWait(res.Operation)
		done <- result{op, err}
	}()
	killed := false
	for {
		select {
		case r := <-done:
			if r.err != nil {
				t.Fatal(r.err)
			}
			return r.op, killed
		default:
		}
		if !killed {
			if pid := hit(); pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL)
				killed = true
				continue
			}
		}
		time.Sleep(time.Millisecond)
	}
}

// savingState reports whether a suspend is writing the saved state of the
// sandbox in dir: its temporary file exists.
func savingState(dir string) bool {
	m, _ := filepath.Glob(filepath.Join(dir, "."+sandbox.StateName+".tmp-*"))
	return len(m) > 0
}

// TestReliabilityKillQEMU kills a sandbox's QEMU with SIGKILL in the
// middle of an exec, of a suspend (while the saved state is written) and
// of a wake (once the new QEMU runs), under a running server. Each
// sandbox must end in a state its files agree with: failed with the
// reason and no saved state, or suspended with its saved state and no
// QEMU (then it wakes); it must then delete cleanly, and at the end the
// server must hold no more than before.
//
// TestAPIVMDies kills QEMU under a command session; this one cuts an exec
// call, whose answer must come and say why.
func TestReliabilityKillQEMU(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	base := s.baseline(t)
	made := 1
	t.Run("mid-exec", func(t *testing.T) {
		made++
		sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny"})
		pid := qemuPID(t, s, sb.ID)
		type answer struct {
			status int
			body   []byte
			err    error
		}
		done := make(chan answer, 1)
		go func() {
			status, b, err := s.try("POST", "/v1/sandboxes/"+sb.ID+"/exec", apiv1.CommandRequest{Cmd: "touch /tmp/started; sleep 600"}, 2*time.Minute)
			done <- answer{status, b, err}
		}()
		waitFor(t, func() bool {
			status, _, _ := s.try("GET", "/v1/sandboxes/"+sb.ID+"/fs/stat?path=/tmp/started", nil, 10*time.Second)
			return status == 200
		})
		syscall.Kill(pid, syscall.SIGKILL)
		var a answer
		select {
		case a = <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("the exec did not answer within 30 s of its VM's death")
		}
		var e apiv1.ErrorBody
		json.Unmarshal(a.body, &e)
		if a.err != nil || a.status < 500 || !strings.Contains(e.Error.Message, "exited") {
			t.Errorf("the exec whose VM died answered %d %s (%v), want a 5xx saying the VM exited", a.status, a.body, a.err)
		}
		got := s.waitState(t, sb.ID, 30*time.Second, apiv1.StateFailed)
		if got.State != apiv1.StateFailed || got.LastError == nil || !strings.Contains(got.LastError.Message, "exited") {
			t.Errorf("after its VM was killed mid-exec: %s %+v", got.State, got.LastError)
		}
		s.conflict(t, "POST", "/v1/sandboxes/"+sb.ID+"/exec", "failed", apiv1.CommandRequest{Cmd: "true"})
		if testenv.ProcessAlive(pid) {
			t.Errorf("QEMU %d survived SIGKILL", pid)
		}
		s.deleteSandbox(t, s.key, sb.ID)
	})

	// A suspend first has the guest write out its dirty data, then saves
	// the VM's state: QEMU is killed in each phase. 64 MiB written just
	// before make the first phase last.
	t.Run("mid-suspend/sync", func(t *testing.T) {
		made += s.killMidSuspend(t, "dd if=/dev/zero of=/root/dirty bs=1M count=64", func(dir string, since time.Duration) bool {
			return since > 50*time.Millisecond && !savingState(dir)
		})
	})
	t.Run("mid-suspend/save", func(t *testing.T) {
		made += s.killMidSuspend(t, "true", func(dir string, _ time.Duration) bool { return savingState(dir) })
	})

	t.Run("mid-wake", func(t *testing.T) {
		id, op, n := s.cutThrice(t, "wake", func() (string, apiv1.Operation, bool) {
			sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny"})
			dir := datadir.Dir{Root: s.home}.Sandbox(sb.ID)
			s.must(t, 204, "PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/root/kept.txt", s.key, "kept", nil)
			old := qemuPID(t, s, sb.ID)
			s.lifecycle(t, sb.ID, "suspend")
			op, hit := s.cutShort(t, "/v1/sandboxes/"+sb.ID+"/wake", func() int {
				if pid, err := vm.RunningPID(dir); err == nil && pid != old {
					return pid
				}
				return 0
			})
			return sb.ID, op, hit
		})
		made += n
		got := s.waitState(t, id, 30*time.Second, apiv1.StateSuspended, apiv1.StateFailed)
		if s.checkCut(t, id, op, got) == apiv1.StateSuspended {
			// What was written before the suspend is still there.
			if out, err := s.execOK(id, "cat /root/kept.txt", time.Minute); err != nil || out != "kept" {
				t.Errorf("the file written before the suspend, after the second wake: %q %v", out, err)
			}
		}
		s.deleteSandbox(t, s.key, id)
	})
	s.checkNoLeaks(t, base, made)
}

// cutThrice runs try, which makes a sandbox and cuts one of its lifecycle
// calls (what) short with cutShort, until a try hits: a call that finished
// before it could be cut is tried again with a new sandbox (the old one
// deleted), up to three times. It returns the sandbox and operation that
// were cut, and how many sandboxes it made.
func (s *server) cutThrice(t *testing.T, what string, try func() (string, apiv1.Operation, bool)) (string, apiv1.Operation, int) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		id, op, hit := try()
		if hit {
			return id, op, attempt
		}
		if attempt == 3 {
			t.Fatalf("three %ss finished before they could be cut", what)
		}
		t.Logf("attempt %d: the %s finished before it could be cut", attempt, what)
		s.deleteSandbox(t, s.key, id)
	}
}

// killMidSuspend suspends a sandbox after running prep in it and kills its
// QEMU once cut says the suspend is where it should be cut (given the
// sandbox's directory and the time since the suspend was asked for), then
// checks the sandbox against its files and deletes it, trying again as
// cutThrice does. It returns how many sandboxes it made.
func (s *server) killMidSuspend(t *testing.T, prep string, cut func(dir string, since time.Duration) bool) int {
	t.Helper()
	id, op, n := s.cutThrice(t, "suspend", func() (string, apiv1.Operation, bool) {
		sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny"})
		dir := datadir.Dir{Root: s.home}.Sandbox(sb.ID)
		if _, err := s.execOK(sb.ID, prep, time.Minute); err != nil {
			t.Fatal(err)
		}
		pid := qemuPID(t, s, sb.ID)
		var start time.Time
		op, hit := s.cutShort(t, "/v1/sandboxes/"+sb.ID+"/suspend", func() int {
			if start.IsZero() {
				start = time.Now()
			}
			if cut(dir, time.Since(start)) {
				return pid
			}
			return 0
		})
		return sb.ID, op, hit
	})
	got := s.waitState(t, id, 30*time.Second, apiv1.StateSuspended, apiv1.StateFailed)
	s.checkCut(t, id, op, got)
	s.deleteSandbox(t, s.key, id)
	return n
}

// checkCut checks a sandbox whose QEMU was killed during op against its
// files: failed with a reason and no saved state, or suspended with its
// saved state and no QEMU, in which case it is woken and must run. It
// returns the state found. A sandbox's directory must hold no temporary
// state file either way.
func (s *server) checkCut(t *testing.T, id string, op apiv1.Operation, got apiv1.Sandbox) string {
	t.Helper()
	dir := datadir.Dir{Root: s.home}.Sandbox(id)
	saved := sandbox.SuspendedState(dir)
	_, vmErr := vm.RunningPID(dir)
	t.Logf("QEMU killed during %s: operation %s (%+v), sandbox %s (%+v), saved state %v", op.Kind, op.Status, op.Error, got.State, got.LastError, saved)
	report(t, map[string]any{"test": "kill_qemu", "during": op.Kind, "operation": op.Status, "state": got.State, "saved_state": saved})
	if savingState(dir) {
		t.Errorf("a temporary state file is left in %s", dir)
	}
	if vmErr == nil {
		t.Errorf("a QEMU runs for %s after its QEMU was killed", id)
	}
	switch got.State {
	case apiv1.StateFailed:
		if got.LastError == nil || got.LastError.Message == "" {
			t.Errorf("failed without a reason")
		}
		if saved {
			t.Errorf("failed, yet its saved state is there")
		}
		// A wake may have finished just before the kill: the VM then
		// died running, which fails the sandbox all the same.
		diedAfterWake := op.Kind == apiv1.OpWake && op.Status == apiv1.OpSucceeded
		if !diedAfterWake && (op.Status != apiv1.OpFailed || op.Error == nil) {
			t.Errorf("the sandbox failed but its %s operation is %s (%+v)", op.Kind, op.Status, op.Error)
		}
	case apiv1.StateSuspended:
		if !saved {
			t.Errorf("suspended without a saved state")
		}
		if op.Kind == apiv1.OpSuspend && op.Status != apiv1.OpSucceeded {
			t.Errorf("suspended, but its suspend is %s (%+v)", op.Status, op.Error)
		}
		if op.Kind == apiv1.OpWake && (op.Status != apiv1.OpFailed || op.Error == nil) {
			t.Errorf("suspended again, but its wake is %s (%+v)", op.Status, op.Error)
		}
		s.lifecycle(t, id, "wake")
		if out, err := s.execOK(id, "echo up", time.Minute); err != nil || out != "up\n" {
			t.Errorf("exec after the wake: %q %v", out, err)
		}
	default:
		t.Errorf("the sandbox is %s (%+v), which its files cannot tell", got.State, got.LastError)
	}
	return got.State
}

// TestReliabilityKillServer kills the server with SIGKILL while a create,
// a suspend (its state being written) and a delete are in flight, and
// restarts it on the same data directory. Every sandbox must end in a
// state its files agree with: the untouched one runs on (adopted); the
// one being deleted is deleted and its directory gone; the one being
// suspended is suspended with its saved state, or still has its VM, and
// either way wakes with its files, without a temporary state file left;
// the one being created runs (its create finished) or failed with the
// reason and left nothing. Then all are deleted and the server must hold
// no more than before the crash.
//
// TestAPIServerRestart already cuts a create short while it builds the
// template's snapshot; here the snapshot exists and the create is cut while
// it clones.
func TestReliabilityKillServer(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	base := s.baseline(t)
	dir := datadir.Dir{Root: s.home}
	keep := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny"})
	susp := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny"})
	del := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny"})
	for _, sb := range []apiv1.Sandbox{keep, susp} {
		s.must(t, 204, "PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/root/kept.txt", s.key, "kept "+sb.ID, nil)
	}
	delPID := qemuPID(t, s, del.ID)

	var cr, su, de apiv1.SandboxOperation
	s.must(t, 202, "POST", "/v1/sandboxes", s.key, apiv1.CreateSandbox{Template: "tiny"}, &cr)
	t.Cleanup(func() { s.deleteSandbox(t, s.key, cr.Sandbox.ID) })
	s.must(t, 202, "POST", "/v1/sandboxes/"+susp.ID+"/suspend", s.key, nil, &su)
	saving := false
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !saving; {
		if saving = savingState(dir.Sandbox(susp.ID)); !saving {
			time.Sleep(time.Millisecond)
		}
	}
	s.must(t, 202, "DELETE", "/v1/sandboxes/"+del.ID, s.key, nil, &de)
	s.stop(syscall.SIGKILL)
	// What the crash left, before the next start looks at it.
	crashed := map[string]any{"test": "kill_server", "suspend_was_saving": saving,
		"create_had_vm":   fileExists(filepath.Join(dir.Sandbox(cr.Sandbox.ID), "qemu.pid")),
		"delete_dir_left": fileExists(dir.Sandbox(del.ID)), "delete_vm_alive": testenv.ProcessAlive(delPID),
		"suspend_state_saved": sandbox.SuspendedState(dir.Sandbox(susp.ID))}
	if err := s.start(); err != nil {
		t.Fatalf("restart after SIGKILL: %v", err)
	}

	t.Run("untouched", func(t *testing.T) {
		if got := s.state(t, keep.ID); got.State != apiv1.StateRunning {
			t.Errorf("the untouched sandbox is %s (%+v)", got.State, got.LastError)
		}
		if out, err := s.execOK(keep.ID, "cat /root/kept.txt", time.Minute); err != nil || out != "kept "+keep.ID {
			t.Errorf("the untouched sandbox after the crash: %q %v", out, err)
		}
	})
	t.Run("delete", func(t *testing.T) {
		op := s.waitOp(t, s.key, de.Operation.ID)
		got := s.state(t, del.ID)
		if op.Status != apiv1.OpSucceeded || got.State != apiv1.StateDeleted {
			t.Errorf("the delete cut short: operation %s (%+v), sandbox %s (%+v)", op.Status, op.Error, got.State, got.LastError)
		}
		checkGone(t, dir.Sandbox(del.ID), delPID)
	})
	t.Run("suspend", func(t *testing.T) {
		op := s.waitOp(t, s.key, su.Operation.ID)
		got := s.state(t, susp.ID)
		d := dir.Sandbox(susp.ID)
		saved := sandbox.SuspendedState(d)
		_, vmErr := vm.RunningPID(d)
		crashed["suspend_operation"], crashed["suspend_state_after"] = op.Status, got.State
		t.Logf("the suspend cut short: operation %s (%+v), sandbox %s (%+v), saved state %v, VM running %v",
			op.Status, op.Error, got.State, got.LastError, saved, vmErr == nil)
		if savingState(d) {
			m, _ := filepath.Glob(filepath.Join(d, "."+sandbox.StateName+".tmp-*"))
			t.Errorf("a temporary state file is left after the restart: %v", m)
		}
		switch got.State {
		case apiv1.StateSuspended:
			if !saved || vmErr == nil || op.Status != apiv1.OpSucceeded {
				t.Errorf("suspended with saved state %v, VM running %v, operation %s", saved, vmErr == nil, op.Status)
			}
		case apiv1.StatePaused, apiv1.StateRunning:
			if saved || vmErr != nil || op.Status != apiv1.OpFailed {
				t.Errorf("%s with saved state %v, VM running %v, operation %s", got.State, saved, vmErr == nil, op.Status)
			}
		default:
			t.Fatalf("the sandbox whose suspend was cut short is %s (%+v)", got.State, got.LastError)
		}
		if got.State != apiv1.StateRunning {
			s.lifecycle(t, susp.ID, "wake")
		}
		if out, err := s.execOK(susp.ID, "cat /root/kept.txt", 30*time.Second); err != nil || out != "kept "+susp.ID {
			t.Errorf("the sandbox whose suspend was cut short, after its wake: %q %v", out, err)
		}
	})
	t.Run("create", func(t *testing.T) {
		createOp := s.waitOp(t, s.key, cr.Operation.ID)
		got := s.state(t, cr.Sandbox.ID)
		crashed["create_operation"] = createOp.Status
		switch {
		case createOp.Status == apiv1.OpSucceeded:
			if got.State != apiv1.StateRunning {
				t.Errorf("its create succeeded, yet the sandbox is %s (%+v)", got.State, got.LastError)
			}
			if _, err := s.execOK(cr.Sandbox.ID, "true", time.Minute); err != nil {
				t.Error(err)
			}
		case createOp.Error == nil || !strings.Contains(createOp.Error.Message, "restarted"):
			t.Errorf("the create cut short failed without saying why: %+v", createOp.Error)
		case got.State != apiv1.StateFailed:
			t.Errorf("its create failed, yet the sandbox is %s", got.State)
		default:
			if fileExists(dir.Sandbox(cr.Sandbox.ID)) {
				t.Errorf("the failed create left its directory")
			}
			if q := qemusIn(dir.Sandbox(cr.Sandbox.ID)); len(q) > 0 {
				t.Errorf("the failed create left its QEMU: %v", q)
			}
		}
	})
	report(t, crashed)
	for _, id := range []string{keep.ID, susp.ID, cr.Sandbox.ID} {
		s.deleteSandbox(t, s.key, id)
	}
	t.Run("events", func(t *testing.T) {
		checkEventsAcrossCrash(t, s, keep.ID, susp.ID, del.ID, cr.Sandbox.ID)
	})
	s.checkNoLeaks(t, base, 5)
}

// checkEventsAcrossCrash reads every event of the sandboxes of a server
// that was killed and restarted: they are in seq order, none twice, and
// each sandbox's tell its history, from sandbox.created to
// sandbox.deleted, the changes before the crash kept.
func checkEventsAcrossCrash(t *testing.T, s *server, keep, susp, del, cr string) {
	var evs apiv1.Events
	s.must(t, 200, "GET", "/v1/events?limit=1000", s.key, nil, &evs)
	of := map[string][]string{}
	seen := map[string]bool{}
	var last int64
	for _, ev := range evs.Items {
		if ev.Seq <= last || seen[ev.ID] {
			t.Fatalf("event %+v after seq %d, or twice", ev, last)
		}
		last, seen[ev.ID] = ev.Seq, true
		of[ev.SandboxID] = append(of[ev.SandboxID], ev.Type)
	}
	want := "sandbox.created sandbox.running sandbox.deleted"
	for _, id := range []string{keep, del} {
		if got := strings.Join(of[id], " "); got != want {
			t.Errorf("sandbox %s's events: %s; want %s", id, got, want)
		}
	}
	for _, id := range []string{susp, cr} {
		got := of[id]
		if len(got) < 3 || got[0] != apiv1.EventSandboxCreated || got[len(got)-1] != apiv1.EventSandboxDeleted {
			t.Errorf("sandbox %s's events: %v; want sandbox.created first and sandbox.deleted last", id, got)
		}
	}
	if got := strings.Join(of[susp], " "); strings.Contains(got, apiv1.EventSandboxSuspended) && !strings.Contains(got, apiv1.EventSandboxWoken) {
		t.Errorf("the sandbox suspended and woken: %s", got)
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
